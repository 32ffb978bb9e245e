"""Pipelines: a target model, its tokenizer and optional draft/drafter, from classes to images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import checks
from .families import prompts as text_prompts
from .families.base import Conditioning, Request, Tokens
from .generate import Generation
from .memory import MemoryPlan
from .models.base import Condition
from .models.loading import check_mapped_files
from .registry import method_argument
from .sampling import Sampling, sampling_argument


def call_sampling(pipe: Pipeline, sampling=None) -> Sampling:
    """A call's sampling as it runs: None is the model's (``pipe.default_sampling``), a dict sets those
    fields of it, and a noise left None becomes the model's default (``Sampling.resolved``: keyed for
    discrete-token models, stream for continuous-token and MAR ones)."""
    return sampling_argument(sampling, pipe.default_sampling).resolved(pipe.tokens == "discrete")


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
        configures its models (``Family.configure``: ``families.kv_cache.configure_models``, MAR its own)."""
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
        method, sampling = method_argument(method), call_sampling(self, sampling)
        if prompt_tokens is not None:
            prompt_tokens = checks.integer(prompt_tokens, "prompt_tokens", low=1, high=checks.MAX_SIZE)
        return self.family.memory(self, batch_size, method, sampling, prompt_tokens, refill=bool(refill))

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
        done after each round. Each argument is checked once, here or by the family, before any forward
        (the run below checks none again: ``generate.generate_checked``), and the weights files still
        mapped into the models are checked unchanged (``models.loading.check_mapped_files``); the family
        builds the condition, the memory plan is checked, the family runs and decodes."""
        check_mapped_files()  # a weights file rewritten under the loaded model: one line, not changed weights or SIGBUS
        progress = checks.progress(progress)
        if batch_size is not None:
            batch_size = checks.integer(batch_size, "batch_size", low=1)
        request = Request(classes, prompts, negative_prompts, height, width, positive_suffix, num_iter, cfg_schedule,
                          batch_size)
        self.family.check_request(self, request)
        method, sampling, seed = method_argument(method), call_sampling(self, sampling), checks.seed(seed)
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

    @torch.no_grad()
    def images_of(self, out: Generation):
        """PIL images of a ``Generation`` of this pipeline."""
        return self.family.images_of(self, out)

    # ------------------------------------------------------------ prompts (text- and caption-conditioned families)
    @property
    def grid(self) -> tuple[int, int]:
        """The checkpoint's native grid (rows, columns) in image tokens: what height/width default to."""
        return tuple(self.extras["grid"])

    @property
    def processor(self):
        """The family's prompt processor (``Family.processor``: the checkpoint's transformers processor,
        or LlamaGen t2i's flan-t5 encoder), loaded on first use."""
        if self._processor is None:
            self._processor = self.family.processor(self.directory, self.target, self.device, self.dtype)
        return self._processor

    def set_grid(self, height: int | None, width: int | None) -> tuple[int, int]:
        """Generate ``height x width`` image tokens (None: the native grid's) with the target and draft
        (``Family.set_grid``: a family with a fixed grid takes its own only)."""
        return self.family.set_grid(self, height, width)

    def prompt_class(self, prompt) -> int:
        """The class a prompt asks for (``families.prompts.prompt_class``), -1 when it names none."""
        return text_prompts.prompt_class(self, prompt)

    def with_positive_suffix(self, prompts, on: bool):
        """The text prompts with the family's official positive suffix appended when ``on``
        (``families.prompts.with_positive_suffix``)."""
        return text_prompts.with_positive_suffix(self.family, prompts, on)

    def prefix(self, prompts, what: str = "prompts", height: int | None = None, width: int | None = None):
        """The conditional prefix rows of prompts on the pipeline's device (``families.prompts.prefix``)."""
        return text_prompts.prefix(self, prompts, what, height, width)

    def conditions(self, prompts, negative_prompts, sampling: Sampling, height: int | None, width: int | None,
                   positive_suffix: bool = True) -> Condition:
        """A call's conditional rows and their CFG rows on the grid it asks for (``families.prompts.conditions``)."""
        return text_prompts.conditions(self, prompts, negative_prompts, sampling, height, width, positive_suffix)
