"""Command line: ``specvis generate | sample | bench | models``. Bad input exits 2 with one line, no traceback."""

from __future__ import annotations

import argparse
import json
import sys
import typing
import warnings
from pathlib import Path

from .interrupt import during_import

_restore_hook = during_import()  # the command line's own imports (demo, registry, torch): Ctrl+C is one line

from . import __version__, demo  # noqa: E402
from .checks import one_line  # noqa: E402
from .io import atomic_write, clean_stale_temps, write_text  # noqa: E402
from .progress import wanted  # noqa: E402
from .serve import cli as serve_cli  # noqa: E402
from .registry import (ACCEPT, ACCEPTANCE, METHODS, available, build_method, describe, method_flags,  # noqa: E402
                       method_from_spec, parse_method_spec)
from .sampling import Sampling  # noqa: E402


_restore_hook()


class UsageError(Exception):
    pass


# ``--method``'s default (generate, sample): the best lossless method for the model, as a bench spec.
# One line per model; "discrete" is every other discrete-token model (vertical-sample needs only
# the token grid, which every discrete layout has), "continuous" the continuous-token ones: they keep
# plain AR, their default so far (cspd with the paper ratio is not exact).
DEFAULT_METHODS = {
    "emoji": "sjd:window=16:init=vertical-sample:coupling=gumbel",  # fastest lossless at batch 1: successors.md
    "discrete": "sjd:window=16:init=vertical-sample:coupling=gumbel",
    "continuous": "ar",
}


def default_method_spec(pipe=None) -> str:
    """The spec of ``DEFAULT_METHODS`` for ``pipe`` (None: the discrete-model default), by the tokens
    it declares (``Pipeline.tokens``)."""
    if pipe is None:
        return DEFAULT_METHODS["discrete"]
    if pipe.tokens == "continuous":
        return DEFAULT_METHODS["continuous"]
    return DEFAULT_METHODS.get(pipe.name, DEFAULT_METHODS["discrete"])


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise UsageError(message)


def _add_progress(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", action="store_true",
                   help="show the progress bar (images done, tokens/s, ETA) on stderr even when it is not a terminal")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_device(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    g.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="weights and KV cache (default: the model's, fp32); on a CPU with bf16 dot products "
                        "(AVX512-BF16, AMX) bf16 flattens the forward cost curve: docs/results/archive/bf16-cpu.md")
    g.add_argument("--quantize", choices=["int8"],
                   help="weight-only int8 linear layers in the target's and draft's blocks (half the memory of bf16; "
                        "methods stay exact for the quantized model): docs/results/scale-cpu.md")
    g.add_argument("--compile", action="store_true", help="torch.compile the cached forward (one graph per block size); CUDA only: on CPU it measured slower and is skipped")
    g.add_argument("--no-graphs", dest="graphs", action="store_false", default=None,
                   help="run rounds eagerly on CUDA (default: captured CUDA graphs; no effect on CPU)")
    p.add_argument("--draft", help="checkpoint directory or Hub id of a smaller model of the same family (speculative)")
    p.add_argument("--drafter", help="EAGLE head directory trained for the checkpoint (eagle, adt, static-tree; "
                                     "specvis train-drafter --model ... --out DIR)")


def _load(a: argparse.Namespace):
    from .checks import model_name
    from .zoo import load

    model_name(a.model, "--model")

    num_iter = getattr(a, "num_iter", None)
    if num_iter is not None and num_iter < 1:
        raise ValueError(f"--num-iter must be >= 1, got {num_iter}")
    pipe = load(a.model, a.device, a.dtype, a.compile, a.graphs, draft=a.draft, drafter=a.drafter,
                **({"quantize": a.quantize} if a.quantize else {}))
    if num_iter is not None:
        if pipe.num_iter is None:  # declared by the pipelines of ordered models (MAR)
            raise ValueError(f"--num-iter applies to MAR models only; model {a.model} decodes one token per step")
        pipe.num_iter = num_iter
    return pipe


