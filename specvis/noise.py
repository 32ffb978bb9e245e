"""Keyed noise: Exp(1) draws that are a pure function of (image seed, stream position, code).

``exponentials(seeds, positions, V)`` returns E[b, j, v] = F(seeds[b], positions[b, j], v), a counter-based
draw (no generator, no shared stream): the same (seed, position) gives the same vector whatever the
batch, the row, the neighbours, the round or the method that asks. Under ``Sampling(noise="keyed")``
every token is the winner of the exponential race argmax_v p_m(v) / E(s, m, v) (Gumbel-max with
g = -log E), whose law is p_m exactly because E(s, m, .) is independent of everything p_m depends on
(the prefix is a function of E(s, <m, .) only). A lossless method verifying by ``accept.Coupled``
then commits AR's token at every position: the picture is a function of the seed.

The hash: lowbias32 (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16), a
32-bit bijection with low bias, computed on int64 tensors and masked to 32 bits after each multiply
(int64 products wrap modulo 2^64, so their low 32 bits are exact). The key of (s, m) chains it over
the seed's two 32-bit halves and the position; each code v has two words, the key mixed with
hash(2v) and hash(2v + 1), finalised again. The words give a 53-bit integer k and U = k 2^-53 on the
float64 grid of ``sampling.exponential``; E = -log1p(-U) clamped to >= 1e-30, so the race has the same
resolution ((V + 3) 2^-53 per draw, ``sampling.exponential``). Torch tensor ops only, vectorised over
rows, positions and codes, no host synchronisation: it runs inside captured CUDA graphs.
"""

from __future__ import annotations

import torch

from .checks import SEED_LIMIT

MASK = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B
_SALT_SEED, _SALT_POS = 0x9E3779B9, 0x85EBCA6B  # distinct odd constants separating the chained inputs


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """The lowbias32 finaliser of 32-bit words held in int64 (any shape): a bijection of 0 .. 2^32 - 1."""
    x = x & MASK
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK
    return x ^ (x >> 16)


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
    """The 32-bit key (B, n) of each (seed row, stream position): the finaliser chained over the seed's
    low word, its high word and the position."""
    lo, hi = seeds & MASK, (seeds >> 32) & MASK
    k = lowbias32(lo ^ _SALT_SEED)
    k = lowbias32(k ^ hi)
    return lowbias32(k[:, None] ^ ((positions & MASK) + _SALT_POS))


_CODE_WORDS: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _code_words(V: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """hash(2v) and hash(2v + 1) for v < V, computed once per (V, device)."""
    key = (V, str(device))
    if key not in _CODE_WORDS:
        v = torch.arange(V, dtype=torch.int64, device=device)
        _CODE_WORDS[key] = (lowbias32(2 * v), lowbias32(2 * v + 1))
    return _CODE_WORDS[key]


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, V: int) -> torch.Tensor:
    """U[0, 1) float64 draws (B, n, V) on the 2^-53 grid, a function of (seeds[b], positions[b, j], v)."""
    a, b = _code_words(V, seeds.device)
    k = keys(seeds, positions)[..., None]
    hi = lowbias32(k ^ a) >> 5  # 27 bits
    lo = lowbias32(k ^ b) >> 6  # 26 bits
    return ((hi << 26) | lo).double() * 2.0**-53


def exponentials(seeds: torch.Tensor, positions: torch.Tensor, V: int) -> torch.Tensor:
    """Exp(1) draws (B, n, V) float64 for seeds (B,) int64 and stream positions (B, n): E = -log1p(-U),
    at most 36.8, clamped to >= 1e-30 (a zero-probability code never wins a race by 0 / 0)."""
    return uniforms(seeds, positions, V).neg_().log1p_().neg_().clamp_min_(1e-30)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_v probs(v) / E(v) over the last dimension (ties: lowest index): a draw from probs."""
    return torch.argmax(probs / noise, dim=-1)
