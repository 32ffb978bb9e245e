"""What a method sees of its models: guided views that count their own forwards.

``GuidedModel`` binds a ``CachedTokenModel`` to B samples and a ``Sampling`` (both CFG halves as one
batch); ``DrafterView`` is an EAGLE drafter as the rounds see it. Each keeps ``forwards`` (batched
calls), ``sizes`` (forwards by tokens fed per row: static shapes, which ``methods/rounds.py`` measures
on a captured round and adds per replay) and ``seconds`` (host time inside its forwards), from which
``DecodeContext.stats`` reports forward counts, block sizes and forward seconds: no method counts a
forward by hand.
"""

from __future__ import annotations

import time

import torch

from ..models.base import CachedTokenModel, Condition, KVCache
from ..models.continuous import ContinuousAR
from ..models.decoder import Prefixes
from ..sampling import Sampling
from .laws import ContinuousLaw, DiscreteLaw, GuidedHead


class GuidedModel:
    """A ``CachedTokenModel`` bound to B samples and a ``Sampling``: runs both CFG halves as one
    batch of 2B rows and returns the sampling law of docs/design/api.md for the B samples (``DiscreteLaw``).

    ``keep_soft``: under greedy sampling every law also holds the temperature-1 law of the same
    positions (``Sampling.soft_probs``), for rules that relax greedy decoding on it (LANTERN).
    Otherwise its ``soft`` is None and nothing extra is computed."""

    token_dim: int | None = None  # discrete tokens (continuous views: the token's dimension)
    ordered = None  # causal: tokens in stream order (``ordered.OrderedView``: a model's own order)
    capturable = True  # its rounds may be captured as CUDA graphs (``DecodeContext.run``)

    def __init__(self, model: CachedTokenModel, condition: Condition | torch.Tensor, sampling: Sampling, extra: int,
                 keep_soft: bool = False) -> None:
        condition = Condition.of(model, condition)  # class ids: the model's null class is the CFG row
        self.model, self.sampling = model, sampling
        self.keep_soft = keep_soft
        self.batch = condition.batch
        self.cfg = sampling.uses_cfg
        self.conditions = condition.rows(self.cfg)
        model.setup_cache(len(self.conditions), extra)
        self.forwards = 0
        self.sizes: dict[int, int] = {}  # forwards by tokens fed per row (the prefill as 1); host-side
        self.seconds = 0.0  # host time inside prefill / forward (Stats.forward_s; meaningful on CPU)
        self.hidden: torch.Tensor | None = None  # last hidden states of all rows (rows, n, D)
        self.row_end = model.layout.row_end
        if self.row_end:  # forced structural positions (stream index -> id, -1: image token)
            self.forced = model.layout.forced(next(model.parameters()).device)

    @property
    def cache(self) -> KVCache | None:
        """The model's static cache (set up by the constructor)."""
        return self.model.cache

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t]) if self.cfg else t

    def _force(self, law: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """Laws over the image codes (B, n, V) at stream positions ``at`` (B, n) -> laws over codes and
        structural ids, a point mass where the position is forced."""
        if not self.row_end:
            return law
        law = torch.nn.functional.pad(law, (0, self.row_end))
        f = self.forced[at.clamp(0, self.forced.shape[0] - 1)]
        point = torch.zeros_like(law).scatter_(-1, f.clamp_min(0)[..., None], 1.0)
        return torch.where((f >= 0)[..., None], point, law)

    def _law(self, logits: torch.Tensor, at: torch.Tensor) -> DiscreteLaw:
        cond, uncond = logits.chunk(2) if self.cfg else (logits, None)
        soft = None
        if self.keep_soft and self.sampling.greedy:
            soft = self._force(self.sampling.soft_probs(cond, uncond), at)
        return DiscreteLaw(self._force(self.sampling.probs(cond, uncond), at), soft)

    def prefill(self) -> DiscreteLaw:
        """Law (B, V) of image token 0."""
        t0 = time.perf_counter()
        logits, self.hidden = self.model.prefill(self.conditions)
        self.count(1)
        if not bool(torch.isfinite(logits).all()):  # one device read a call: NaN weights must not write images
            raise ValueError(f"the model's first forward gave NaN or infinite logits ({logits.dtype}): its weights hold "
                             "NaN/inf or overflow in this dtype; check the checkpoint (or load in fp32)")
        law = self._law(logits[:, None], torch.zeros(self.batch, 1, dtype=torch.long, device=logits.device))
        self.seconds += time.perf_counter() - t0
        return law[:, 0]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None) -> DiscreteLaw:
        """Laws (B, n, V) after each of the n fed tokens (see ``CachedTokenModel.forward_tokens``)."""
        t0 = time.perf_counter()
        mask = None if tree_mask is None else self._rows(tree_mask)
        logits, self.hidden = self.model.forward_tokens(self._rows(tokens), self._rows(positions), mask)
        self.count(tokens.shape[1])
        law = self._law(logits, positions + 1)
        self.seconds += time.perf_counter() - t0
        return law

    def prefill_apart(self, condition: Condition) -> tuple[DiscreteLaw, Prefixes]:
        """Law (k, V) of image token 0 of k more samples and their prefixes (both CFG halves), computed in
        one forward apart from the running cache (continuous batching, ``methods/slots.py``)."""
        t0 = time.perf_counter()
        logits, prefixes = self.model.prefill_prefixes(condition.rows(self.cfg))
        self.count(1)
        law = self._law(logits[:, None], torch.zeros(condition.batch, 1, dtype=torch.long, device=logits.device))
        self.seconds += time.perf_counter() - t0
        return law[:, 0], prefixes

    def load_prefixes(self, slots: torch.Tensor, prefixes: Prefixes, which: torch.Tensor) -> None:
        """Samples ``slots`` restart from prefixes ``which`` of ``prefill_apart`` (both CFG halves)."""
        if self.cfg:
            k = prefixes.lengths.shape[0] // 2
            slots, which = torch.cat([slots, slots + self.batch]), torch.cat([which, which + k])
        self.model.load_prefixes(slots, prefixes, which)

    def count(self, n: int) -> None:
        """One forward over ``n`` tokens per row (a static shape: no device read)."""
        count_forward(self, n)

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.model.set_committed(self._rows(n_fed))

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        self.model.keep_block(self._rows(index), self._rows(count))

    def track_positions(self) -> None:
        """Position-aware caching from now on (``KVCache.track_positions``; 2-D methods, after the prefill)."""
        self.model.track_positions()


