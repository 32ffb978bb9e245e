"""Pipelines: a target model, its tokenizer and optional draft/drafter, from classes to images."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from . import checks
from .cpu_features import NATIVE_FLAGS, native_dot_products
from .generate import Generation
from .memory import DEFAULT_PROMPT_TOKENS, MemoryPlan, MemoryPlanError, plan
from .models.base import Captions, Condition, Prompts
from .models.decoder import CachedStack
from .models.checkpoint import one_line
from .models.weight_layout import prepare_cpu_linears
from .registry import method_argument
from .sampling import Sampling, sampling_argument
from .tune import run
from .viz import to_pil


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


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def check_class_call(name: str, classes, prompts, negative_prompts, height, width) -> None:
    """The arguments of a class-conditional pipeline call: classes, no prompts, the model's own grid."""
    if prompts is not None or negative_prompts is not None:
        raise ValueError(f"model {name} is class-conditional: give classes=, not prompts=")
    if height is not None or width is not None:
        raise ValueError(f"model {name} has a fixed grid: height/width cannot be set")
    if classes is None:
        raise ValueError(f"model {name} is class-conditional: give classes=[...]")


def call_arguments(method, sampling, seed, default_sampling: Sampling) -> tuple[Any, Sampling, int]:
    """A pipeline call's ``method`` (None: AR; a name or bench spec string: that method), ``sampling``
    (None: the model's; a dict: ``Sampling(**it)``) and ``seed``, checked before anything runs."""
    return method_argument(method), sampling_argument(sampling, default_sampling), checks.seed(seed)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {dtype!r}")
    return DTYPES[dtype]


Conditioning = Literal["class", "text", "caption"]
Tokens = Literal["discrete", "continuous"]