def _device_line(pipe) -> str:
    graphs = pipe.device.type == "cuda" if pipe.graphs is None else pipe.graphs
    why = (pipe.extras or {}).get("dtype_source")
    quant = (pipe.extras or {}).get("quantize")
    return (f"{pipe.device} | {str(pipe.dtype).removeprefix('torch.')}{f' ({why})' if why else ''}"
            f"{f' | {quant} weights' if quant else ''}"
            f" | captured rounds {'on' if graphs and pipe.device.type == 'cuda' else 'off'}"
            f" | compile {'on' if pipe.compiled else 'off'}")


def _plan_memory(pipe, batch_size: int, methods, sampling, verbose: bool = False, refill: bool = False) -> None:
    """Before any forward: each method's memory plan at ``batch_size`` (``Pipeline.memory``; text
    prompts planned at ``specvis.memory.DEFAULT_PROMPT_TOKENS``, the call re-plans with its own);
    printed with ``-v``; a plan that does not fit is the one-line error. Pipelines without a KV cache
    (``Pipeline.kv_cache``: MAR) are not planned."""
    if not pipe.kv_cache:
        return
    for method in methods:
        plan = pipe.memory(batch_size, method, sampling, refill=refill)
        if verbose:
            print(f"  {plan.describe()}")
        if not plan.fits:
            from .memory import MemoryPlanError

            raise MemoryPlanError(plan.line())


