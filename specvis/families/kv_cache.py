"""What a KV-cached model's family does by default (``families.base.Family``): configure the cached
models (dtype, compile, captured rounds, CPU linear layouts), plan a call's memory, and run it through
``specvis.generate`` (by way of the tuner, which resolves ``sv.Auto()``). MAR, which keeps no KV
cache, overrides each (``families.mar``)."""

from __future__ import annotations

import warnings

import torch

from ..cpu_features import NATIVE_FLAGS, native_dot_products
from ..generate import Generation, fit_to_stream
from ..memory import DEFAULT_PROMPT_TOKENS, MemoryPlan, MemoryPlanError, plan
from ..methods.ar import AR
from ..models.base import Captions, Condition, Prompts
from ..models.decoder import CachedStack
from ..models.loading import requested_dtype
from ..models.weight_layout import prepare_cpu_linears
from ..options import Options
from ..sampling import Sampling
from ..tune import run


def configure_models(pipe, dtype: str | torch.dtype | None = None, compile: bool | str = False,
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
        dt = requested_dtype(dtype)
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


def memory_plan(pipe, batch_size: int = 1, method=None, sampling: Sampling | None = None,
                prompt_tokens: int | None = None, refill: bool = False) -> MemoryPlan:
    """``Pipeline.memory`` of a KV-cached model (``Family.memory``), its arguments checked: the cached
    models and what else the family keeps resident (``Family.resident``: the tokenizer, or the loaded VQ)."""
    sampling = sampling or pipe.default_sampling
    prefix = min(pipe.target.max_prefix, DEFAULT_PROMPT_TOKENS) if prompt_tokens is None else int(prompt_tokens)
    layout = pipe.target.layout
    with warnings.catch_warnings():  # the call says what it clamps; the plan is of the clamped method
        warnings.simplefilter("ignore")
        method = fit_to_stream(AR() if method is None else method, layout.stream_len)
    return plan(pipe.target, pipe.draft, pipe.drafter, pipe.family.resident(pipe), batch_size=batch_size,
                cfg=sampling.uses_cfg, prefix=prefix, method_slots=method.pad, refill=refill,
                method_bytes=method.scratch_bytes(layout) if isinstance(method, Options) else 0)


def prefix_width(rows, model) -> int:
    """Prefix tokens a call's rows take in the cache: the widest prompt or caption, else (class ids)
    the model's fixed prefix."""
    if isinstance(rows, Prompts):
        return int(rows.ids.shape[1])
    if isinstance(rows, Captions):
        return int(rows.embeddings.shape[1])
    return int(model.max_prefix)


def condition_width(condition: Condition, model) -> int:
    """Prefix tokens a condition's rows take in the cache: the wider of its conditional and CFG rows."""
    return max(prefix_width(c, model) for c in (condition.cond, condition.uncond) if c is not None)


def check_memory(pipe, condition: Condition, method, sampling: Sampling, refill: bool = False) -> MemoryPlan:
    """The plan of a call about to run (``Family.check_memory``), with its own prompts' width; a
    ``MemoryPlanError`` (one line: bytes needed, bytes free, the largest batch that fits) when it does
    not fit. Runs before any forward."""
    p = pipe.family.memory(pipe, condition.batch, method, sampling, condition_width(condition, pipe.target), refill=refill)
    if not p.fits:
        raise MemoryPlanError(p.line())
    return p


def run_cached(pipe, rows, method, sampling: Sampling, seed: int, codebook, progress,
               batch_size: int | None = None) -> Generation:
    """The run of a KV-cached model (``Family.run``), its arguments checked by the call: ``specvis.generate``
    with ``sv.Auto()`` resolved first (``tune.run``), the pipeline's draft, drafter and captured-rounds setting."""
    return run(pipe.target, rows, method, sampling, seed, draft=pipe.draft, drafter=pipe.drafter, codebook=codebook,
               graphs=pipe.graphs, progress=progress, batch_size=batch_size)


def rule_needs(method) -> frozenset[str]:
    """The tables the method's acceptance rule declares it needs (``AcceptanceRule.needs``): the text
    families load their VQ codebook only for a rule that needs it."""
    return frozenset() if method.acceptance is None else method.acceptance.needs
