"""Weight-only int8 (``sv.load(..., quantize="int8")``, ``--quantize int8``): the linear layers of the
transformer blocks of the target and the draft model hold int8 weights with one scale per output
row; activations, embeddings, norms, heads and the KV cache stay in the model's dtype.

Row r of a weight W is stored as q_r = round(W_r / s_r) clipped to [-127, 127], s_r = max|W_r| / 127
(symmetric, per output channel); the layer computes y = x (q s)^T (+ bias). The quantized model is
a model of its own: every method stays exact with respect to it (its laws are computed from the
same int8 layers whatever the block size: each row of a product depends on its own input row only).

Kernel: torch's own ``aten._weight_int8pack_mm`` (one call, int8 weights read as they are stored).
Measured on this repository's AMD EPYC (Zen 4, AVX-512 with bf16 dot products), one thread, a
11008 x 4096 product with bf16 activations over three distinct weights
(``scripts/cpu_linear_7b.py``, docs/results/data/cpu-linear-7b.json): 3.5-4.3 ms at 1-2 rows against
7.2-8.6 ms for bf16 ``F.linear`` (half the bytes to stream) and 5.8-6.7 packed, but 48.8 ms at 34
rows against 20.4 (packed 16.1); torchao 0.18's ``Int8WeightOnlyConfig`` took 55-56 ms at 1-2 rows,
69.5 at 34 and 82.6 at 66 (torch's: 95.6), and dequantising to bf16 before ``F.linear`` 112-140
ms: torch's kernel is used. Devices without that kernel (checked once per device type)
dequantise per call."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZE = ("int8",)
BF16_K_MULTIPLE = 16
"""torch 2.13's CPU ``_weight_int8pack_mm`` with bf16 activations crashes (segmentation fault) when the
input width is not a multiple of 16 (widths 8, 24, 40, 56, 72 crashed; 16, 32, 48, 64, 80 ran; fp32
and fp16 ran at every width tried): such layers dequantise per call. Real widths are multiples of 16."""


def check_quantize(quantize: str | None) -> str | None:
    """``quantize`` as given (None or one of ``QUANTIZE``), or a one-line ValueError."""
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)} (or None), got {quantize!r}")
    return quantize


ROW_BLOCK = 256  # rows quantized at a time: a block stays in cache (4x faster than whole-tensor passes)


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (N, K), scales float32 (N,)) of a weight (N, K): module docstring (a zero row: scale 1).
    Computed ``ROW_BLOCK`` rows at a time in float32, in place."""
    N = w.shape[0]
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(N, dtype=torch.float32, device=w.device)
    for i in range(0, N, ROW_BLOCK):
        wf = w[i: i + ROW_BLOCK].detach().to(torch.float32, copy=True)  # (in place below: never the caller's)
        s = wf.abs().amax(dim=1).div_(127.0)
        s = torch.where(s > 0, s, torch.ones_like(s))
        q[i: i + ROW_BLOCK] = wf.div_(s[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        scale[i: i + ROW_BLOCK] = s
    return q, scale


@functools.cache
def _kernel_works(device_type: str) -> bool:
    """Whether ``aten._weight_int8pack_mm`` runs on this device type (this torch build)."""
    try:
        dev = torch.device(device_type)
        x = torch.ones(1, 8, device=dev)
        y = torch.ops.aten._weight_int8pack_mm(x, torch.ones(8, 8, dtype=torch.int8, device=dev), torch.ones(8, device=dev))
        return bool(torch.all(y == 8))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


class Int8Linear(nn.Module):
    """``nn.Linear``'s interface with an int8 weight (``weight_int8``) and per-row ``weight_scale``
    buffers; the bias, if any, stays a parameter in the activations' dtype."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("weight_scale", scale.float())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear) -> "Int8Linear":
        q, s = int8_rows(linear.weight)
        return cls(q, s, linear.bias)

    def _apply(self, fn, recurse: bool = True):
        """Moves follow the device; casts leave the int8 weight and its fp32 scales alone."""
        q, s = self.weight_int8, self.weight_scale
        super()._apply(fn, recurse)
        self._buffers["weight_int8"] = q.to(self._buffers["weight_int8"].device)
        self._buffers["weight_scale"] = s.to(self._buffers["weight_scale"].device)
        return self

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight the layer computes with, q s, in ``dtype``."""
        return (self.weight_int8.float() * self.weight_scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if _kernel_works(x.device.type) and (x.dtype != torch.bfloat16 or self.in_features % BF16_K_MULTIPLE == 0):
            y = torch.ops.aten._weight_int8pack_mm(rows.contiguous(), self.weight_int8, self.weight_scale.to(x.dtype))
        else:
            y = F.linear(rows, self.dequantized(x.dtype))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight, bias={self.bias is not None}"


def quantizable(name: str) -> bool:
    """The linear layers quantized: those of the transformer blocks (``layers.N.``)."""
    return name.startswith("layers.")


def quantize_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` (``PackedLinear`` included) of ``model``'s blocks by an
    ``Int8Linear`` in place, one layer at a time (each float weight is freed as its int8 copy is
    made); returns how many were replaced."""
    done = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and quantizable(name):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, Int8Linear.of(module))
            done += 1
    return done


def streaming_quantizer(model: nn.Module):
    """A ``finish`` hook for ``models.loading.stream_into``: as the weight of a bias-free block
    linear is complete, the layer becomes an ``Int8Linear`` and the float weight is dropped (True:
    the loader frees it), so a quantized load never holds the model in its float dtype. Layers with
    a bias are left to ``quantize_linears`` after the load."""
    def finish(name: str, tensor: torch.Tensor) -> bool:
        owner, _, leaf = name.rpartition(".")
        if leaf != "weight" or not quantizable(owner):
            return False
        module = model.get_submodule(owner)
        if not isinstance(module, nn.Linear) or module.bias is not None:
            return False
        q, s = int8_rows(tensor)
        parent, _, child = owner.rpartition(".")
        setattr(model.get_submodule(parent), child, Int8Linear(q, s))
        return True

    return finish