@dataclass
class Pipeline:
    """``pipe(classes, method, sampling, seed)`` -> ``Generation`` with decoded images. ``continuous``:
    the bundle's continuous-token pipeline (``ContinuousPipeline``), where it ships one.

    What the model can do is declared, for callers (the CLI, the demo, the bench) to ask instead of
    testing the pipeline's class: ``conditioning`` ("class": ``pipe(classes=...)``; "text": prompts
    through the checkpoint's processor; "caption": prompts through a separate text encoder),
    ``tokens`` ("discrete" codes in ``out.tokens``; "continuous" latents in ``out.latents``),
    ``kv_cache`` (decodes with a KV cache: ``memory`` plans apply) and ``num_iter`` (sampler steps of
    a model that reveals its tokens in its own order, MAR; None: one stream position per step)."""

    conditioning: ClassVar[Conditioning] = "class"
    tokens: ClassVar[Tokens] = "discrete"
    kv_cache: ClassVar[bool] = True

    name: str
    target: torch.nn.Module
    tokenizer: Any
    draft: torch.nn.Module | None = None
    drafter: torch.nn.Module | None = None
    class_names: list[str] = field(default_factory=list)
    default_sampling: Sampling = field(default_factory=Sampling)
    extras: dict[str, Any] = field(default_factory=dict)
    continuous: "Pipeline | None" = None
    graphs: bool | None = None  # captured CUDA-graph rounds; None: on for CUDA (specvis.generate)
    compiled: bool = False
    num_iter: int | None = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def configure(self, dtype: str | torch.dtype | None = None, compile: bool | str = False,
                  graphs: bool | None = None) -> "Pipeline":
        """Weights and KV caches of the target, draft and drafter in ``dtype`` (fp32, bf16, fp16; the
        tokenizer, RoPE tables and, on CPU, the KV caches stay fp32: ``models.base.storage_dtype``; laws
        are computed in fp32 either way), ``torch.compile`` of their cached block stacks, and captured
        rounds on or off. Lossless methods stay exact for the model as run: a bf16 model samples its
        bf16 logits, which depend at rounding level on the block a forward computes them in
        (docs/results/archive/bf16-cpu.md).

        ``compile=True`` compiles on CUDA only: on CPU the compiled forward was measured slower
        (docs/results/archive/compile-cpu.md: inductor re-materialises the whole in-place KV cache on every
        call), so it warns and stays eager; ``compile="always"`` compiles on any device. On CPU the
        linear layers run the fastest kernel for their row count (``models.weight_layout``: weights
        transposed for MKL's small calls, packed for oneDNN's wide ones; same values)."""
        if compile not in (False, True, "always"):
            raise ValueError(f"compile must be False, True or 'always', got {compile!r}")
        if dtype is not None:
            dt = resolve_dtype(dtype)
            for m in (self.target, self.draft, self.drafter):
                if m is not None:
                    m.to(dtype=dt)
            if self.device.type == "cpu" and native_dot_products(dt) is False:
                warnings.warn(f"this CPU has no {str(dt).removeprefix('torch.')} dot products (none of the cpuinfo "
                              f"flags {', '.join(sorted(NATIVE_FLAGS[dt]))}): its matmuls are emulated, measured "
                              "3.5-25x slower than fp32 (docs/results/archive/bf16-cpu-avx2.md); use fp32", stacklevel=2)
        if compile is True and self.device.type == "cpu":
            warnings.warn("torch.compile skipped on CPU, where it measured slower than eager "
                          "(docs/results/archive/compile-cpu.md); compile='always' forces it", stacklevel=2)
        elif compile and not self.compiled:
            for m in (self.target, self.draft):
                if isinstance(m, CachedStack):  # the cached block stacks compile (models.decoder)
                    m.compile_decoder()
            self.compiled = True
        if self.device.type == "cpu":  # faster matmuls (models/weight_layout.py)
            prepare_cpu_linears(*(m for m in (self.target, self.draft, self.drafter, self.continuous)
                                  if isinstance(m, torch.nn.Module)))
        self.graphs = graphs
        return self

    @property
    def num_classes(self) -> int:
        return self.target.num_conditions

    def memory(self, batch_size: int = 1, method=None, sampling: Sampling | None = None,
               prompt_tokens: int | None = None) -> MemoryPlan:
        """The memory a call of ``batch_size`` samples with ``method`` (None: AR) and ``sampling``
        (None: the pipeline's default; CFG doubles the rows) needs, against what the device has free
        now (``specvis.memory``): ``weights_bytes``, ``kv_bytes``, ``free_bytes``, ``fits``,
        ``max_batch_size``. ``prompt_tokens``: the longest prompt (default: the model's fixed prefix,
        or ``DEFAULT_PROMPT_TOKENS`` for text prompts); a call plans with its own prompts."""
        from .methods.ar import AR

        sampling = sampling or self.default_sampling
        prefix = min(self.target.max_prefix, DEFAULT_PROMPT_TOKENS) if prompt_tokens is None else int(prompt_tokens)
        return plan(self.target, self.draft, self.drafter, self._resident(), batch_size=batch_size,
                    cfg=sampling.uses_cfg, prefix=prefix, method_slots=(AR() if method is None else method).pad)

    def _resident(self) -> tuple:
        """Modules besides the cached models that hold memory (the tokenizer)."""
        return (self.tokenizer,)

    def check_memory(self, condition: Condition, method, sampling: Sampling) -> MemoryPlan:
        """The plan of a call about to run; a ``MemoryPlanError`` (one line: bytes needed, bytes free,
        the largest batch that fits) when it does not fit. Runs before any forward."""
        widths = [prefix_width(c, self.target) for c in (condition.cond, condition.uncond) if c is not None]
        p = self.memory(condition.batch, method, sampling, prompt_tokens=max(widths))
        if not p.fits:
            raise MemoryPlanError(p.line())
        return p

    @property
    def codebook(self) -> torch.Tensor:
        return self.tokenizer.codebook

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def to(self, device: str | torch.device) -> "Pipeline":
        for m in (self.target, self.tokenizer, self.draft, self.drafter):
            if m is not None:
                m.to(device)
        if self.continuous is not None:
            self.continuous.to(device)
        return self

    @torch.no_grad()
    def __call__(self, classes=None, method=None, sampling: Sampling | None = None, seed: int = 0,
                 decode: bool = True, *, prompts=None, negative_prompts=None, height: int | None = None,
                 width: int | None = None, progress=None) -> Generation:
        check_class_call(self.name, classes, prompts, negative_prompts, height, width)
        method, sampling, seed = call_arguments(method, sampling, seed, self.default_sampling)
        conditions = torch.as_tensor(checks.class_ids(classes, self.num_classes), dtype=torch.long, device=self.device)
        self.check_memory(Condition(conditions), method, sampling)
        out = run(self.target, conditions, method, sampling, seed,  # sv.Auto() resolved first (specvis.tune)
                  draft=self.draft, drafter=self.drafter, codebook=self.codebook, graphs=self.graphs, progress=progress)
        if decode:
            out.images = self.images_of(out)
        return out

    @torch.no_grad()
    def to_images(self, tokens: torch.Tensor):
        return to_pil(self.tokenizer.decode(tokens))

    def images_of(self, out: Generation):
        """PIL images of a ``Generation`` of this pipeline."""
        return self.to_images(out.tokens)


