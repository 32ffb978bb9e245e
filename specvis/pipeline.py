"""Pipelines: a target model, its tokenizer and optional draft/drafter, from classes to images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .generate import Generation, generate
from .sampling import Sampling
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


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class Pipeline:
    """``pipe(classes, method, sampling, seed)`` -> ``Generation`` with decoded images. ``continuous``:
    the bundle's continuous-token pipeline (``ContinuousPipeline``), where it ships one."""

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

    @property
    def dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def configure(self, dtype: str | torch.dtype | None = None, compile: bool = False,
                  graphs: bool | None = None) -> "Pipeline":
        """Weights and KV caches of the target, draft and drafter in ``dtype`` (fp32, bf16, fp16; the
        tokenizer stays fp32; laws are computed in fp32 either way), ``torch.compile`` of their cached
        block stacks, and captured rounds on or off. Lossless methods stay exact for the model as
        run: a bf16 model samples bf16 logits."""
        if dtype is not None:
            dt = resolve_dtype(dtype)
            for m in (self.target, self.draft, self.drafter):
                if m is not None:
                    m.to(dtype=dt)
        if compile and not self.compiled:
            for m in (self.target, self.draft):
                if m is not None and hasattr(m, "compile_decoder"):
                    m.compile_decoder()
            self.compiled = True
        self.graphs = graphs
        return self

    @property
    def num_classes(self) -> int:
        return self.target.num_conditions

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
    def __call__(self, classes, method=None, sampling: Sampling | None = None, seed: int = 0,
                 decode: bool = True) -> Generation:
        conditions = torch.as_tensor(list(classes), dtype=torch.long, device=self.device)
        out = generate(self.target, conditions, method, sampling or self.default_sampling, seed,
                       draft=self.draft, drafter=self.drafter, codebook=self.codebook, graphs=self.graphs)
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

    @property
    def codebook(self) -> None:
        return None

    @torch.no_grad()
    def to_images(self, latents: torch.Tensor):
        return to_pil(self.tokenizer.decode_continuous(latents))

    def images_of(self, out: Generation):
        return self.to_images(out.latents)
