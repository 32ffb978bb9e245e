"""Model bundles by name: the embedded ``emoji`` bundle (shipped under ``specvis/assets/emoji``), its
continuous-token models as ``emoji-continuous`` (also ``load("emoji").continuous``), the text-to-image
``emoji-t2i`` (Janus-Pro checkpoints under ``specvis/assets/emoji_t2i``), the MAR pair ``emoji-mar``, and
``random-tiny`` / ``random-tiny-continuous`` (seeded random models, for smoke tests without weights)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from . import checks
from .models.continuous import ContinuousAR, ContinuousARConfig
from .models.drafter import EagleDrafter
from .models.checkpoint import stored_dtype
from .models.llamagen import LlamaGen, LlamaGenConfig
from .models.loading import requested_dtype, resolve
from .models.quantize import check_quantize, quantize_linears
from .pipeline import Pipeline
from .sampling import Sampling

ASSETS = Path(__file__).parent / "assets"
DTYPE_LABELS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class PaletteTokenizer(torch.nn.Module):
    """Stand-in tokenizer for random models: each code is a fixed colour, ``cell`` pixels wide."""

    def __init__(self, vocab_size: int, cell: int = 8, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("palette", torch.rand(vocab_size, 3, generator=g) * 2 - 1)
        self.cell = cell

    @property
    def codebook(self) -> torch.Tensor:
        return self.palette

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        side = int(codes.shape[1] ** 0.5)
        img = self.palette[codes].view(codes.shape[0], side, side, 3).permute(0, 3, 1, 2)
        return img.repeat_interleave(self.cell, 2).repeat_interleave(self.cell, 3)


class LatentPalette(torch.nn.Module):
    """Stand-in decoder for random continuous-token models: token (C channels) -> the colour
    tanh(first three channels), ``cell`` pixels wide."""

    def __init__(self, cell: int = 8) -> None:
        super().__init__()
        self.cell = cell

    def decode_continuous(self, tokens: torch.Tensor) -> torch.Tensor:
        B, n, C = tokens.shape
        side = int(n ** 0.5)
        rgb = torch.tanh(tokens.float()[..., :3])
        if C < 3:
            rgb = torch.cat([rgb, rgb[..., :1].expand(B, n, 3 - C)], -1)
        img = rgb.view(B, side, side, 3).permute(0, 3, 1, 2)
        return img.repeat_interleave(self.cell, 2).repeat_interleave(self.cell, 3)


def load_pipeline(name: str | Path, draft: str | Path | None = None, drafter: str | Path | None = None, *,
                  device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                  quantize: str | None = None) -> Pipeline:
    """The pipeline of a checkpoint directory or Hugging Face Hub id, as its family loads it
    (``families.pipeline_fields``): ``sv.load`` of a checkpoint without the configuring."""
    from .families import pipeline_fields

    return Pipeline(**pipeline_fields(name, draft=draft, drafter=drafter, device=device, dtype=dtype,
                                      quantize=quantize))


def _random_tiny(device: torch.device = torch.device("cpu"), dtype: torch.dtype | None = None) -> Pipeline:
    from .families.embedded import CODES

    torch.manual_seed(0)
    base = dict(vocab_size=64, num_classes=4, block_size=64, multiple_of=32)
    target = LlamaGen(LlamaGenConfig(dim=64, n_layer=2, n_head=4, initializer_range=0.2, **base)).eval()
    draft = LlamaGen(LlamaGenConfig(dim=32, n_layer=1, n_head=2, initializer_range=0.2, **base)).eval()
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    return _built(Pipeline("random-tiny", target, PaletteTokenizer(64).eval(), draft=draft, drafter=drafter,
                           class_names=[f"class{i}" for i in range(4)], family=CODES), device, dtype)


def _built(pipe, device: torch.device, dtype: torch.dtype | None):
    """A pipeline of seeded random models built in memory (no checkpoint): fp32 unless asked."""
    dt = requested_dtype(dtype) or torch.float32
    pipe.extras["dtype_source"] = "requested" if dtype is not None else "fp32: random models built in memory"
    for m in (pipe.target, pipe.draft, pipe.drafter):
        if m is not None:
            m.to(device=device, dtype=dt)
    return pipe.to(device)


def _random_tiny_continuous(device: torch.device = torch.device("cpu"), dtype: torch.dtype | None = None) -> Pipeline:
    """A random target (MAR's zero-initialised head output replaced by a random one) and, as its draft, a
    copy with every weight perturbed by 1e-4 of its spread: random heads amplify differences along the
    denoising run so much that independent ones, or a 1% perturbation, are never accepted."""
    from .families.embedded import LATENTS

    torch.manual_seed(0)
    cfg = ContinuousARConfig(token_dim=3, height=4, width=4, num_classes=4, dim=64, n_layer=2, n_head=4,
                             multiple_of=32, head_width=64, head_depth=2, num_train_steps=16, num_sampling_steps=8)
    target = ContinuousAR(cfg).eval()
    target.head.net.init_weights(zero_init=False)
    draft = ContinuousAR(cfg).eval()
    with torch.no_grad():
        for p, q in zip(draft.parameters(), target.parameters()):
            p.copy_(q + 1e-4 * q.std().clamp_min(1e-3) * torch.randn_like(q))
    return _built(Pipeline("random-tiny-continuous", target, LatentPalette(), draft=draft,
                           class_names=[f"class{i}" for i in range(4)], family=LATENTS), device, dtype)


def _bundle_dtype(model_dir: Path, device: torch.device, dtype) -> tuple[torch.dtype, str]:
    """(dtype, why) of an embedded bundle whose target is ``model_dir`` (``models.loading.resolve``)."""
    return resolve(dtype, stored_dtype(model_dir), device)


def _emoji_continuous(root: Path, meta: dict, vq, device: torch.device = torch.device("cpu"), dtype=None) -> Pipeline | None:
    """The bundle's ContinuousAR target + draft over VQ pre-quantisation latents, when shipped."""
    from .families.embedded import LATENTS

    if not (root / "continuous_target").exists():
        return None
    dt, why = _bundle_dtype(root / "continuous_target", device, dtype)
    draft = root / "continuous_draft"
    return Pipeline(
        "emoji-continuous",
        ContinuousAR.from_pretrained(root / "continuous_target", device=device, dtype=dt),
        vq,
        draft=ContinuousAR.from_pretrained(draft, device=device, dtype=dt) if draft.exists() else None,
        class_names=meta["class_names"],
        default_sampling=Sampling(**meta.get("continuous_sampling", {"cfg_scale": 3.0})),
        extras={"meta": meta, "root": root, "dtype_source": why},
        family=LATENTS,
    )


def _emoji_parts(device: torch.device = torch.device("cpu")):
    """(root, bundle.json, VQ) of the installed emoji bundle: what both of its pipelines start from.
    The VQ (the tokenizer) is fp32 whatever the models' dtype."""
    root = ASSETS / "emoji"
    meta_path = root / "bundle.json"
    if not meta_path.exists():
        raise ValueError("the emoji bundle is not installed (specvis/assets/emoji/bundle.json missing); "
                         "use --model random-tiny")
    from .models.vq import VQModel

    return root, json.loads(meta_path.read_text()), VQModel.from_pretrained(root / "vq", device=device)


def _emoji(device: torch.device = torch.device("cpu"), dtype=None) -> Pipeline:
    from .families.embedded import CODES

    root, meta, vq = _emoji_parts(device)
    dt, why = _bundle_dtype(root / "target", device, dtype)
    target = LlamaGen.from_pretrained(root / "target", device=device, dtype=dt)
    return Pipeline(
        "emoji",
        target,
        vq,
        draft=LlamaGen.from_pretrained(root / "draft", device=device, dtype=dt) if (root / "draft").exists() else None,
        drafter=EagleDrafter.from_pretrained(root / "drafter", target) if (root / "drafter").exists() else None,
        class_names=meta["class_names"],
        default_sampling=Sampling(**meta.get("default_sampling", {})),
        extras={"meta": meta, "root": root, "dtype_source": why},
        continuous=_emoji_continuous(root, meta, vq, device, dtype),
        family=CODES,
    )


def _emoji_continuous_only(device: torch.device = torch.device("cpu"), dtype=None) -> Pipeline:
    """The continuous models alone: the discrete target, draft and drafter are not loaded."""
    pipe = _emoji_continuous(*_emoji_parts(device), device, dtype)
    if pipe is None:
        raise ValueError("the emoji bundle ships no continuous-token models (specvis/assets/emoji/continuous_target missing)")
    return pipe


def _emoji_t2i(device: torch.device = torch.device("cpu"), dtype=None):
    """The text-to-image emoji target + draft (Janus-Pro checkpoints) and their EAGLE head; prompts are
    emoji short names. The emoji bundle's classifier scores what a prompt asks for (``prompts.json``)."""
    root = ASSETS / "emoji_t2i"
    if not (root / "bundle.json").exists():
        raise ValueError("the emoji-t2i bundle is not installed (specvis/assets/emoji_t2i/bundle.json missing)")
    drafter = root / "drafter"
    pipe = load_pipeline(root / "target", draft=root / "draft", drafter=drafter if drafter.exists() else None,
                         device=device, dtype=dtype)
    pipe.name = "emoji-t2i"
    table = json.loads((root / "prompts.json").read_text())
    pipe.extras.update(root=ASSETS / "emoji", prompt_classes={k: v["class"] for k, v in table.items()},
                       meta=json.loads((root / "bundle.json").read_text()))
    return pipe


def _emoji_mar(device: torch.device = torch.device("cpu"), dtype=None):
    """The emoji MAR target + CSpD draft (official ``checkpoint-last.pth`` layout) over the emoji VQ's
    normalised latents, decoded by the VQ (``SphereLatentDecoder``)."""
    from .families import mar

    root, meta, vq = _emoji_parts(device)
    if not (root / "mar_target").exists():
        raise ValueError("the emoji bundle ships no MAR models (specvis/assets/emoji/mar_target missing)")
    draft = root / "mar_draft"
    pipe = Pipeline(**mar.pipeline_fields("emoji-mar", root / "mar_target", draft=draft if draft.exists() else None,
                                          vae=mar.SphereLatentDecoder(vq), device=device, dtype=dtype))
    pipe.name = "emoji-mar"
    pipe.class_names = meta["class_names"]
    pipe.default_sampling = Sampling(**meta.get("mar_sampling", {"cfg_scale": 3.0, "temperature": 1.0}))
    pipe.num_iter = meta.get("mar_num_iter", pipe.num_iter)
    pipe.extras.update(meta=meta, root=root)
    return pipe


BUNDLES = {
    "emoji": ("colour-emoji LlamaGen target + draft and VQ tokenizer trained for specvis (embedded)", _emoji),
    "emoji-continuous": ("the emoji bundle's continuous-token models (ContinuousAR + diffusion head over VQ "
                         "latents) for cspd", _emoji_continuous_only),
    "emoji-t2i": ("text-to-image emoji target + draft + EAGLE head trained for specvis, Janus-Pro format "
                  "(embedded; prompts are emoji names)", _emoji_t2i),
    "emoji-mar": ("the emoji bundle's MAR target + draft (masked AR with a diffusion head over VQ latents; "
                  "MAR's own sampler and cspd)", _emoji_mar),
    "random-tiny": ("seeded random tiny LlamaGen target + draft, palette images (smoke tests)", _random_tiny),
    "random-tiny-continuous": ("seeded random tiny ContinuousAR target + draft (cspd smoke tests)", _random_tiny_continuous),
}


# Intra-op threads (``load``): torch's default, one thread per core, made SJD run at 0.07x of AR on a
# busy 2-core machine: the forwards of a small model are too short to share between threads.
SMALL_MODEL_PARAMS = 50_000_000  # targets below this many parameters run on one CPU thread by default
THREADS_ENV = "SPECVIS_THREADS"


def threads_for(n_params: int, device, threads: int | str | None = None) -> tuple[int | None, str]:
    """(intra-op thread count to set, or None to leave torch's, and why). In order: ``threads``
    (``sv.load(threads=)``), the environment variable ``SPECVIS_THREADS``, then: leave torch's when
    ``OMP_NUM_THREADS`` is set, the device is not the CPU or the target has ``SMALL_MODEL_PARAMS``
    parameters or more; else 1. A value of 0 means torch's default; more than the machine's cores
    (``os.cpu_count``) is refused (OpenMP aborts the process when it cannot make its threads). A bad
    value is a ValueError."""
    for value, what in ((threads, "threads="), (os.environ.get(THREADS_ENV), THREADS_ENV)):
        if value is None or value == "":
            continue
        try:
            n = int(value) if not isinstance(value, bool) else -1
        except (TypeError, ValueError):
            n = -1
        cores = os.cpu_count() or 1
        if n < 0 or n > cores or (isinstance(value, float) and value != n):
            raise ValueError(f"{what} {value!r}: give a whole number of CPU threads in 1..{cores}, this machine's "
                             "cores (0: torch's default)")
        return (n or None), what
    if os.environ.get("OMP_NUM_THREADS"):
        return None, "OMP_NUM_THREADS"
    if torch.device(device).type != "cpu" or n_params >= SMALL_MODEL_PARAMS:
        return None, "torch default"
    return 1, f"default: target under {SMALL_MODEL_PARAMS // 1_000_000}M parameters on CPU"


def load(name: str = "emoji", device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
         compile: bool | str = False, graphs: bool | None = None, draft: str | None = None,
         drafter: str | None = None, threads: int | None = None, quantize: str | None = None) -> Pipeline:
    """Load a bundle by name, offline, or a real checkpoint: a directory or Hugging Face Hub id
    (``specvis.families``; ``draft``: a smaller checkpoint of the same family; ``drafter``: an EAGLE
    head directory trained for it, ``specvis train-drafter --model``). Weights are loaded at their
    own cost, straight into ``device`` and ``dtype`` (``models.loading``). ``dtype`` None: the
    checkpoint's stored dtype on CUDA; on a CPU that dtype where the CPU has dot products in it
    (``cpu_features``), else fp32 (``models.loading.default_dtype``); ``pipe.extras["dtype"]`` and
    ``pipe.extras["dtype_source"]`` say which ran and why. ``quantize="int8"``: weight-only int8
    linear layers in the blocks of the target and the draft model (``models.quantize``; quantized as
    they stream in from checkpoint directories); ``pipe.extras["quantize"]`` records it.
    ``compile``, ``graphs``: see ``Pipeline.configure``.

    ``threads``: torch's intra-op CPU threads (``torch.set_num_threads``, process-wide). Default
    (``threads_for``): 1 when the device is the CPU, the target has fewer than 50M parameters
    (``SMALL_MODEL_PARAMS``) and neither ``SPECVIS_THREADS`` nor ``OMP_NUM_THREADS`` is set; else
    torch's own. ``SPECVIS_THREADS=k`` or ``threads=k`` sets k (``threads=`` wins; 0: torch's
    default). The count set is recorded in ``pipe.extras["threads"]`` (and why in
    ``pipe.extras["threads_source"]``)."""
    name = checks.model_name(name)
    device = checks.device(device)  # a device this machine lacks fails before loading
    threads_for(0, "cuda", threads)  # a bad threads= / SPECVIS_THREADS fails before loading
    requested_dtype(dtype)  # a bad dtype fails before loading
    check_quantize(quantize)
    dev = torch.device(device)
    if name in BUNDLES:
        if draft is not None:
            raise ValueError(f"draft= is for checkpoint directories; bundle {name!r} ships its own draft")
        if drafter is not None:
            raise ValueError(f"drafter= is for checkpoint directories; bundle {name!r} ships its own drafter")
        pipe = BUNDLES[name][1](dev, dtype)
    elif Path(name).is_dir() or "/" in str(name):
        from .io import check_directory_files

        for d in (name, draft, drafter):  # a FIFO among the files would block its reader for ever
            if d is not None and Path(d).is_dir():
                check_directory_files(d, "model" if d is name else "draft" if d is draft else "drafter")

        pipe = load_pipeline(name, draft=draft, drafter=drafter, device=dev, dtype=dtype, quantize=quantize)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(BUNDLES)}, a checkpoint directory or a Hub id")
    n, source = threads_for(sum(p.numel() for p in pipe.target.parameters()), device, threads)
    if n is not None:
        torch.set_num_threads(n)
        pipe.extras["threads"] = n
        pipe.extras["threads_source"] = source
    if quantize:  # bundles and their own-format families: after loading (checkpoint dirs: while loading)
        for m in (pipe.target, pipe.draft):
            if m is not None:
                quantize_linears(m)
        pipe.extras["quantize"] = quantize
    pipe.extras["dtype"] = DTYPE_LABELS.get(pipe.dtype, str(pipe.dtype))
    return pipe.to(device).configure(dtype, compile, graphs)