def _add_sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (defaults: the model's)")
    g.add_argument("--temperature", type=float, help="softmax temperature; 0 = greedy")
    g.add_argument("--top-k", type=int, help="keep the k most likely image tokens (0 = no top-k)")
    g.add_argument("--top-p", type=float, help="nucleus: keep the smallest set of mass >= p (1 = off)")
    g.add_argument("--cfg-scale", type=float, help="classifier-free guidance scale (1 = no guidance)")
    g.add_argument("--noise", help="keyed (image i's picture is a function of its seed, seed + i: every lossless "
                                   "method gives AR's image; the default for discrete-token models) or stream "
                                   "(draws from the call's seeded stream; continuous-token and MAR models)")
    g.add_argument("--num-iter", type=int, help="MAR models: sampler steps over the random order (default: the model's, 64)")


def _metavar(tp) -> str:
    """``INT``, ``FLOAT``, ``NAME``, ``LIST`` (a tuple's items split by '/' or ','), joined by '|' for a union."""
    from .options import NoneType, members

    words = {int: "INT", float: "FLOAT", str: "NAME", bool: "BOOL"}
    word = lambda m: words.get(m, "LIST" if typing.get_origin(m) is tuple else "RULE")
    return "|".join(dict.fromkeys(word(m) for m in members(tp) if m is not NoneType))


def _flag_help(flag) -> str:
    """Each owner's help, allowed values and default (owners that say the same share one entry)."""
    from .options import spell

    parts: dict[str, list[str]] = {}
    for owner, info in flag.owners:
        if flag.key == ACCEPT:
            text = f"acceptance rule: {', '.join(ACCEPTANCE)} (default: coupled under keyed noise, exact under --noise stream)"
        else:
            allowed = "" if flag.boolean else f"{info.allowed()}; "
            text = f"{info.help} ({allowed}default {spell(info.default)})"
        parts.setdefault(text, []).append(owner)
    return "; ".join(f"{'/'.join(owners)}: {text}" for text, owners in parts.items())


def _add_method_options(p: argparse.ArgumentParser) -> None:
    """The method flags, generated from the declared options of every method and rule
    (``registry.method_flags``): each sets the field of its spec key; a flag set for a method that
    does not have it is an error (``_method``). Grouped under the method (or rule) that lists it first."""
    groups: dict[str, argparse._ArgumentGroup] = {}

    def group(flag):
        owner = flag.owners[0][0]
        if flag.key == ACCEPT:
            title = f"acceptance rule of {', '.join(o for o, _ in flag.owners)}"
        elif owner in ACCEPTANCE:
            title = f"rule {owner} (--accept {owner}; spec keys: the field names)"
        else:
            title = f"method {owner} (--method {owner}; spec keys: the field names, e.g. {owner}:key=value)"
        return groups.setdefault(title, p.add_argument_group(title))

    made = {}
    for flag in method_flags():
        g = group(flag)
        help_ = _flag_help(flag)
        if flag.boolean:
            on = flag.name.removeprefix("--no-")
            g.add_argument(flag.name, dest=flag.dest, action="store_const", const="false" if flag.name.startswith("--no-")
                           else "true", help=help_)
            if any(info.default is None for _, info in flag.owners):  # True, False or None: both spellings
                g.add_argument(f"--no-{on.removeprefix('--')}", dest=flag.dest, action="store_const", const="false",
                               help=f"{'/'.join(o for o, _ in flag.owners)}: {flag.key}=false")
        else:
            g.add_argument(flag.name, dest=flag.dest, metavar=_metavar(flag.owners[0][1].type), help=help_)
        made[flag.key] = flag
    p.set_defaults(method_flags=made)


def _method_name(a: argparse.Namespace, pipe=None) -> str:
    return parse_method_spec(a.method or default_method_spec(pipe))[0]


def _same_text(x: str, y: str) -> bool:
    return x.strip().lower() == y.strip().lower()


def _method(a: argparse.Namespace, pipe=None):
    """The method of ``--method`` (a name or a bench spec ``name:key=value:...``) with the method
    flags the user set (None = not set) on top; without ``--method``, the model's default
    (``default_method_spec(pipe)``) with those flags on top. A flag that contradicts a key of the
    user's spec is an error."""
    flags = a.method_flags  # spec key -> registry.Flag
    name, options = parse_method_spec(a.method or default_method_spec(pipe))
    given = set(options) if a.method else set()
    flagged = {key for key, f in flags.items() if getattr(a, f.dest) is not None}
    for key in flagged:
        value = getattr(a, flags[key].dest)
        if key in given and not _same_text(options[key], value):
            raise ValueError(f"{flags[key].name} {value} contradicts {key}={options[key]} in --method {a.method}")
        options[key] = value

    def spell(key: str) -> str | None:  # errors write an option as the user did: a spec key or a flag
        if key in given or (":" in (a.method or "") and key not in flagged):
            return key
        return flags[key].name if key in flags else None

    return build_method(name, options, spell=spell)


def _sampling(a: argparse.Namespace, pipe) -> Sampling:
    """The model's sampling with the flags given; ``--noise`` absent: the model's default (keyed for
    discrete-token models, ``pipeline.call_sampling``), recorded resolved."""
    from .pipeline import call_sampling

    default = pipe.default_sampling
    return call_sampling(pipe, Sampling(
        temperature=default.temperature if a.temperature is None else a.temperature,
        top_k=default.top_k if a.top_k is None else (a.top_k or None),
        top_p=default.top_p if a.top_p is None else a.top_p,
        cfg_scale=default.cfg_scale if a.cfg_scale is None else a.cfg_scale,
        noise=default.noise if a.noise is None else a.noise,
    ))


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
    _add_progress(s)
    _add_device(s)
    _add_sampling(s)
    _add_method_options(s)


def build_parser() -> Parser:
    p = Parser(prog="specvis", description="Speculative decoding for autoregressive image generators.")
    p.add_argument("--version", action="version", version=f"specvis {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    model_help = "bundle name (specvis models), checkpoint directory or Hugging Face Hub id (default emoji)"
    method_help = (f"one of {', '.join(METHODS)}, or a bench spec such as speculative:gamma=4 (name:key=value:..., "
                   "the keys of the method flags below by their field names) (default: the best lossless method for the model, "
                   f"{DEFAULT_METHODS['discrete']} for discrete-token models, ar for continuous ones; "
                   "--method ar for plain AR)")
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
    _add_progress(g)
    _add_device(g)
    _add_sampling(g)
    _add_method_options(g)

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
    _add_progress(b)
    _add_device(b)
    _add_sampling(b)
    b.add_argument("--accept", default=None, help="acceptance rule of the methods that take one and whose spec "
                                                   "names none (accept=...; default coupled under keyed noise, exact under stream)")

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


def _save_png(image, path: Path) -> None:
    atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


def _check_draft(pipe, names: list[str]) -> None:
    """Text-to-image checkpoints have no draft unless ``--draft`` gives one: say so before running."""
    if pipe.conditioning != "class" and pipe.draft is None and "speculative" in names:
        raise ValueError(f"method speculative needs a draft model: give --draft DIR (or a Hub id), a smaller "
                         f"checkpoint of the same family as {pipe.name} ({pipe.family.name})")


def _check_method_and_out(a: argparse.Namespace) -> None:
    """``--method ""`` is not the default method, ``--out`` a writable directory (not "": the current
    one): one line each, before the model loads."""
    from .io import check_output_dir

    if a.method is not None and not a.method.strip():
        raise ValueError(f"--method is empty: give one of {', '.join(METHODS)} or a spec, or leave it out for the model's default")
    check_output_dir(a.out, "--out")


def cmd_generate(a: argparse.Namespace) -> int:
    from .viz import contact_sheet, heatmap_sheet

    _check_method_and_out(a)
    if a.method:
        _method(a)  # bad flags fail before the model loads
    if a.num is not None and a.num < 1:
        raise ValueError(f"--num must be >= 1, got {a.num}")
    if a.batch_size is not None and a.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {a.batch_size}")
    from .checks import text

    for flag, given in (("--prompt", a.prompts), ("--negative-prompt", a.negative_prompts)):
        for i, p in enumerate(given or []):  # empty or not UTF-8: before the model loads
            text(p, f"{flag} {i + 1}" if len(given) > 1 else flag, allow_empty=flag != "--prompt")
    out_dir = Path(a.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir}: exists and is not a directory")
    if out_dir.is_dir():  # temporaries of a run killed while writing (io.atomic_write names)
        for p in clean_stale_temps(out_dir):
            print(f"specvis: cannot remove stale {p}", file=sys.stderr)
    loaded = _load(a)
    from .zoo import pipeline_for

    pipe = pipeline_for(loaded, [_method_name(a, loaded)])
    method = _method(a, pipe)  # without --method: the model's default (DEFAULT_METHODS)
    _check_draft(pipe, [method.name])
    sampling = _sampling(a, pipe)
    show = wanted(a.progress, a.quiet)  # a bar on stderr (specvis.progress)
    text = pipe.conditioning != "class"  # prompts (through the checkpoint's processor or text encoder)
    if text:
        if a.classes:
            raise ValueError(f"model {a.model} is text-to-image: give --prompt, not --class")
        if not a.prompts:
            raise ValueError(f"model {a.model} is text-to-image: give --prompt \"...\"")
        num = a.num or len(a.prompts)
        prompts = [a.prompts[i % len(a.prompts)] for i in range(num)]
        negative = a.negative_prompts
        if negative is not None:
            if len(negative) not in (1, len(a.prompts)):
                raise ValueError(f"--negative-prompt: give one, or one per --prompt ({len(a.prompts)}), got {len(negative)}")
            negative = [negative[i % len(negative)] for i in range(num)]

        def run(m, n: int = num):
            return pipe(prompts=prompts[:n], negative_prompts=None if negative is None else negative[:n], method=m,
                        sampling=sampling, seed=a.seed, height=a.height, width=a.width,
                        positive_suffix=a.positive_suffix, batch_size=a.batch_size, progress=show)
    else:
        if a.prompts or a.negative_prompts or a.height is not None or a.width is not None or not a.positive_suffix:
            raise ValueError(f"model {a.model} is class-conditional: --prompt/--negative-prompt/--height/--width/"
                             "--no-positive-suffix do not apply (give --class N)")
        bad = [c for c in a.classes or [] if not 0 <= c < pipe.num_classes]  # every class given, used or not
        if bad:
            raise ValueError(f"--class {bad[0]} is out of range; model {a.model} has classes 0..{pipe.num_classes - 1}")
        classes = a.classes or list(range(pipe.num_classes))
        num = a.num or (len(a.classes) if a.classes else 8)
        classes = [classes[i % len(classes)] for i in range(num)]

        def run(m, n: int = num):
            return pipe(classes[:n], m, sampling, seed=a.seed, batch_size=a.batch_size, progress=show)
    _plan_memory(pipe, min(num, a.batch_size or num), [method], sampling, verbose=a.verbose,
                 refill=a.batch_size is not None and a.batch_size < num)  # before any forward
    ar = None
    if a.compare_ar and method.name != "ar":
        from .methods.ar import AR

        for m in (method, AR()):
            run(m, 1)  # warm-up (one image), untimed: one-time costs fall on neither side
        ar = run(AR())
    out = run(method)
    if text:
        layout = pipe.target.layout  # the grid of the call
        conditions = {"prompts": prompts, "negative_prompts": negative, "height": layout.height, "width": layout.width,
                      "positive_suffix": pipe.with_positive_suffix([""], a.positive_suffix)[0],
                      **({"draft": pipe.extras["draft"]} if "draft" in pipe.extras else {})}
    else:
        conditions = {"classes": classes}
    s = out.stats
    compare = None
    if a.compare_ar:
        ar_out = ar or out
        ar = ar_out.stats
        compare = {"ar_wall_s": ar.wall_s, "ar_target_forwards": ar.target_forwards,
                   "speedup": ar.wall_s / s.wall_s if s.wall_s > 0 else float("nan")}
        if sampling.keyed:  # one picture per seed: the method's images are AR's, token for token
            same = [bool((x == y).all()) for x, y in zip(out.tokens, ar_out.tokens)]
            compare["images_equal_ar"] = sum(same)
    out_dir.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    for i, im in enumerate(out.images):
        _save_png(im, out_dir / f"{i:03d}.png")
    _save_png(contact_sheet(out.images), out_dir / "grid.png")
    _save_png(heatmap_sheet(s.accept_map, cell=max(out.images[0].width // pipe.target.layout.width, 1)),
              out_dir / "heatmap.png")
    # what ran: the method as clamped to the stream (generate.fit_to_stream); sv.Auto records its choice below
    ran = out.method if out.method is not None else method  # a MAR pipeline's generation names none
    name, config, rule = describe(method if out.calibration is not None else ran)
    stats = {"model": a.model, "method": name, "config": config, "acceptance": rule, "lossless": bool(method.lossless),
             "default_method": not a.method, **conditions, "seed": a.seed,
             **({"batch_size": a.batch_size} if a.batch_size is not None else {}),
             "sampling": vars(sampling) if hasattr(sampling, "__dict__") else {},
             **s.to_dict(), **({"compare_ar": compare} if compare else {}), "accept_map": s.accept_map.tolist()}
    if out.calibration is not None:  # sv.Auto: the method it ran, and why
        stats["chosen"] = dict(zip(("method", "config", "acceptance"), describe(out.method)),
                               why=out.calibration.explain())
    write_text(out_dir / "stats.json", json.dumps(stats, indent=1))
    what = f"classes {sorted(set(conditions['classes']))}" if "classes" in conditions else f"{len(set(prompts))} prompts"
    chosen = " (the model's default; --method ar for plain AR)" if not a.method else ""
    print(f"specvis {a.model} | method {name} {json.dumps(config)}{chosen} | accept {rule} | {num} image{'s' if num != 1 else ''}, {what}")
    print(f"  device {_device_line(pipe)}")
    if out.calibration is not None:
        print(f"  {out.calibration.explain()}")
    print(f"  tokens/image {s.tokens}  target forwards {s.target_forwards}  draft forwards {s.draft_forwards}")
    print(f"  step compression {s.step_compression:.2f}  mean accepted length {s.mean_accepted_length:.2f}  "
          f"wall {s.wall_s:.2f}s  ({num / s.wall_s:.2f} images/s)")
    if compare:
        print(f"  vs ar (same conditions and seed): wall {compare['ar_wall_s']:.2f}s -> {s.wall_s:.2f}s, "
              f"speedup {compare['speedup']:.2f}x  (target forwards {compare['ar_target_forwards']} -> {s.target_forwards})")
        if "images_equal_ar" in compare:
            same = compare["images_equal_ar"]
            print(f"  keyed noise: {same} of {num} images equal AR's for the same seeds, token for token"
                  + ("" if same == num else f" ({num - same} differ: not one picture per seed)"))
    print(f"  wrote {num} PNG{'s' if num != 1 else ''}, grid.png, heatmap.png, stats.json to {out_dir}/")
    return 0


PROMPTS_LIMIT = 16 << 20  # bytes of a --prompts file: some hundred thousand prompts
MAX_IMAGES = 10**6  # --num: sample names its images NNNNNN.png; far more than one run writes


def read_prompts(path: str) -> list[str]:
    """One prompt a line (blank lines skipped)."""
    from .io import read_text

    lines = [ln.strip() for ln in read_text(path, "--prompts", PROMPTS_LIMIT).splitlines()]
    prompts = [ln for ln in lines if ln]
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts (one a line)")
    return prompts


def cmd_sample(a: argparse.Namespace) -> int:
    """``specvis sample``: this rank's share of the images (``specvis.sample``); rank 0 merges."""
    from .sample import init_distributed, sample

    _check_method_and_out(a)
    if a.method:
        _method(a)  # bad flags fail before the model loads (and before the process group)
    if a.num < 1:
        raise ValueError(f"--num must be >= 1, got {a.num}")
    if a.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {a.batch_size}")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    prompts = read_prompts(a.prompts) if a.prompts else None
    dist, a.device = init_distributed(a.device)
    try:
        loaded = _load(a)
        from .zoo import pipeline_for

        pipe = pipeline_for(loaded, [_method_name(a, loaded)])
        method = _method(a, pipe)
        _check_draft(pipe, [method.name])
        sampling = _sampling(a, pipe)
        _plan_memory(pipe, min(a.batch_size, a.num), [method], sampling)  # before any forward
        stats = sample(pipe, method, sampling, out, num=a.num, batch_size=a.batch_size, seed=a.seed,
                       classes=a.classes, prompts=prompts, height=a.height, width=a.width, dist=dist, model=a.model,
                       progress=wanted(a.progress, a.quiet))
    finally:
        dist.close()
    if stats is not None:
        chosen = " (the model's default)" if not a.method else ""
        fresh, reused = stats["rank0_generated_here"], stats["rank0_skipped_here"]
        print(f"specvis {a.model} | method {stats['method']} {json.dumps(stats['config'])}{chosen} | accept "
              f"{stats['acceptance']} | {a.num} images on {dist.world} rank(s), batch size {a.batch_size}")
        print(f"  step compression {stats['step_compression']:.2f}  mean accepted length "
              f"{stats['mean_accepted_length']:.2f}  decoding {stats['wall_s']:.2f}s over all ranks"
              f"  (rank 0: {fresh} generated, {reused} already there)")
        print(f"  wrote {out}/samples.npz (arr_0 uint8 {'x'.join(map(str, stats['npz_shape']))}), stats.json, images/")
    return 0


def check_metrics(text: str | None) -> None:
    """``--metrics``: names of ``bench.quality.METRICS`` or none, comma-separated; anything else is an
    error before the model loads (a metric that is known but unavailable here still only warns)."""
    if text is None:
        return
    from .bench.quality import METRICS

    allowed = [*METRICS, "none"]
    for name in (m.strip() for m in text.split(",")):
        if name and name not in allowed:
            raise ValueError(f"--metrics: unknown metric {name!r}; choose from {', '.join(allowed)} (comma-separated)")


def _bench_outputs(a: argparse.Namespace) -> None:
    """``bench``'s outputs, checked before the model loads: ``--json`` a writable file that is absent
    or a bench report (resumed; anything else is refused and left as it is), ``--md`` a writable
    file, ``--plots`` a writable directory."""
    from .bench.report import read_report
    from .io import check_output_dir, check_output_file

    if a.json is not None:
        if check_output_file(a.json, "--json").exists():
            read_report(a.json, "--json")
    if a.md is not None:
        check_output_file(a.md, "--md")
    if a.plots is not None:
        check_output_dir(a.plots, "--plots")


def cmd_bench(a: argparse.Namespace) -> int:
    from .bench.report import markdown_table, merge_reports
    from .bench.runner import run_bench

    _bench_outputs(a)  # every output path before any work: a report to resume, never another file
    if a.merge:
        if not a.json:
            raise ValueError("--merge needs --json OUT for the merged report")
        report, class_names = merge_reports(a.merge, a.json), None
    else:
        specs = [s for s in a.methods.split(",") if s.strip()]
        if not specs:
            raise ValueError(f"--methods {a.methods!r} names no method: give comma-separated specs, e.g. ar,sjd:window=16")
        check_metrics(a.metrics)
        for spec in specs:  # a bad spec fails before the model loads
            method_from_spec(spec, a.accept)
        names = [parse_method_spec(s)[0] for s in specs]
        prompts = read_prompts(a.prompts) if a.prompts else None  # a bad file fails before the model loads
        from .zoo import pipeline_for

        pipe = pipeline_for(_load(a), names)
        _check_draft(pipe, names)
        class_names = pipe.class_names
        sampling = _sampling(a, pipe)
        if min(a.batch_size, a.num) >= 1:  # (bad counts are the runner's one-line errors)
            _plan_memory(pipe, min(a.batch_size, a.num), [method_from_spec(s, a.accept) for s in specs], sampling)
        metrics = None if a.metrics is None else [m.strip() for m in a.metrics.split(",") if m.strip() not in ("", "none")]

        def show(run: dict) -> None:
            print(f"{run['method']:12s} {json.dumps(run['config']):40s} step compression {run['step_compression']:.2f}  "
                  f"accepted {run['mean_accepted_length']:.2f}  {run['images_per_s']:.3f} img/s  speedup {run['speedup']:.2f}x"
                  + "".join(f"  {k} {v:.3f}" for k, v in run.get("quality", {}).items() if k in ("fid_proxy", "class_accuracy"))
                  + (f"  (timed pass 1 of {a.repeats})" if len(run["wall_s_repeats"]) < a.repeats else ""),
                  flush=True)

        report = run_bench(pipe, specs, a.num, a.batch_size, a.seed, sampling, a.repeats, a.accept, prompts=prompts,
                           height=a.height, width=a.width,
                           progress=wanted(a.progress, a.quiet), on_run=show, json_path=a.json, shards=a.shards,
                           shard_index=a.shard_index, metrics=metrics, data_dir=a.data, warmup=a.warmup,
                           cost_curve=not a.no_cost_curve, continuous=a.continuous)  # writes --json
    if a.md:
        Path(a.md).parent.mkdir(parents=True, exist_ok=True)
        write_text(a.md, markdown_table(report))
    if a.plots:
        from .bench.plots import write_plots

        write_plots(report, a.plots, class_names)
    return 0


def check_common(a: argparse.Namespace) -> None:
    """Flags several commands share, checked before anything loads: ``--device`` (a device this machine
    has), ``--seed`` (0 .. 2**64 - 1) and the counts."""
    from . import checks

    if getattr(a, "device", None) is not None:
        checks.device(a.device, "--device")
    if getattr(a, "seed", None) is not None:
        checks.seed(a.seed, "--seed")
    for flag, high in (("num", MAX_IMAGES), ("batch_size", MAX_IMAGES), ("repeats", 1000), ("shards", MAX_IMAGES)):
        value = getattr(a, flag, None)
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"--{flag.replace('_', '-')} must be an integer in 1..{high}, got {value}")
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
