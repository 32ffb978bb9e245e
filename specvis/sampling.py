"""One probability pipeline for every method (docs/design/api.md, "Sampling").

Per position: guided = u + s * (c - u)  ->  / temperature  ->  top-k  ->  top-p  ->  softmax.
Temperature 0 is greedy and is represented as a point mass at the argmax, so that every acceptance
rule (min(1, p/q), residual max(0, p - q)) becomes deterministic without special cases.
Draws (``sample``, ``exponential``, ``uniform``) need no host synchronisation, keep static shapes (CUDA
graphs) and are reproducible from a seeded ``torch.Generator``. Their uniforms are float64, so no code
gets a probability floor: a float32 uniform is 0 with probability 2^-24, and at U = 0 an exponential
race (argmax p / E with E = -log(1 - U) = 0) lets any code with p > 0 win (about V 2^-24 per draw: one
stray code in a thousand draws over 16,384 codes), as an acceptance test u < alpha accepts any
alpha > 0. Each function states its resolution.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .checks import InputTypeError, integer, number, shown


NOISES = ("stream", "keyed")
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4
"""Temperatures other than 0 (greedy) lie in this range: logits / T must stay finite in fp32 (T =
1e-40 turned logits of 0.1 into inf, and the law into NaN), and a T above it is the uniform law."""
TEMPERATURES = f"0 (greedy) or a finite number in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]"
MAX_CFG_SCALE = 1e3  # guided logits u + s (c - u) stay finite in fp32 for logits of any model's size
MAX_TOP_K = 2**24  # above any vocabulary (checks.MAX_SIZE)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters shared by every method; ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    cfg_scale: float = 1.0
    # "stream": draws from the call's seeded generator; "keyed": token m of the image with seed s is
    # argmax_v p_m(v) / E(s, m, v), E a function of (s, m, v) alone (``specvis.noise``); None: the model's
    # default, resolved once per call (``Sampling.resolved``): keyed for discrete-token models, else stream
    noise: str | None = None

    def __post_init__(self) -> None:
        """Types and ranges, one line naming the field (``specvis.checks``): numbers are finite (an
        infinite cfg_scale turns every law into NaN), ints are never bools (``top_k=True`` is not 1)."""
        t = number(self.temperature, "temperature", TEMPERATURES)
        if t != 0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be {TEMPERATURES}, got {self.temperature}")
        if self.top_k is not None:
            integer(self.top_k, "top_k", 1, MAX_TOP_K)
        if self.top_p is not None and not 0.0 < number(self.top_p, "top_p", "in (0, 1]") <= 1.0:
            raise ValueError(f"top_p must be None or a number in (0, 1], got {self.top_p}")
        if not 0 <= number(self.cfg_scale, "cfg_scale", f"in [0, {MAX_CFG_SCALE:g}] (1 = no guidance)") <= MAX_CFG_SCALE:
            raise ValueError(f"cfg_scale must be a finite number in [0, {MAX_CFG_SCALE:g}] (1 = no guidance), got {self.cfg_scale}")
        if self.noise is not None and self.noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)} (or None: the model's default), got {shown(self.noise)}")

    def resolved(self, discrete: bool) -> Sampling:
        """This sampling with ``noise=None`` made the model's default: ``keyed`` for a model of discrete
        tokens decoded in stream order (every lossless method then gives AR's picture for a seed), ``stream``
        for continuous-token and ordered (MAR) models, where no method races keyed noise."""
        if self.noise is not None:
            return self
        return replace(self, noise="keyed" if discrete else "stream")

    @property
    def keyed(self) -> bool:
        """Image k of a call with seed s is a function of (s + k, its law) alone (``specvis.noise``)."""
        return self.noise == "keyed"

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def guide(self, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        """Classifier-free guidance on logits: u + s * (c - u); identity when s == 1."""
        if not self.uses_cfg:
            return cond
        if uncond is None:
            raise ValueError("cfg_scale != 1 needs unconditional logits")
        return uncond + self.cfg_scale * (cond - uncond)

    def probs(self, cond: torch.Tensor, uncond: torch.Tensor | None = None) -> torch.Tensor:
        """Raw logits (..., V) -> the sampling law (..., V) in float32 (steps 2-5 of docs/design/api.md)."""
        logits = self.guide(cond.float(), None if uncond is None else uncond.float())
        if self.greedy:
            return one_hot_argmax(logits)
        logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            logits = _top_p_filter(logits, self.top_p)
        return torch.softmax(logits, dim=-1)

    def soft_probs(self, cond: torch.Tensor, uncond: torch.Tensor | None = None) -> torch.Tensor:
        """The same pipeline at temperature 1 (CFG, top-k, top-p, softmax): the soft law whose argmax
        greedy decoding takes. Greedy LANTERN builds its neighbourhoods on it."""
        return replace(self, temperature=1.0).probs(cond, uncond)



def sampling_argument(value: Any, default: Sampling, what: str = "sampling") -> Sampling:
    """A call's ``sampling``: None means ``default``; a dict sets those fields of ``default`` (the model's
    sampling: ``{"temperature": 0}`` keeps its cfg_scale, as ``--temperature 0`` does)."""
    if value is None:
        return default
    if isinstance(value, Sampling):
        return value
    if isinstance(value, dict):
        names = [f.name for f in fields(Sampling)]
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise ValueError(f"{what} has no field {unknown[0]!r}; fields: {', '.join(names)}")
        return replace(default, **value)
    raise InputTypeError(f"{what} must be sv.Sampling(...) (or a dict of its fields), got {shown(value)}")

def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass is >= top_p (at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Point mass at the argmax (ties broken by the lowest index)."""
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(
        -1, logits.argmax(dim=-1, keepdim=True), 1.0
    )


