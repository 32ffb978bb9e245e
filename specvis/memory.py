"""Memory planned before work: what a call needs against what the device has, before any forward.

A call of B samples decodes R = B x (2 with CFG) rows. Each cached model it runs (the target; the
draft model and EAGLE head when the pipeline holds them: counted whether or not the method uses
them) allocates a KV cache of ``CacheGeometry.nbytes``:

    layers x 2 x kv heads x head dim x (prompt + image stream + the method's slots) x R x dtype size

with the method's slots its ``pad`` (SJD/Jacobi: window + 2, speculative: gamma + 2, trees: total
tokens + 2) and the dtype the cache is stored in (``models.base.storage_dtype``: fp32 on CPU for a
bf16 model). Besides the caches a round holds laws and activations; ``LAW_COPIES`` fp32 laws of
R x (slots + 1) x V and one forward's activations, R x max(prompt, slots + 1) x (3 x FFN + V) x 4
bytes, are planned for them: an estimate, stated as one. On CPU, linear layers packed for oneDNN
(``models.weight_layout.PackedLinear``) whose packed copy is not made yet add their weights' bytes.

The weights are already resident when a pipeline plans (``weights_bytes`` reports them); the call
fits when the rest fits in what is free now: CUDA's free memory plus what torch's allocator holds
unused, or the CPU's available RAM (``MemAvailable``). ``max_batch_size`` is the largest B that
fits, the bytes being linear in B.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models.weight_layout import PackedLinear, available_memory_bytes

LAW_COPIES = 8
"""fp32 tensors of rows x (slots + 1) x V a round holds at once (logits, CFG halves, laws, drafts'
laws, residuals, noise): an estimate for the plan, not a measurement of a particular method."""
DEFAULT_PROMPT_TOKENS = 128
"""Prompt tokens planned for when ``Pipeline.memory`` is given none (a call plans with its own)."""
GIB = 2 ** 30


def free_bytes(device: torch.device | str) -> int | None:
    """Bytes a new allocation can take on ``device`` now: CUDA's free memory plus what torch's caching
    allocator reserves but does not use; on the CPU ``MemAvailable``; None where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu":
        return available_memory_bytes()
    return None


def tensor_bytes(*modules) -> int:
    """Bytes of the parameters and buffers of ``modules`` (each tensor once)."""
    seen, total = set(), 0
    for m in modules:
        if not isinstance(m, torch.nn.Module):
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            key = (t.data_ptr(), t.device)
            if key not in seen and not t.is_meta:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def packing_bytes(*modules) -> int:
    """Bytes of the packed weight copies still to be made (``PackedLinear`` layers not yet called)."""
    layers = {id(s): s for m in modules if isinstance(m, torch.nn.Module) for s in m.modules()
              if isinstance(s, PackedLinear) and not s.is_packed}
    return sum(s.weight.numel() * s.weight.element_size() for s in layers.values())


