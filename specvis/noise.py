"""Keyed noise: Exp(1) draws that are a pure function of (image seed, stream position, code).

``exponentials(seeds, positions, V)`` returns E[b, j, v] = F(seeds[b], positions[b, j], v), a counter-based
draw (no generator, no shared stream): the same (seed, position) gives the same vector whatever the
batch, the row, the neighbours, the round or the method that asks. Under ``Sampling(noise="keyed")``
every token is the winner of the exponential race argmax_v p_m(v) / E(s, m, v) (Gumbel-max with
g = -log E), whose law is p_m exactly because E(s, m, .) is independent of everything p_m depends on
(the prefix is a function of E(s, <m, .) only). A lossless method verifying by ``accept.Coupled``
then commits AR's token at every position: the picture is a function of the seed.

The hash: SplitMix64's finaliser mix64 (x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27;
x *= 0x94d049bb133111eb; x ^= x >> 31), a bijection of 64-bit words, on int64 tensors: products wrap
modulo 2^64 (the bits of unsigned arithmetic) and each right shift is masked to be logical. The key of
(s, m) is mix64(mix64(s + G) + (m + 1) P); code v's word is mix64(key + (v + 1) G), G the golden-ratio
increment and P another odd constant, i.e. the SplitMix64 stream started at the key, whose outputs pass BigCrush. Its top 53 bits k
give U = k 2^-53 on the float64 grid of ``sampling.exponential``; E = -log1p(-U) clamped to >= 1e-30, so
the race has the same resolution ((V + 3) 2^-53 per draw, ``sampling.exponential``). Torch tensor ops only,
vectorised over rows, positions and codes, no host synchronisation: it runs inside captured CUDA graphs,
and costs about what ``torch.rand`` and the log of the same shape cost.
"""

from __future__ import annotations

import torch

from .checks import SEED_LIMIT


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with its bits."""
    return c - 2**64 if c >= 2**63 else c


_M1, _M2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)  # SplitMix64's multipliers
GOLDEN = _signed(0x9E3779B97F4A7C15)  # 2^64 / phi, SplitMix64's increment: spaces the codes' words
_POSITION = _signed(0xD1B54A32D192ED03)  # another odd constant: spaces the positions' keys


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser of int64 words (any shape), a bijection of 64-bit words; ``x`` is overwritten."""
    t = x >> 30
    t &= (1 << 34) - 1
    x ^= t
    x *= _M1
    t = x >> 27
    t &= (1 << 37) - 1
    x ^= t
    x *= _M2
    t = x >> 31
    t &= (1 << 33) - 1
    x ^= t
    return x


def seed_tensor(seeds: list[int] | range, device: torch.device | str) -> torch.Tensor:
    """Seeds 0 .. 2^64 - 1 as int64 (two's complement: seeds >= 2^63 are stored negative, their bits kept)."""
    out = []
    for s in seeds:
        if not 0 <= int(s) < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {int(s)}")
        out.append(int(s) - SEED_LIMIT if int(s) >= 2**63 else int(s))
    return torch.tensor(out, dtype=torch.int64, device=device)


def image_seeds(seed: int, count: int) -> list[int]:
    """The seeds of a call's ``count`` images: image k has ``seed + k``; refused where that passes 2^64 - 1."""
    if seed + count - 1 >= SEED_LIMIT:
        raise ValueError(f"seed {seed}: image k of a call uses seed + k, and image {count - 1} would pass 2**64-1; "
                         f"give a seed <= {SEED_LIMIT - count}")
    return [seed + k for k in range(count)]


def keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The 64-bit key (B, n) of each (seed row, stream position): mix64(mix64(s + G) + (m + 1) P)."""
    k = mix64(seeds + GOLDEN)
    return mix64(k[:, None] + (positions + 1) * _POSITION)


_CODE_WORDS: dict[tuple[int, str], torch.Tensor] = {}


def _code_words(V: int, device: torch.device) -> torch.Tensor:
    """(v + 1) G for v < V (int64, wrapping), computed once per (V, device)."""
    key = (V, str(device))
    if key not in _CODE_WORDS:
        _CODE_WORDS[key] = torch.arange(1, V + 1, dtype=torch.int64, device=device) * GOLDEN
    return _CODE_WORDS[key]


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, V: int) -> torch.Tensor:
    """U[0, 1) float64 draws (B, n, V) on the 2^-53 grid, a function of (seeds[b], positions[b, j], v)."""
    x = mix64(keys(seeds, positions)[..., None] + _code_words(V, seeds.device))
    x >>= 11
    x &= (1 << 53) - 1
    return x.double().mul_(2.0**-53)


def exponentials(seeds: torch.Tensor, positions: torch.Tensor, V: int) -> torch.Tensor:
    """Exp(1) draws (B, n, V) float64 for seeds (B,) int64 and stream positions (B, n): E = -log1p(-U),
    at most 36.8, clamped to >= 1e-30 (a zero-probability code never wins a race by 0 / 0)."""
    return uniforms(seeds, positions, V).neg_().log1p_().neg_().clamp_min_(1e-30)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_v probs(v) / E(v) over the last dimension (ties: lowest index): a draw from probs."""
    return torch.argmax(probs / noise, dim=-1)
