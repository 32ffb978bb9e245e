"""Command line: ``specvis generate | sample | bench | models``. Bad input exits 2 with one line, no traceback.

Each command lives in ``specvis.commands`` (it builds one ``Job`` from its flags); here the parser,
the checks every command shares, and the one-line errors."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .interrupt import during_import

_restore_hook = during_import()  # the command line's own imports (demo, registry, torch): Ctrl+C is one line

from . import __version__, demo  # noqa: E402
from .checks import one_line  # noqa: E402
from .commands.bench import cmd_bench  # noqa: E402
from .commands.flags import (DEFAULT_METHODS, MAX_IMAGES, add_device, add_method_options, add_progress,  # noqa: E402
                             add_sampling, default_method_spec, method_of, read_prompts)
from .commands.generate import cmd_generate  # noqa: E402
from .commands.sample import cmd_sample  # noqa: E402
from .registry import METHODS, available  # noqa: E402
from .serve import cli as serve_cli  # noqa: E402


_restore_hook()

__all__ = ["DEFAULT_METHODS", "build_parser", "default_method_spec", "main", "read_prompts"]

_method = method_of  # the method of a command's flags (tests build methods from parsed flags)


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise UsageError(message)


def _add_sample_parser(sub, model_help: str, method_help: str) -> None:
    s = sub.add_parser("sample", help="generate many images, one process or torchrun --nproc_per_node N -m specvis.cli "
                                      "-- sample ...: PNGs, samples.npz for FID evaluators, stats.json")
    s.add_argument("--model", default="emoji", help=model_help)
    s.add_argument("--method", help=method_help)
    s.add_argument("--class", "--classes", dest="classes", type=int, nargs="+", action="extend",
                   help="class ids; image i gets class i mod their number (default: every class)")
    s.add_argument("--prompts", help="text-to-image checkpoints: a file with one prompt a line (image i gets line i mod n)")
    s.add_argument("--height", type=int, help="image height in tokens (text-to-image checkpoints; default native)")
    s.add_argument("--width", type=int, help="image width in tokens (default native)")
    s.add_argument("-n", "--num", type=int, required=True,
                   help="number of images in all, over every rank (under torchrun write -n, or put -- before "
                        "sample: torchrun takes --num for its --numa-binding)")
    s.add_argument("--batch-size", type=int, default=8, help="images per batch (default 8); the images depend on it, "
                                                             "not on the number of ranks")
    s.add_argument("--seed", type=int, default=0, help="batch j runs with seed + j (default 0)")
    s.add_argument("--out", default="samples", help="output directory: images/NNNNNN.png, samples.npz, stats.json; "
                                                    "rerunning into it skips the images already there")
    add_progress(s)
    add_device(s)
    add_sampling(s)
    add_method_options(s)


def _add_generate_parser(sub, model_help: str, method_help: str) -> None:
    g = sub.add_parser("generate", help="generate images with one method")
    g.add_argument("--model", default="emoji", help=model_help)
    g.add_argument("--method", help=method_help)
    g.add_argument("--class", dest="classes", type=int, nargs="+", action="extend", help="class ids (class-conditional models)")
    g.add_argument("--prompt", dest="prompts", action="append", help="text prompt (text-to-image checkpoints); repeat for more")
    g.add_argument("--negative-prompt", dest="negative_prompts", action="append",
                   help="negative prompt for CFG, one per --prompt or one for all (default: the family's own)")
    g.add_argument("--no-positive-suffix", dest="positive_suffix", action="store_false",
                   help="send the prompt text as given, without the family's official positive suffix "
                        "(Emu3: ' masterpiece, film grained, best quality.')")
    g.add_argument("--height", type=int, help="image height in tokens (text-to-image checkpoints; default native)")
    g.add_argument("--width", type=int, help="image width in tokens (default native)")
    g.add_argument("--num", type=int, help="number of images (default: one per --class, else 8)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the batch (default 0)")
    g.add_argument("--batch-size", type=int, help="decode at most this many images at once, a finished image's row "
                                                  "taking the next (continuous batching; methods ar, zipar, pjd); "
                                                  "default: all at once")
    g.add_argument("--out", default="out", help="output directory")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="print the memory plan (weights, KV cache, what is free, the largest batch) before generating")
    g.add_argument("--compare-ar", action="store_true",
                   help="also run plain AR on the same conditions and seed (after an untimed one-image warm-up "
                        "of each) and print the wall-clock speedup; only the method's images are written")
    add_progress(g)
    add_device(g)
    add_sampling(g)
    add_method_options(g)


def _add_bench_parser(sub, model_help: str) -> None:
    b = sub.add_parser("bench", help="benchmark methods against AR (report fields: docs/design/api.md)")
    b.add_argument("--model", default="emoji", help=model_help)
    b.add_argument("--methods", default="ar,speculative",
                   help="comma-separated method specs, options as name:key=value, e.g. sjd:window=8 "
                        "(a tuple option's items split by '/': adt:depth_range=2/8, static-tree:tree=0/1/0.0)")
    b.add_argument("--prompts", help="text-to-image checkpoints: a file with one prompt a line (image i gets line i mod n)")
    b.add_argument("--height", type=int, help="image height in tokens (text-to-image checkpoints; default native)")
    b.add_argument("--width", type=int, help="image width in tokens (default native)")
    b.add_argument("--num", type=int, default=16, help="number of images per method (default 16)")
    b.add_argument("--batch-size", type=int, default=1, help="images per batch (default 1)")
    b.add_argument("--seed", type=int, default=0, help="batch j runs with seed + j (default 0)")
    b.add_argument("--repeats", type=int, default=1, help="timed passes per method, interleaved batch by batch "
                                                          "(batch 1 of every method, then batch 2, ...); the median "
                                                          "wall-clock is reported (default 1)")
    b.add_argument("--warmup", default="batch", help="untimed warm-up before each method: batch (the first batch), row "
                                                     "(its first sample: same code paths, less time) or none")
    b.add_argument("--json", help="write the report JSON here (after every round of passes); rerunning resumes from it")
    b.add_argument("--md", help="write a markdown table here")
    b.add_argument("--plots", help="write speedup, step-compression and acceptance-heatmap PNGs to this directory")
    b.add_argument("--metrics", help="quality metrics, comma-separated: proxy (default when the model ships a "
                                     "classifier), fid, clip (torchmetrics, weights already on disk), none")
    b.add_argument("--data", default="data/emoji", help="dataset directory with eval.npz (reference images for fid)")
    b.add_argument("--shards", type=int, default=1, help="split the batches into this many shards (batch j goes to "
                                                          "shard j mod shards: the split of specvis sample's ranks)")
    b.add_argument("--shard-index", type=int, default=0, help="which shard to run (0-based)")
    b.add_argument("--merge", nargs="+", metavar="JSON", help="merge shard reports into --json instead of running")
    b.add_argument("--continuous", action="store_true",
                   help="run all images in one call through --batch-size rows, a finished image's row taking the "
                        "next (continuous batching; methods ar, jacobi, sjd, zipar, pjd)")
    b.add_argument("--no-cost-curve", action="store_true",
                   help="skip measuring the forward cost curve (target, draft, drafter by block size) that "
                        "predicted_speedup and efficiency come from")
    add_progress(b)
    add_device(b)
    add_sampling(b)
    b.add_argument("--accept", default=None, help="acceptance rule of the methods that take one and whose spec "
                                                   "names none (accept=...; default coupled under keyed noise, exact under stream)")


def build_parser() -> Parser:
    p = Parser(prog="specvis", description="Speculative decoding for autoregressive image generators.")
    p.add_argument("--version", action="version", version=f"specvis {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    model_help = "bundle name (specvis models), checkpoint directory or Hugging Face Hub id (default emoji)"
    method_help = (f"one of {', '.join(METHODS)}, or a bench spec such as speculative:gamma=4 (name:key=value:..., "
                   "the keys of the method flags below by their field names) (default: the best lossless method for the model, "
                   f"{DEFAULT_METHODS['discrete']} for discrete-token models, ar for continuous ones; "
                   "--method ar for plain AR)")
    _add_generate_parser(sub, model_help, method_help)
    _add_bench_parser(sub, model_help)
    _add_sample_parser(sub, model_help, method_help)

    sub.add_parser("models", help="list model bundles")
    sub.add_parser("train-drafter", help="train an EAGLE draft head on a target (see --help)", add_help=False)
    demo.add_parser(sub)
    serve_cli.add_parser(sub)
    return p


def cmd_models(a: argparse.Namespace) -> int:
    from .zoo import BUNDLES, installed

    for name, (desc, _) in BUNDLES.items():
        print(f"{name:22s} {'installed' if installed(name) else 'not installed':14s} {desc}")
    print(f"methods: {', '.join(available(METHODS))}")
    return 0


# flags a command hands to the pipeline as they are: it checks them, once (``commands.flags.named_by_flags``
# names the flag in its error)
PIPELINE_ARGUMENTS = {"generate": ("seed", "batch_size")}


def check_common(a: argparse.Namespace) -> None:
    """Flags several commands share, checked before anything loads: ``--device`` (a device this machine
    has), ``--seed`` (0 .. 2**64 - 1) and the counts."""
    from . import checks

    if getattr(a, "device", None) is not None:
        checks.device(a.device, "--device")
    handed = PIPELINE_ARGUMENTS.get(a.command, ())
    if getattr(a, "seed", None) is not None and "seed" not in handed:
        checks.seed(a.seed, "--seed")
    for flag, high in (("num", MAX_IMAGES), ("batch_size", MAX_IMAGES), ("repeats", 1000), ("shards", MAX_IMAGES)):
        value = None if flag in handed else getattr(a, flag, None)
        if value is not None:
            checks.integer(value, f"--{flag.replace('_', '-')}", low=1, high=high)
    for flag in ("height", "width"):
        value = getattr(a, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be an integer >= 1 (image tokens), got {value}")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch failing to allocate (CPU: "can't allocate memory"; CUDA: OutOfMemoryError)."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


OUTPUT_FLAGS = (("out", "--out"), ("json", "--json"), ("md", "--md"), ("plots", "--plots"))


def output_flag(exc: OSError, a: argparse.Namespace | None) -> str:
    """``"--out DIR: "`` when ``exc`` concerns a path under one of the command's output flags, else ""."""
    name = exc.filename
    if a is None or not name:
        return ""
    path = Path(name).absolute()
    for dest, flag in OUTPUT_FLAGS:
        value = vars(a).get(dest)
        if isinstance(value, str) and value.strip():
            given = Path(value).absolute()
            if path == given or given in path.parents:
                return f"{flag} {value}: "
    return ""


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, like the CLI's errors (not the file and source line of where it was raised)."""
    print(f"specvis: warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = None
    if argv[:1] == ["train-drafter"]:  # its own flags: python -m specvis.train.train_drafter
        from .train.train_drafter import main as train_drafter

        return train_drafter(argv[1:])
    try:
        a = build_parser().parse_args(argv)
        check_common(a)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return {"generate": cmd_generate, "sample": cmd_sample, "bench": cmd_bench, "models": cmd_models,
                    "demo": demo.main, "serve": serve_cli.main}[a.command](a)
    except (UsageError, ValueError) as e:
        print(f"specvis: error: {one_line(e, limit=None)}", file=sys.stderr)
        return 2
    except OSError as e:  # FileNotFoundError, PermissionError, disk full ...: named by the flag whose path it is
        print(f"specvis: error: {output_flag(e, a)}{one_line(e, limit=None)}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # an allocation the machine cannot make: one line, not torch's traceback
        if not out_of_memory(e):
            raise
        print(f"specvis: error: out of memory ({one_line(e)[:160]}); lower --num or --batch-size", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specvis: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