class GuidedContinuous(GuidedModel):
    """The view of a continuous-token model (``ContinuousAR``): the same rows, cache and counters as
    ``GuidedModel``; ``prefill``/``forward`` return each position's ``ContinuousLaw`` (the model's z for
    the conditional and unconditional rows through its diffusion head, CFG on epsilon). Its rounds are
    not captured (CSpD's residual sampler reads the host)."""

    capturable = False

    def __init__(self, model: ContinuousAR, condition: Condition | torch.Tensor, sampling: Sampling, extra: int) -> None:
        super().__init__(model, condition, sampling, extra)
        self.head = GuidedHead(model.head, sampling.cfg_scale, sampling.temperature)
        self.token_dim = model.head.token_dim

    def law(self, z: torch.Tensor) -> ContinuousLaw:
        """The law of z's positions (rows of both CFG halves, as the model returns them)."""
        z = z.float()
        cond, uncond = z.chunk(2) if self.cfg else (z, None)
        return ContinuousLaw(cond, uncond, self.head)

    def prefill(self) -> ContinuousLaw:
        """Law (B,) of token 0."""
        t0 = time.perf_counter()
        z, _ = self.model.prefill(self.conditions)
        self.count(1)
        self.seconds += time.perf_counter() - t0
        return self.law(z)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None) -> ContinuousLaw:
        """Laws (B, n) after each fed token (B, n, C) at stream positions ``positions`` (B, n)."""
        t0 = time.perf_counter()
        z, _ = self.model.forward_tokens(self._rows(tokens), self._rows(positions))
        self.count(tokens.shape[1])
        self.seconds += time.perf_counter() - t0
        return self.law(z)


def guided_view(model, condition: Condition | torch.Tensor, sampling: Sampling, extra: int,
                keep_soft: bool = False) -> GuidedModel:
    """The view a method sees of ``model``: continuous-token models (``ContinuousAR``) give
    ``ContinuousLaw``s, token models ``DiscreteLaw``s."""
    if isinstance(model, ContinuousAR):
        return GuidedContinuous(model, condition, sampling, extra)
    return GuidedModel(model, condition, sampling, extra, keep_soft=keep_soft)


def count_forward(counter, n: int, calls: int = 1) -> None:
    """Add ``calls`` forwards over ``n`` tokens to ``counter.forwards`` and ``counter.sizes``."""
    counter.forwards += calls
    counter.sizes[n] = counter.sizes.get(n, 0) + calls


class DrafterView:
    """An EAGLE drafter (``models.drafter.EagleDrafter``) as the tree rounds drive it: every
    ``forward_tokens`` is counted (a forward, its block size) and timed; ``model`` is the drafter."""

    def __init__(self, drafter) -> None:
        self.model = drafter
        self.forwards = 0
        self.sizes: dict[int, int] = {}
        self.seconds = 0.0

    @property
    def cache(self) -> KVCache | None:
        return self.model.cache

    def attach(self, target: CachedTokenModel) -> None:
        self.model.attach(target)

    def setup_cache(self, rows: int, extra: int) -> None:
        self.model.setup_cache(rows, extra=extra)

    def commit(self, count: torch.Tensor) -> None:
        self.model.commit(count)

    def forward_tokens(self, tokens: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        count_forward(self, tokens.shape[1])
        out = self.model.forward_tokens(tokens, *args, **kwargs)
        self.seconds += time.perf_counter() - t0
        return out