def installed(name: str) -> bool:
    if name == "emoji-continuous":
        return (ASSETS / "emoji" / "continuous_target").exists()
    if name == "emoji-mar":
        return (ASSETS / "emoji" / "mar_target").exists()
    if name == "emoji-t2i":
        return (ASSETS / "emoji_t2i" / "bundle.json").exists()
    return name != "emoji" or (ASSETS / "emoji" / "bundle.json").exists()


CONTINUOUS_METHODS = ("ar", "cspd")


def pipeline_for(pipe, names: list[str]):
    """The pipeline that runs methods ``names``: cspd needs continuous-token models, so a bundle that
    ships them (``pipe.continuous``) switches to them when every method is ar or cspd."""
    other = sorted(set(names) - set(CONTINUOUS_METHODS))
    if pipe.tokens == "continuous":
        if other:
            raise ValueError(f"model {pipe.name} has continuous tokens: methods {' and '.join(CONTINUOUS_METHODS)} only, got {other[0]}")
        return pipe
    if "cspd" not in names:
        return pipe
    if pipe.continuous is None:
        raise ValueError(f"method cspd needs continuous-token models and model {pipe.name} has none "
                         "(try --model emoji-continuous or random-tiny-continuous)")
    if other:
        raise ValueError(f"method cspd runs on the continuous-token models of {pipe.name}: bench it with ar only, "
                         f"not with {other[0]} (e.g. --methods ar,cspd)")
    print(f"specvis: cspd: using {pipe.continuous.name}, the continuous-token models of {pipe.name}", file=sys.stderr)
    return pipe.continuous
