"""What the commands share: the device, sampling, progress and method flags (the method flags
generated from every method's declared options), and turning flags into a loaded pipeline, its
method and its sampling."""

from __future__ import annotations

import argparse
import re
import typing
from contextlib import contextmanager

from ..registry import ACCEPT, ACCEPTANCE, build_method, method_flags, parse_method_spec
from ..sampling import Sampling

# ``--method``'s default (generate, sample): the best lossless method for the model, as a bench spec.
# One line per model; "discrete" is every other discrete-token model (vertical-sample needs only
# the token grid, which every discrete layout has), "continuous" the continuous-token ones: they keep
# plain AR, their default so far (cspd with the paper ratio is not exact).
DEFAULT_METHODS = {
    "emoji": "sjd:window=16:init=vertical-sample:coupling=gumbel",  # fastest lossless at batch 1: successors.md
    "discrete": "sjd:window=16:init=vertical-sample:coupling=gumbel",
    "continuous": "ar",
}

PROMPTS_LIMIT = 16 << 20  # bytes of a --prompts file: some hundred thousand prompts
MAX_IMAGES = 10**6  # --num: sample names its images NNNNNN.png; far more than one run writes


def default_method_spec(pipe=None) -> str:
    """The spec of ``DEFAULT_METHODS`` for ``pipe`` (None: the discrete-model default), by the tokens
    it declares (``Pipeline.tokens``)."""
    if pipe is None:
        return DEFAULT_METHODS["discrete"]
    if pipe.tokens == "continuous":
        return DEFAULT_METHODS["continuous"]
    return DEFAULT_METHODS.get(pipe.name, DEFAULT_METHODS["discrete"])


def add_progress(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", action="store_true",
                   help="show the progress bar (images done, tokens/s, ETA) on stderr even when it is not a terminal")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def add_device(p: argparse.ArgumentParser) -> None:
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


def add_sampling(p: argparse.ArgumentParser) -> None:
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
    from ..options import NoneType, members

    words = {int: "INT", float: "FLOAT", str: "NAME", bool: "BOOL"}
    word = lambda m: words.get(m, "LIST" if typing.get_origin(m) is tuple else "RULE")
    return "|".join(dict.fromkeys(word(m) for m in members(tp) if m is not NoneType))


def _flag_help(flag) -> str:
    """Each owner's help, allowed values and default (owners that say the same share one entry)."""
    from ..options import spell

    parts: dict[str, list[str]] = {}
    for owner, info in flag.owners:
        if flag.key == ACCEPT:
            text = f"acceptance rule: {', '.join(ACCEPTANCE)} (default: coupled under keyed noise, exact under --noise stream)"
        else:
            allowed = "" if flag.boolean else f"{info.allowed()}; "
            text = f"{info.help} ({allowed}default {spell(info.default)})"
        parts.setdefault(text, []).append(owner)
    return "; ".join(f"{'/'.join(owners)}: {text}" for text, owners in parts.items())


def add_method_options(p: argparse.ArgumentParser) -> None:
    """The method flags, generated from the declared options of every method and rule
    (``registry.method_flags``): each sets the field of its spec key; a flag set for a method that
    does not have it is an error (``method_of``). Grouped under the method (or rule) that lists it first."""
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


def method_name(a: argparse.Namespace, pipe=None) -> str:
    return parse_method_spec(a.method or default_method_spec(pipe))[0]


def _same_text(x: str, y: str) -> bool:
    return x.strip().lower() == y.strip().lower()


def method_of(a: argparse.Namespace, pipe=None):
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


def sampling_of(a: argparse.Namespace, pipe) -> Sampling:
    """The model's sampling with the flags given; ``--noise`` absent: the model's default (keyed for
    discrete-token models, ``pipeline.call_sampling``), recorded resolved."""
    from ..pipeline import call_sampling

    default = pipe.default_sampling
    return call_sampling(pipe, Sampling(
        temperature=default.temperature if a.temperature is None else a.temperature,
        top_k=default.top_k if a.top_k is None else (a.top_k or None),
        top_p=default.top_p if a.top_p is None else a.top_p,
        cfg_scale=default.cfg_scale if a.cfg_scale is None else a.cfg_scale,
        noise=default.noise if a.noise is None else a.noise,
    ))


