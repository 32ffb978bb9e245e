"""Pipelines: a target model, its tokenizer and optional draft/drafter, from classes to images."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from . import checks
from .cpu_features import NATIVE_FLAGS, native_dot_products
from .generate import Generation, fit_to_stream
from .memory import DEFAULT_PROMPT_TOKENS, MemoryPlan, MemoryPlanError, plan
from .models.base import Captions, Condition, Prompts
from .models.decoder import CachedStack
from .models.loading import check_mapped_files
from .options import Options
from .models.weight_layout import prepare_cpu_linears
from .registry import method_argument
from .sampling import Sampling, sampling_argument
from .tune import run


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


def call_sampling(pipe: Pipeline, sampling=None) -> Sampling:
    """A call's sampling as it runs: None is the model's (``pipe.default_sampling``), a dict sets those
    fields of it, and a noise left None becomes the model's default (``Sampling.resolved``: keyed for
    discrete-token models, stream for continuous-token and MAR ones)."""
    return sampling_argument(sampling, pipe.default_sampling).resolved(pipe.tokens == "discrete")


def call_arguments(pipe: Pipeline, method, sampling, seed) -> tuple[Any, Sampling, int]:
    """A pipeline call's ``method`` (None: AR; a name or bench spec string: that method), ``sampling``
    (``call_sampling``) and ``seed``, checked before anything runs."""
    return method_argument(method), call_sampling(pipe, sampling), checks.seed(seed)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {dtype!r}")
    return DTYPES[dtype]


Conditioning = Literal["class", "text", "caption"]
Tokens = Literal["discrete", "continuous"]


@dataclass(frozen=True)
class Request:
    """A pipeline call's conditioning arguments as given: what the model's family reads (class ids, or
    prompts, negative prompts, grid and positive suffix) and the sampler options of an ordered model
    (MAR's ``num_iter``, ``cfg_schedule``)."""

    classes: Any = None
    prompts: Any = None
    negative_prompts: Any = None
    height: int | None = None
    width: int | None = None
    positive_suffix: bool = True
    num_iter: int | None = None
    cfg_schedule: str | None = None
    batch_size: int | None = None  # continuous batching: samples decoded at once (``generate(batch_size=)``)


@dataclass
class Pipeline:
    """``pipe(classes=... | prompts=..., method, sampling, seed)`` -> ``Generation`` with decoded images.
    One class for every model: what differs between class-conditional, text- or caption-conditioned,
    continuous-token and MAR models is the model's ``family`` (``families.base.Family``: the checkpoint
    families, ``families.embedded`` for the embedded bundles): how a call's arguments become a
    ``Condition``, which codebook a rule gets, what runs (MAR: its ordered sampler), how a ``Generation``
    becomes images and what the memory plan counts. ``continuous``: the bundle's continuous-token
    pipeline, where it ships one.

    What the model can do is declared, for callers (the CLI, the demo, the bench) to ask: ``conditioning``
    ("class": ``pipe(classes=...)``; "text": prompts through the checkpoint's processor; "caption":
    prompts through a separate text encoder), ``tokens`` ("discrete" codes in ``out.tokens``;
    "continuous" latents in ``out.latents``), ``kv_cache`` (decodes with a KV cache: ``memory`` plans
    apply) and ``num_iter`` (sampler steps of a model that reveals its tokens in its own order, MAR;
    None: one stream position per step)."""

    name: str
    target: torch.nn.Module
    tokenizer: Any  # the image decoder given (bundles' VQ or palette, MAR's VAE); None: the family's, loaded on use
    draft: torch.nn.Module | None = None
    drafter: torch.nn.Module | None = None
    class_names: list[str] = field(default_factory=list)
    default_sampling: Sampling = field(default_factory=Sampling)
    extras: dict[str, Any] = field(default_factory=dict)
    continuous: "Pipeline | None" = None
    graphs: bool | None = None  # captured CUDA-graph rounds; None: on for CUDA (specvis.generate)
    compiled: bool = False
    num_iter: int | None = None
    cfg_schedule: str = "linear"  # an ordered sampler's CFG schedule (MAR)
    directory: Any = None  # the checkpoint directory its family loads the processor and image decoder from
    vq: Any = None  # the family's image decoder, loaded on first decode (or for a LANTERN codebook)
    _processor: Any = None
    family: Any = field(kw_only=True)  # the model's ``families.base.Family``

    # ------------------------------------------------------------ what the model can do (its family's)
    @property
    def conditioning(self) -> Conditioning:
        return self.family.conditioning

    @property
    def tokens(self) -> Tokens:
        return self.family.tokens

    @property
    def kv_cache(self) -> bool:
        return self.family.kv_cache

    @property
    def decodes(self) -> bool:
        """Whether the pipeline renders images (``Family.decodes``): the bench's quality metrics ask."""
        return self.family.decodes

    @property
    def num_classes(self) -> int:
        """Classes 0 .. num_classes - 1 of ``pipe(classes=...)``; 0 for prompt-conditioned models."""
        return self.family.num_classes(self)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def configure(self, dtype: str | torch.dtype | None = None, compile: bool | str = False,
                  graphs: bool | None = None) -> "Pipeline":
        """Weights and KV caches in ``dtype``, ``torch.compile`` and captured rounds, as the family
        configures its models (``Family.configure``: ``configure_models`` below, MAR its own)."""
        self.family.configure(self, dtype, compile, graphs)
        return self

    def memory(self, batch_size: int = 1, method=None, sampling: Sampling | None = None,
               prompt_tokens: int | None = None, refill: bool = False) -> MemoryPlan:
        """The memory a call of ``batch_size`` samples with ``method`` (None: AR) and ``sampling``
        (None: the pipeline's default; CFG doubles the rows) needs, against what the device has free
        now (``specvis.memory``): ``weights_bytes``, ``kv_bytes``, ``free_bytes``, ``fits``,
        ``max_batch_size``. ``prompt_tokens``: the longest prompt (default: the model's fixed prefix,
        or ``DEFAULT_PROMPT_TOKENS`` for text prompts); a call plans with its own prompts. ``refill``:
        the call has more samples than ``batch_size`` rows (continuous batching: the refills' prefix
        caches are planned too). A model
        without a KV cache (MAR) has no plan: ``Family.memory`` refuses in one line. The arguments are
        checked as a call's are (one line naming the argument)."""
        batch_size = checks.integer(batch_size, "batch_size", low=1)
        method, sampling, _ = call_arguments(self, method, sampling, 0)
        if prompt_tokens is not None:
            prompt_tokens = checks.integer(prompt_tokens, "prompt_tokens", low=1, high=checks.MAX_SIZE)
        return self.family.memory(self, batch_size, method, sampling, prompt_tokens, refill=bool(refill))

    def check_memory(self, condition: Condition, method, sampling: Sampling, refill: bool = False) -> MemoryPlan:
        """The plan of a call about to run; a ``MemoryPlanError`` (one line: bytes needed, bytes free,
        the largest batch that fits) when it does not fit. Runs before any forward."""
        widths = [prefix_width(c, self.target) for c in (condition.cond, condition.uncond) if c is not None]
        p = self.memory(condition.batch, method, sampling, prompt_tokens=max(widths), refill=refill)
        if not p.fits:
            raise MemoryPlanError(p.line())
        return p

    def to(self, device: str | torch.device) -> "Pipeline":
        for m in (self.target, self.tokenizer, self.draft, self.drafter, self.vq):
            if m is not None:
                m.to(device)
        if self.continuous is not None:
            self.continuous.to(device)
        return self

    # ------------------------------------------------------------ a call
    @torch.no_grad()
    def __call__(self, classes=None, method=None, sampling: Sampling | None = None, seed: int = 0,
                 decode: bool = True, *, prompts=None, negative_prompts=None, height: int | None = None,
                 width: int | None = None, progress=None, positive_suffix: bool = True,
                 num_iter: int | None = None, cfg_schedule: str | None = None,
                 batch_size: int | None = None) -> Generation:
        """``classes`` (class-conditional models) or ``prompts`` (+ ``negative_prompts``, ``height``/
        ``width`` in image tokens; text- and caption-conditioned ones); ``positive_suffix``: append the
        family's official positive suffix to each text prompt, as its official scripts do (Emu3:
        ``POSITIVE_SUFFIX``; the other families have none), False turns it off; ``num_iter``,
        ``cfg_schedule``: the sampler of an ordered model (MAR); ``batch_size``: decode at most this many
        images at once, a finished one's row taking the next (continuous batching, ``generate``);
        ``progress``: True shows a bar on stderr (images, tokens/s, ETA), a callable gets the fraction
        done after each round. Each argument is checked before any forward, and the weights files still
        mapped into the models are checked unchanged (``models.loading.check_mapped_files``); the family
        builds the condition, the memory plan is checked, the family runs and decodes."""
        check_mapped_files()  # a weights file rewritten under the loaded model: one line, not changed weights or SIGBUS
        progress = checks.progress(progress)
        if batch_size is not None:
            batch_size = checks.integer(batch_size, "batch_size", low=1)
        request = Request(classes, prompts, negative_prompts, height, width, positive_suffix, num_iter, cfg_schedule,
                          batch_size)
        self.family.check_request(self, request)
        method, sampling, seed = call_arguments(self, method, sampling, seed)
        self.family.check_method(self, method, sampling)
        condition = self.family.condition(self, request, sampling)
        refill = batch_size is not None and batch_size < condition.batch
        self.family.check_memory(self, condition[:batch_size] if refill else condition, method, sampling, refill=refill)
        out = self.family.run(self, condition, request, method, sampling, seed, progress)
        if decode:
            out.images = self.images_of(out)
        return out

    # ------------------------------------------------------------ images
    @property
    def decoder(self):
        """The image decoder (``Family.decoder``: the one given as ``tokenizer``, or the checkpoint's VQ
        loaded on first use, on the pipeline's device)."""
        return self.family.decoder(self)

    @property
    def vae(self):
        """MAR's name for its image decoder (``decode(latents (B, E, h, w))``): ``decoder``."""
        return self.decoder

    @property
    def codebook(self) -> torch.Tensor | None:
        """The code vectors of a discrete-token model's image decoder (``Family.codebook``); None for continuous tokens."""
        return self.family.codebook(self)

    @torch.no_grad()
    def to_images(self, tokens: torch.Tensor):
        """PIL images of generated tokens: codes (B, H*W) on the grid last generated, or latents."""
        return self.family.to_images(self, tokens)

    def images_of(self, out: Generation):
        """PIL images of a ``Generation`` of this pipeline."""
        return self.family.images_of(self, out)

    # ------------------------------------------------------------ prompts (text- and caption-conditioned families)
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

    @property
    def processor(self):
        """The family's prompt processor (``Family.processor``: the checkpoint's transformers processor,
        or LlamaGen t2i's flan-t5 encoder), loaded on first use."""
        if self._processor is None:
            self._processor = self.family.processor(self.directory, self.target, self.device, self.dtype)
        return self._processor

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
        """Generate ``height x width`` image tokens (None: the native grid's) with the target and draft
        (``Family.set_grid``: a family with a fixed grid takes its own only)."""
        return self.family.set_grid(self, height, width)

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


# Other names of the one pipeline class, for callers that name it by the kind of model (its family differs).
TextPipeline = ContinuousPipeline = Pipeline


def configure_models(pipe: Pipeline, dtype: str | torch.dtype | None = None, compile: bool | str = False,
                     graphs: bool | None = None) -> None:
    """``Pipeline.configure`` of a KV-cached model (``Family.configure``): weights and KV caches of the
    target, draft and drafter in ``dtype`` (fp32, bf16, fp16; the tokenizer, RoPE tables and, on CPU,
    the KV caches stay fp32: ``models.base.storage_dtype``; laws are computed in fp32 either way),
    ``torch.compile`` of their cached block stacks, and captured rounds on or off. Lossless methods stay
    exact for the model as run: a bf16 model samples its bf16 logits, which depend at rounding level on
    the block a forward computes them in (docs/results/archive/bf16-cpu.md).

    ``compile=True`` compiles on CUDA only: on CPU the compiled forward was measured slower
    (docs/results/archive/compile-cpu.md: inductor re-materialises the whole in-place KV cache on every
    call), so it warns and stays eager; ``compile="always"`` compiles on any device. On CPU the
    linear layers run the fastest kernel for their row count (``models.weight_layout``: weights
    transposed for MKL's small calls, packed for oneDNN's wide ones; same values)."""
    if compile not in (False, True, "always"):
        raise ValueError(f"compile must be False, True or 'always', got {compile!r}")
    if dtype is not None:
        dt = resolve_dtype(dtype)
        for m in (pipe.target, pipe.draft, pipe.drafter):
            if m is not None:
                m.to(dtype=dt)
        if pipe.device.type == "cpu" and native_dot_products(dt) is False:
            warnings.warn(f"this CPU has no {str(dt).removeprefix('torch.')} dot products (none of the cpuinfo "
                          f"flags {', '.join(sorted(NATIVE_FLAGS[dt]))}): its matmuls are emulated, measured "
                          "3.5-25x slower than fp32 (docs/results/archive/bf16-cpu-avx2.md); use fp32", stacklevel=4)
    if compile is True and pipe.device.type == "cpu":
        warnings.warn("torch.compile skipped on CPU, where it measured slower than eager "
                      "(docs/results/archive/compile-cpu.md); compile='always' forces it", stacklevel=4)
    elif compile and not pipe.compiled:
        for m in (pipe.target, pipe.draft):
            if isinstance(m, CachedStack):  # the cached block stacks compile (models.decoder)
                m.compile_decoder()
        pipe.compiled = True
    if pipe.device.type == "cpu":  # faster matmuls (models/weight_layout.py)
        prepare_cpu_linears(*(m for m in (pipe.target, pipe.draft, pipe.drafter, pipe.continuous)
                              if isinstance(m, torch.nn.Module)))
    pipe.graphs = graphs


def memory_plan(pipe: Pipeline, batch_size: int = 1, method=None, sampling: Sampling | None = None,
                prompt_tokens: int | None = None, refill: bool = False) -> MemoryPlan:
    """``Pipeline.memory`` of a KV-cached model (``Family.memory``): the cached models and what else
    the family keeps resident (``Family.resident``: the tokenizer, or the loaded VQ)."""
    from .methods.ar import AR

    sampling = sampling or pipe.default_sampling
    prefix = min(pipe.target.max_prefix, DEFAULT_PROMPT_TOKENS) if prompt_tokens is None else int(prompt_tokens)
    layout = pipe.target.layout
    with warnings.catch_warnings():  # the call says what it clamps; the plan is of the clamped method
        warnings.simplefilter("ignore")
        method = fit_to_stream(AR() if method is None else method, layout.stream_len)
    return plan(pipe.target, pipe.draft, pipe.drafter, pipe.family.resident(pipe), batch_size=batch_size,
                cfg=sampling.uses_cfg, prefix=prefix, method_slots=method.pad, refill=refill,
                method_bytes=method.scratch_bytes(layout) if isinstance(method, Options) else 0)


def generate_with_kv_cache(pipe: Pipeline, rows, method, sampling: Sampling, seed: int, codebook, progress,
                           batch_size: int | None = None) -> Generation:
    """The run of a KV-cached model (``Family.run``): ``specvis.generate`` with ``sv.Auto()`` resolved
    first (``specvis.tune``), the pipeline's draft, drafter and captured-rounds setting."""
    return run(pipe.target, rows, method, sampling, seed, draft=pipe.draft, drafter=pipe.drafter, codebook=codebook,
               graphs=pipe.graphs, progress=progress, batch_size=batch_size)


def rule_needs(method) -> frozenset[str]:
    """The tables the method's acceptance rule declares it needs (``AcceptanceRule.needs``): the text
    families load their VQ codebook only for a rule that needs it."""
    return frozenset() if method.acceptance is None else method.acceptance.needs


def prefix_width(rows, model) -> int:
    """Prefix tokens a call's rows take in the cache: the widest prompt or caption, else (class ids)
    the model's fixed prefix."""
    if isinstance(rows, Prompts):
        return int(rows.ids.shape[1])
    if isinstance(rows, Captions):
        return int(rows.embeddings.shape[1])
    return int(model.max_prefix)