@dataclass(frozen=True)
class MemoryPlan:
    """What a call of ``batch_size`` samples needs (bytes) and what ``device`` has free."""

    device: str
    batch_size: int
    rows: int  # cache rows: batch_size x (2 with CFG)
    slots: int  # the target's cache slots per row: prompt + image stream + the method's slots
    weights_bytes: int  # resident now: the pipeline's parameters and buffers
    kv_bytes: int  # the KV caches of the target (and of the draft model and EAGLE head, when held)
    other_bytes: int  # laws and activations (an estimate) + packed weight copies still to be made
    free_bytes: int | None  # free now (None: unknown, and the plan is not enforced)
    per_sample_bytes: int  # kv + laws and activations of one sample
    fixed_bytes: int  # what does not grow with the batch (packed copies to come)

    @property
    def needed_bytes(self) -> int:
        """What the call allocates on top of the resident weights."""
        return self.kv_bytes + self.other_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.needed_bytes <= self.free_bytes

    @property
    def max_batch_size(self) -> int | None:
        """The largest batch whose needs fit what is free (None when the free memory is unknown)."""
        if self.free_bytes is None:
            return None
        return max(0, (self.free_bytes - self.fixed_bytes) // max(self.per_sample_bytes, 1))

    def line(self) -> str:
        """The one line a call that does not fit stops with."""
        return (f"not enough memory: a batch of {self.batch_size} needs {self.needed_bytes} bytes ({self.needed_bytes / GIB:.2f} GiB: KV cache "
                f"{self.kv_bytes / GIB:.2f} GiB + laws and activations {self.other_bytes / GIB:.2f} GiB) but {self.device} "
                f"has {self.free_bytes} bytes ({(self.free_bytes or 0) / GIB:.2f} GiB) free; the largest batch that fits "
                f"is {self.max_batch_size}")

    def describe(self) -> str:
        """The plan in a few lines (``specvis generate -v``)."""
        free = "unknown" if self.free_bytes is None else f"{self.free_bytes / GIB:.2f} GiB"
        return (f"memory plan on {self.device}: weights {self.weights_bytes / GIB:.2f} GiB (resident); batch "
                f"{self.batch_size} = {self.rows} cache rows x {self.slots} slots: KV cache {self.kv_bytes / GIB:.2f} GiB, "
                f"laws and activations {self.other_bytes / GIB:.2f} GiB (estimate); free {free}; "
                f"{'fits' if self.fits else 'does not fit'}, largest batch {self.max_batch_size}")


class MemoryPlanError(ValueError):
    """A call whose plan does not fit; raised before any forward (``MemoryPlan.line``)."""


def plan(target, draft=None, drafter=None, others=(), *, batch_size: int, cfg: bool, prefix: int,
         method_slots: int, method_bytes: int = 0, refill: bool = False, device: torch.device | str | None = None,
         free: int | None = None) -> MemoryPlan:
    """The ``MemoryPlan`` of a call (module docstring): ``target`` (and ``draft``, ``drafter``) are the
    cached models, ``others`` further resident modules (tokenizer, VQ), ``prefix`` the longest
    prompt in tokens, ``method_slots`` the method's scratch slots (its ``pad``), ``method_bytes`` what
    else the method allocates per cache row (``scratch_bytes``: PJD's drafts and their laws).
    ``refill``: continuous batching (fewer rows than samples): a wave of as many samples' prefixes is
    prefilled apart from the running cache, in a cache of their prefix slots, and copied out
    (``CachedStack.prefill_prefixes``): twice the target's prefix-only cache of the rows."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    p = next(target.parameters())
    device = torch.device(device) if device is not None else p.device
    rows_per_sample = 2 if cfg else 1

    def kv(rows: int) -> int:
        total = 0
        for model in (target, draft, drafter):
            if model is not None:
                q = next(model.parameters())
                total += model.cache_geometry(rows, prefix, method_slots).nbytes(q.dtype, q.device)
        if refill:  # the wave's prefix-only cache and its copy (the target alone refills)
            q = next(target.parameters())
            total += 2 * target.cache_geometry(rows, prefix, -target.layout.stream_len).nbytes(q.dtype, q.device)
        return total

    V, ffn = target.layout.law_size, target.config.ffn_hidden
    per_row_other = 4 * ((method_slots + 1) * V * LAW_COPIES + max(prefix, method_slots + 1) * (3 * ffn + V)) + method_bytes
    per_sample = rows_per_sample * (kv(1) + per_row_other)
    fixed = packing_bytes(target, draft, drafter)
    rows = rows_per_sample * batch_size
    return MemoryPlan(
        device=str(device), batch_size=batch_size, rows=rows,
        slots=target.cache_geometry(rows, prefix, method_slots).slots,
        weights_bytes=tensor_bytes(target, draft, drafter, *others), kv_bytes=kv(rows),
        other_bytes=rows * per_row_other + fixed, free_bytes=free_bytes(device) if free is None else free,
        per_sample_bytes=per_sample, fixed_bytes=fixed)