def rows_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, j]]`` for x (B, K, ...) and index (B, n): (B, n, ...), by indexing (on CPU about
    2x faster than ``gather`` with an index expanded over the last dimension)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], index]


UNIT = 2**52  # the integer grid of ``sample``: p_i is counted in units of 2^-52


def exponential(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exp(1) draws shaped like ``like``, in float64: E = -log(1 - U), U a float64 uniform (grid 2^-53),
    so finite (at most 36.8), and clamped to >= 1e-30 so that a zero-probability entry of a race never
    divides 0 by 0 (NaN would win the argmax); -log(U) instead would give +inf at U = 0, which zeroes
    a point mass's only entry and lets an impossible token win.

    Resolution: P(E <= t) is within 2^-53 of 1 - e^-t at every t (U's grid; the clamp moves only U = 0),
    so in a race argmax_i(p_i / E_i) over V codes (p float32, the ratio in float64) code i wins with
    probability within (V + 3) 2^-53 of p_i / sum(p): each factor P(p_j / E_j < p_i / E_i | E_i) of the
    winning probability moves by at most 2^-53, E_i's law by 2^-53 in the integral, and float64 rounding of
    the ratios (ties go to the lowest index) by 3 2^-53 p_i. At V = 65,536 that is 7.3e-12 a draw; the
    float32 race had a floor of about V 2^-24 = 0.004 for every code in the support."""
    u = torch.rand(like.shape, device=like.device, dtype=torch.float64, generator=generator)
    return u.neg_().log1p_().neg_().clamp_min_(1e-30)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of the laws ``probs`` (..., V) (rows summing to 1 up to rounding) by the
    inverse CDF on exact integer prefix sums; one float64 uniform per row, no host sync.

    m_i = floor(p_i 2^52) (a float32 scaled by a power of two: exact), S_i = m_0 + ... + m_i in int64
    (exact whatever the summation order, so the same on every device), M = S_{V-1}; t = floor(U M) for a
    float64 uniform U (grid 2^-53, U < 1 so t < M; clipped to M - 1 all the same) and the draw is the i
    with S_{i-1} <= t < S_i. A code with m_i = 0 (p_i < 2^-52, in particular p_i = 0) is never drawn.
    Resolution: t's law is within 2^-51 of uniform on each interval of integers (U's grid and the rounding
    of U M), and m_i / M is within (1 + V p_i) 2^-52 of p_i / sum(p), so code i is drawn with probability
    within (3 + V p_i) 2^-52 of p_i / sum(p): 6.7e-16 for a rare code, relative 1.5e-11 at V = 65,536. No
    floor (the float32 exponential race this replaces gave every code in the support about 2^-24 per draw).
    An all-zero row (padding) draws index 0."""
    m = torch.cumsum(probs * float(UNIT), -1, dtype=torch.int64)  # (..., V) S_i (the cast truncates)
    total = m[..., -1:]
    u = torch.rand(total.shape, device=probs.device, dtype=torch.float64, generator=generator)
    t = (u * total).long().minimum(total - 1)
    return torch.searchsorted(m, t, right=True).squeeze(-1)


def uniform(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """U[0, 1) draws in float64 on ``like``'s device, from ``generator``: every acceptance test
    (u < alpha, u q(x) < p(x), log u < log ratio) draws here. Resolution 2^-53: u < alpha holds with
    probability in [alpha, alpha + 2^-53); a float32 u would accept any alpha > 0 with probability 2^-24."""
    return torch.rand(shape, device=like.device, dtype=torch.float64, generator=generator)


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A seeded generator on ``device``: same seed and inputs give the same tokens."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g
