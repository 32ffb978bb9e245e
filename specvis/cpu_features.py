"""What this CPU computes natively, read from the kernel's /proc/cpuinfo (Linux; elsewhere unknown).

bf16 and fp16 matmuls on a CPU without dot products of that type are emulated: on an AMD EPYC
without AVX512 (AVX2 only) the emoji target's bf16 forward measured 3.5x (one token) to 25x (33
tokens) slower than fp32 (docs/results/archive/bf16-cpu-avx2.md); fp16 about as slow in a one-off check.
"""

from __future__ import annotations

import functools
import platform

import torch

# cpuinfo flags that give a dtype's dot products: x86 ("flags") and Arm ("Features") spellings
NATIVE_FLAGS: dict[torch.dtype, frozenset[str]] = {
    torch.bfloat16: frozenset({"avx512_bf16", "amx_bf16", "bf16"}),
    torch.float16: frozenset({"avx512_fp16", "amx_fp16", "asimdhp"}),
}


def _first(keys: tuple[str, ...]) -> str | None:
    """The value of the first /proc/cpuinfo line whose key is one of ``keys`` (None if none, or unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The first processor's feature flags (x86 "flags", Arm "Features"), or None where unknown."""
    flags = _first(("flags", "Features"))
    return None if flags is None else frozenset(flags.split())


def cpu_name() -> str:
    """The processor's model name and, on x86, its family and model numbers (``AMD EPYC (family 26
    model 2)``: a hypervisor can name Zen 4 and Zen 5 alike, and their AVX-512 units differ in width);
    ``platform.machine()`` where /proc/cpuinfo has no name."""
    name = _first(("model name",)) or platform.machine()
    family, model = _first(("cpu family",)), _first(("model",))
    return f"{name} (family {family} model {model})" if family and model else name


def native_dot_products(dtype: torch.dtype) -> bool | None:
    """Whether this CPU has dot products in ``dtype`` (fp32: always); None when it cannot be told."""
    if dtype not in NATIVE_FLAGS:
        return True
    flags = cpu_flags()
    return None if flags is None else bool(flags & NATIVE_FLAGS[dtype])


def cpu_description() -> str:
    """``AMD EPYC, AVX2``: the model name, torch's vector instruction level and, where present, bf16
    dot products; what a benchmark report records (and compares before reusing a cost curve)."""
    parts = [cpu_name(), torch.backends.cpu.get_cpu_capability()]
    if native_dot_products(torch.bfloat16):
        parts.append("bf16 dot products")
    return ", ".join(parts)