def load_pipeline(a: argparse.Namespace, names: list[str] | None = None):
    """The pipeline of ``--model`` on ``--device`` (dtype, quantization, compile, captured rounds,
    draft, drafter as flagged; ``--num-iter`` set on a MAR model), routed to the pipeline that runs
    the methods ``names`` (``zoo.pipeline_for``; None: the command's ``--method`` or the model's default)."""
    from ..checks import model_name
    from ..zoo import load, pipeline_for

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
    return pipeline_for(pipe, names if names is not None else [method_name(a, pipe)])


def check_draft(pipe, names: list[str]) -> None:
    """Text-to-image checkpoints have no draft unless ``--draft`` gives one: say so before running."""
    if pipe.conditioning != "class" and pipe.draft is None and "speculative" in names:
        raise ValueError(f"method speculative needs a draft model: give --draft DIR (or a Hub id), a smaller "
                         f"checkpoint of the same family as {pipe.name} ({pipe.family.name})")


def check_method_and_out(a: argparse.Namespace) -> None:
    """Before the model loads, one line each: ``--method ""`` is not the default method, ``--out`` is a
    writable directory (not "": the current one), and ``--method`` with the method flags builds a
    method (built again once the model is loaded, where the model's default may be the base)."""
    from ..io import check_output_dir
    from ..registry import METHODS

    if a.method is not None and not a.method.strip():
        raise ValueError(f"--method is empty: give one of {', '.join(METHODS)} or a spec, or leave it out for the model's default")
    check_output_dir(a.out, "--out")
    if a.method:
        method_of(a)  # bad flags fail before the model loads (and before a process group)


def device_line(pipe) -> str:
    graphs = pipe.device.type == "cuda" if pipe.graphs is None else pipe.graphs
    why = (pipe.extras or {}).get("dtype_source")
    quant = (pipe.extras or {}).get("quantize")
    return (f"{pipe.device} | {str(pipe.dtype).removeprefix('torch.')}{f' ({why})' if why else ''}"
            f"{f' | {quant} weights' if quant else ''}"
            f" | captured rounds {'on' if graphs and pipe.device.type == 'cuda' else 'off'}"
            f" | compile {'on' if pipe.compiled else 'off'}")


def plan_memory(pipe, batch_size: int, methods, sampling, verbose: bool = False, refill: bool = False) -> None:
    """Before any forward: each method's memory plan at ``batch_size`` (``Pipeline.memory``; text
    prompts planned at ``specvis.memory.DEFAULT_PROMPT_TOKENS``, the call re-plans with its own);
    printed with ``verbose``; a plan that does not fit is the one-line error. Pipelines without a KV
    cache (``Pipeline.kv_cache``: MAR) are not planned."""
    if not pipe.kv_cache:
        return
    for method in methods:
        plan = pipe.memory(batch_size, method, sampling, refill=refill)
        if verbose:
            print(f"  {plan.describe()}")
        if not plan.fits:
            from ..memory import MemoryPlanError

            raise MemoryPlanError(plan.line())


def read_prompts(path: str) -> list[str]:
    """One prompt a line (blank lines skipped)."""
    from ..io import read_text

    lines = [ln.strip() for ln in read_text(path, "--prompts", PROMPTS_LIMIT).splitlines()]
    prompts = [ln for ln in lines if ln]
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts (one a line)")
    return prompts


# a pipeline argument's name in its one-line errors -> the flag that gave it (``specvis generate``)
ARGUMENT_FLAGS = ((re.compile(r"^batch_size must be "), "--batch-size must be "),
                  (re.compile(r"^seed must be "), "--seed must be "),
                  (re.compile(r"^classes\[\d+\] = (-?\d+) "), r"--class \1 "),
                  (re.compile(r"^negative_prompts: give one, or one per prompt "),
                   "--negative-prompt: give one, or one per --prompt "))


@contextmanager
def named_by_flags():
    """A one-line error about a pipeline argument (which the pipeline checks, once) names the flag
    that gave it: ``batch_size`` is ``--batch-size``, ``classes[i] = c`` is ``--class c``."""
    try:
        yield
    except ValueError as e:
        text = str(e)
        for pattern, flag in ARGUMENT_FLAGS:
            if pattern.match(text):
                raise ValueError(pattern.sub(flag, text, count=1)) from None
        raise