class ContinuousPipeline(Pipeline):
    """A ``ContinuousAR`` target (+ draft) whose continuous tokens a decoder with ``decode_continuous``
    renders (the VQ decoder for the emoji bundle). Methods: ``sv.CSpD`` and ``sv.AR`` (target-only
    sampling); there is no codebook, so no LANTERN."""

    tokens: ClassVar[Tokens] = "continuous"

    @property
    def codebook(self) -> None:
        return None

    @torch.no_grad()
    def to_images(self, latents: torch.Tensor):
        return to_pil(self.tokenizer.decode_continuous(latents))

    def images_of(self, out: Generation):
        return self.to_images(out.latents)


@dataclass
class TextPipeline(Pipeline):
    """A text-to-image checkpoint (``specvis.families``): ``pipe(prompts=[...])``. A prompt is a ``str``
    (the checkpoint's processor and the family's official template apply) or a ``list[int]`` that is
    already the whole conditional prefix. The processor and the VQ decoder (``specvis[hf]``) are
    loaded on first use; ``decode=False`` with token-id prompts needs neither."""

    directory: Any = None
    family: Any = None  # the checkpoint's ``families.base.Family``: template, suffix, processor, image decoder
    vq: Any = None  # specvis.models.hf_vq decoder, loaded on first decode (or for a LANTERN codebook)
    _processor: Any = None

    @property
    def conditioning(self) -> Conditioning:
        """The family's: "text" (the checkpoint's processor) or "caption" (LlamaGen t2i's flan-t5)."""
        return self.family.conditioning

    @property
    def num_classes(self) -> int:
        return 0

    @property
    def grid(self) -> tuple[int, int]:
        """The checkpoint's native grid (rows, columns) in image tokens: what height/width default to."""
        return tuple(self.extras["grid"])

    def prompt_class(self, prompt) -> int:
        """The class a prompt asks for, from the checkpoint's ``extras["prompt_classes"]`` (the
        emoji-t2i bundle: every glyph name, lower case -> its emoji class), -1 when it names none."""
        if not isinstance(prompt, str):
            return -1
        return int((self.extras.get("prompt_classes") or {}).get(prompt.strip().lower(), -1))

    def _resident(self) -> tuple:
        return (self.vq,)

    def to(self, device: str | torch.device) -> "TextPipeline":
        super().to(device)
        if self.vq is not None:
            self.vq.to(device)
        return self

    @property
    def processor(self):
        """The family's prompt processor (``Family.processor``: the checkpoint's transformers processor,
        or LlamaGen t2i's flan-t5 encoder), loaded on first use."""
        if self._processor is None:
            self._processor = self.family.processor(self.directory, self.target, self.device, self.dtype)
        return self._processor

    @property
    def decoder(self):
        """The family's VQ image decoder (``decode(codes, height, width)``, ``codebook``), on the pipeline's device."""
        if self.vq is None:
            try:
                vq = self.family.image_decoder(self.directory, device=self.device)  # fp32, streamed onto the device
            except ValueError:
                raise
            except (ImportError, OSError, RuntimeError, KeyError) as exc:
                raise ValueError(f"{self.directory}: cannot load the image decoder ({one_line(exc)})") from None
            self.vq = vq.to(self.device)
        return self.vq

    @property
    def codebook(self) -> torch.Tensor:
        return self.decoder.codebook

    def _ids(self, prompts, what: str, height: int, width: int) -> list[list[int]]:
        """Each prompt's token ids: a ``str`` through the family's official template (``Family.encode``),
        a ``list[int]`` as given; checked against what the model reads (``Family.check_ids``)."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"{what} must be a non-empty list of str or of token-id lists")
        for i, p in enumerate(prompts):
            if isinstance(p, str):  # empty or non-UTF-8 text: one line naming the entry
                checks.text(p, f"{what}[{i}]", allow_empty=what != "prompts")
            elif not (isinstance(p, (list, tuple)) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
                raise ValueError(f"{what}: each entry must be a str or a non-empty list of token ids, got {p!r:.60}")
        texts = [p for p in prompts if isinstance(p, str)]
        encoded = iter(self.family.encode(self.processor, texts, height, width, self.target) if texts else [])
        out = [next(encoded) if isinstance(p, str) else list(p) for p in prompts]
        self.family.check_ids(self, out, what)
        return out

    def with_positive_suffix(self, prompts, on: bool):
        """The text prompts with the family's official positive suffix appended (``Family.positive_suffix``,
        "" where it has none) when ``on``; token-id prompts are whole prefixes and stay as given."""
        if not isinstance(on, bool):
            raise ValueError(f"positive_suffix must be True or False, got {on!r}")
        suffix = self.family.positive_suffix
        if not on or not suffix or not isinstance(prompts, (list, tuple)):
            return prompts
        return [p + suffix if isinstance(p, str) else p for p in prompts]

    def set_grid(self, height: int | None, width: int | None) -> tuple[int, int]:
        """Generate ``height x width`` image tokens (None: the native grid's) with the target and draft;
        a family with a fixed grid (``Family.fixed_grid``: LlamaGen t2i's 2D RoPE table) takes its own only."""
        native = self.grid
        if self.family.fixed_grid:
            if (height is not None and height != native[0]) or (width is not None and width != native[1]):
                raise ValueError(f"model {self.name}: {self.family.name} generates its native {native[0]}x{native[1]} "
                                 f"grid only (its 2D RoPE table), got height={height} width={width}")
            return native
        H, W = native[0] if height is None else height, native[1] if width is None else width
        try:
            for m in (self.target, self.draft):
                if m is not None:
                    m.set_grid(H, W)
        except ValueError as e:
            if height is None and width is None:
                raise ValueError(f"{e} (the checkpoint's native grid); pass height= and width= "
                                 "(--height/--width) in image tokens for a smaller image") from None
            raise
        return H, W

    def check_lengths(self, rows: list[list[int]], what: str) -> None:
        """Each prefix must leave room for the image stream in every model's context (the draft's too)."""
        for model, whose in ((self.target, f"model {self.name}"), (self.draft, "the draft")):
            if model is None:
                continue
            i = max(range(len(rows)), key=lambda j: len(rows[j]))
            if len(rows[i]) > model.max_prefix:
                L = model.layout
                raise ValueError(f"{what}[{i}] is {len(rows[i])} tokens, longer than {whose} allows with a "
                                 f"{L.height}x{L.width} image: {model.config.max_positions} positions less the "
                                 f"image's {L.stream_len} leave {model.max_prefix} for the prompt")

    @torch.no_grad()
    def __call__(self, classes=None, method=None, sampling: Sampling | None = None, seed: int = 0,
                 decode: bool = True, *, prompts=None, negative_prompts=None, height: int | None = None,
                 width: int | None = None, progress=None, positive_suffix: bool = True) -> Generation:
        """``positive_suffix``: append the family's official positive suffix to each text prompt, as its
        official scripts do (Emu3: ``POSITIVE_SUFFIX``; the other families have none); False turns it off."""
        if classes is not None:
            raise ValueError(f"model {self.name} is text-conditioned: give prompts=, not classes=")
        if prompts is None:
            raise ValueError(f"model {self.name} is text-conditioned: give prompts=[...]")
        method, sampling, seed = call_arguments(method, sampling, seed, self.default_sampling)
        cond = self.conditions(prompts, negative_prompts, sampling, height, width, positive_suffix)
        self.check_memory(cond, method, sampling)
        out = run(self.target, cond, method, sampling, seed, draft=self.draft, drafter=self.drafter,
                  codebook=self.codebook if "codebook" in _rule_needs(method) else None, graphs=self.graphs,
                  progress=progress)
        if decode:
            out.images = self.to_images(out.tokens)
        return out

    def prefix(self, prompts, what: str = "prompts", height: int | None = None, width: int | None = None):
        """The conditional prefix rows of ``prompts`` on the pipeline's device (``Family.prefix``:
        ``Prompts`` of token ids, or LlamaGen t2i's ``Captions``), on the grid last set."""
        L = self.target.layout
        H, W = L.height if height is None else height, L.width if width is None else width
        rows = self._ids(prompts, what, H, W)
        self.check_lengths(rows, what)
        return self.family.prefix(self, rows)

    def conditions(self, prompts, negative_prompts, sampling: Sampling, height: int | None,
                   width: int | None, positive_suffix: bool = True) -> Condition:
        """The call's conditional rows and their CFG rows (None without CFG), on the grid it asks for:
        the negative prompts' rows, else the family's official unconditional rows (``Family.unconditional``)."""
        if (isinstance(prompts, (list, tuple)) and isinstance(negative_prompts, (list, tuple))
                and len(negative_prompts) != len(prompts)):
            raise ValueError(f"negative_prompts: {len(negative_prompts)} given for {len(prompts)} prompts; give one per prompt")
        H, W = self.set_grid(height, width)
        cond = self.prefix(self.with_positive_suffix(prompts, positive_suffix), "prompts", H, W)
        if negative_prompts is not None:
            uncond = self.prefix(negative_prompts, "negative_prompts", H, W)
        elif not sampling.uses_cfg:
            uncond = None
        else:
            uncond = self.family.unconditional(self, cond, H, W)
        if uncond is not None and len(uncond) != len(cond):
            raise ValueError(f"negative_prompts: {len(uncond)} given for {len(cond)} prompts")
        return Condition(cond, uncond)

    @torch.no_grad()
    def to_images(self, tokens: torch.Tensor):
        """PIL images of codes (B, H*W) on the grid last generated (the native one before any call)."""
        L = self.target.layout
        return to_pil(self.family.decode_images(self.decoder, tokens.to(self.device), L.height, L.width))


def _rule_needs(method) -> frozenset[str]:
    """The tables the method's acceptance rule declares it needs (``AcceptanceRule.needs``): the text
    pipelines load their VQ codebook only for a rule that needs it."""
    return frozenset() if method.acceptance is None else method.acceptance.needs


def prefix_width(rows, model) -> int:
    """Prefix tokens a call's rows take in the cache: the widest prompt or caption, else (class ids)
    the model's fixed prefix."""
    if isinstance(rows, Prompts):
        return int(rows.ids.shape[1])
    if isinstance(rows, Captions):
        return int(rows.embeddings.shape[1])
    return int(model.max_prefix)
