"""The loop contract shared by every method: a guided model view, the committed-token buffer, Stats.

A method is a frozen dataclass with ``name``, ``lossless`` and
``decode(ctx: DecodeContext) -> None``; it drafts, verifies with its acceptance rule and calls
``ctx.commit``. ``specvis.generate`` builds the context, times the loop and assembles ``Stats``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..models.base import CachedTokenModel, Condition, KVCache
from ..sampling import Sampling
from .round import Chain, Tree, Verdict, verify_chain_rule, verify_tree
from .rounds import run_rounds


@dataclass
class Stats:
    """Per-call statistics (API.md). Forward counts are batched calls; the condition pass that
    yields the first image token counts as a target forward, so AR has step_compression 1.0 where
    the layout has no structural tokens (with Emu3's row ends, W / (W + 1): a forced token costs AR
    a forward but is not an image token)."""

    tokens: int
    target_forwards: int
    draft_forwards: int
    step_compression: float
    mean_accepted_length: float
    wall_s: float
    accept_map: torch.Tensor = field(repr=False)
    extra: dict[str, float] = field(default_factory=dict)
    # forwards by block size (tokens fed per row): {"target": {n: calls}, "draft": ..., "drafter": ...};
    # the prefill counts as a 1-token target (draft) forward, so each histogram sums to its forward count
    block_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    # mean live span (KV slots attended, ``KVCache.live``) of those forwards: {"target": {n: slots}, ...}
    live_spans: dict[str, dict[int, float]] = field(default_factory=dict)
    # seconds spent inside those forwards during the decode, on CPU only (a CUDA forward returns before
    # its kernels finish): {"target": s, ...}; wall_s minus their sum is the rounds' other work
    forward_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("accept_map", "extra", "block_sizes", "live_spans", "forward_s")}
        d.update(self.extra)
        return d


class GuidedModel:
    """A ``CachedTokenModel`` bound to B samples and a ``Sampling``: runs both CFG halves as one
    batch of 2B rows and returns the sampling law of API.md for the B samples.

    ``keep_soft``: under greedy sampling every ``prefill``/``forward`` also stores in ``soft`` the
    temperature-1 law of the same positions (``Sampling.soft_probs``), for rules that relax greedy
    decoding on it (LANTERN). Otherwise ``soft`` stays None and nothing extra is computed."""

    def __init__(self, model: CachedTokenModel, condition: Condition | torch.Tensor, sampling: Sampling, extra: int,
                 keep_soft: bool = False) -> None:
        condition = Condition.of(model, condition)  # class ids: the model's null class is the CFG row
        self.model, self.sampling = model, sampling
        self.keep_soft = keep_soft
        self.soft: torch.Tensor | None = None  # temperature-1 law of the last call (greedy + keep_soft only)
        self.batch = condition.batch
        self.cfg = sampling.uses_cfg
        self.conditions = condition.rows(self.cfg)
        model.setup_cache(len(self.conditions), extra)
        self.forwards = 0
        self.sizes: dict[int, int] = {}  # forwards by tokens fed per row (the prefill as 1); host-side
        self.seconds = 0.0  # host time inside prefill / forward (Stats.forward_s; meaningful on CPU)
        self.hidden: torch.Tensor | None = None  # last hidden states of all rows (rows, n, D)
        layout = getattr(model, "layout", None)
        self.row_end = getattr(layout, "row_end", 0)
        if self.row_end:  # forced structural positions (stream index -> id, -1: image token)
            self.forced = layout.forced(next(model.parameters()).device)

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

    def _law(self, logits: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        cond, uncond = logits.chunk(2) if self.cfg else (logits, None)
        if self.keep_soft and self.sampling.greedy:
            self.soft = self._force(self.sampling.soft_probs(cond, uncond), at)
        return self._force(self.sampling.probs(cond, uncond), at)

    def prefill(self) -> torch.Tensor:
        """Law (B, V) of image token 0."""
        t0 = time.perf_counter()
        logits, self.hidden = self.model.prefill(self.conditions)
        self.count(1)
        law = self._law(logits[:, None], torch.zeros(self.batch, 1, dtype=torch.long, device=logits.device))
        if self.keep_soft and self.sampling.greedy:
            self.soft = self.soft[:, 0]
        self.seconds += time.perf_counter() - t0
        return law[:, 0]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Laws (B, n, V) after each of the n fed tokens (see ``CachedTokenModel.forward_tokens``)."""
        t0 = time.perf_counter()
        mask = None if tree_mask is None else self._rows(tree_mask)
        logits, self.hidden = self.model.forward_tokens(self._rows(tokens), self._rows(positions), mask)
        self.count(tokens.shape[1])
        law = self._law(logits, positions + 1)
        self.seconds += time.perf_counter() - t0
        return law

    def count(self, n: int) -> None:
        """One forward over ``n`` tokens per row (a static shape: no device read)."""
        count_forward(self, n)

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.model.set_committed(self._rows(n_fed))

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        self.model.keep_block(self._rows(index), self._rows(count))


def count_forward(counter, n: int, calls: int = 1) -> None:
    """Add ``calls`` forwards over ``n`` tokens to ``counter.forwards`` and ``counter.sizes``."""
    counter.forwards += calls
    counter.sizes[n] = counter.sizes.get(n, 0) + calls


class Counter:
    """A forward count that a method advances from inside a round (``DecodeContext.counted``), with
    ``sizes``, the forwards by tokens fed per row (filled by whoever knows the block shapes)."""

    def __init__(self) -> None:
        self.forwards = 0
        self.sizes: dict[int, int] = {}
        self.seconds = 0.0  # host time inside those forwards (whoever times them adds it)


class DecodeContext:
    """Everything a method's loop needs: the target (and draft) views, the generator and the
    committed-token buffer with per-row lengths (rows never wait for each other)."""

    def __init__(self, target: GuidedModel, generator: torch.Generator, pad: int,
                 draft: GuidedModel | None = None, drafter: Any = None, codebook: torch.Tensor | None = None,
                 graphs: bool = False) -> None:
        self.target, self.draft, self.drafter, self.codebook = target, draft, drafter, codebook
        self.generator = generator
        self.graphs = graphs  # on CUDA: replay each round as a captured CUDA graph (methods/rounds.py)
        self.counted: list = [v for v in (target, draft) if v is not None]  # objects whose .forwards rounds advance
        self.drafts = Counter()  # EAGLE drafter forwards (tree methods count them and add it to ``counted``)
        self.rule: Any = None  # the method's acceptance rule, bound to the codebook if it needs one
        layout = target.model.layout
        self.layout, self.L, self.V = layout, layout.stream_len, layout.law_size  # stream positions, law width
        B, dev = target.batch, next(target.model.parameters()).device
        self.tokens = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        self.accept_map = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        self.n = torch.zeros(B, dtype=torch.long, device=dev)  # committed stream tokens per row
        self.active_forwards = torch.zeros(B, dtype=torch.long, device=dev)
        forced = layout.forced(dev) if layout.row_end else torch.empty(0, dtype=torch.long, device=dev)
        self.forced = torch.nn.functional.pad(forced, (0, self.L + pad - forced.shape[0]), value=-1)
        self.extra: dict[str, float] = {}
        self.progress = None  # callable(fraction) after each round (``generate(progress=)``)

    @property
    def device(self) -> torch.device:
        return self.n.device

    def run(self, round_fn, rounds: int | None = None) -> None:
        """Call ``round_fn`` (one round, state updated in place) until every row is done, or exactly
        ``rounds`` times; captured and replayed as a CUDA graph when ``graphs`` is on and the device is
        CUDA (``methods/rounds.py``)."""
        run_rounds(self, round_fn, self.graphs, rounds)

    @property
    def max_rounds(self) -> int:
        """The most rounds a ``run`` may take: each commits a token per unfinished row (``run_rounds``)."""
        return self.L

    def report_progress(self) -> None:
        """Tell ``progress`` (if set) the fraction of the stream the slowest row has committed."""
        if self.progress is not None:
            self.progress(min(1.0, float(self.n.min()) / self.L))

    def live_caches(self) -> list:
        """The static caches of the target, draft model and EAGLE drafter whose forwards attend over a live span
        (``KVCache.live``); the done-check tightens their bounds."""
        caches = [getattr(getattr(view, "model", None), "cache", None) for view in (self.target, self.draft)]
        caches.append(getattr(self.drafter, "cache", None))
        return [c for c in caches if isinstance(c, KVCache) and c.bucket > 0]

    def done(self) -> bool:
        """True when every row has its whole grid (one host sync per decoding step). The same transfer
        reads the longest row of every live cache, which tightens its live-span bound."""
        caches = self.live_caches()
        if not caches:
            return bool((self.n >= self.L).all())
        flags = torch.stack([(self.n >= self.L).all().long(), *(c.length.max() for c in caches)]).tolist()
        for cache, longest in zip(caches, flags[1:]):
            cache.refresh(longest)
        return bool(flags[0])

    def verify(self, p: torch.Tensor, proposal: Chain | Tree) -> Verdict:
        """The acceptance rule's walk over ``proposal`` against the target laws ``p`` of its positions
        (a chain: after the last committed token and each draft; a tree: after each node)."""
        if self.rule is None:
            raise ValueError("this method has no acceptance rule to verify drafts with")
        if isinstance(proposal, Tree):
            return verify_tree(self.rule, proposal, p, self.generator, soft=self.target.soft)
        return verify_chain_rule(self.rule, p, proposal, self.generator, soft=self.target.soft)

    def accept(self, verdict: Verdict) -> torch.Tensor:
        """Commit the verdict's block and keep in the target cache what the committed tokens need: the
        fed chain's first ``count`` slots in place, or the slots ``verdict.keep`` (moved to the block's
        start). The last committed token is never cached: the next round feeds it. Returns the per-row
        count committed (finished rows: 0)."""
        count = self.commit(verdict.block, verdict.committed, verdict.at)
        if verdict.keep is None:
            self.target.set_committed(self.n - 1)
        else:
            self.target.keep_block(verdict.keep, count)
        return count

    def commit(self, block: torch.Tensor, count: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """Append ``block[r, :count[r]]`` to row r (or write it at stream positions ``at[r]``), all by one
        target forward. Finished rows ignore it. Returns the per-row count actually committed. The
        buffer only: ``accept`` also updates the target cache."""
        active = self.n < self.L
        count = torch.where(active, torch.minimum(count, self.L - self.n), torch.zeros_like(count))
        m = block.shape[1]
        j = torch.arange(m, device=self.device)
        idx = (self.n[:, None] + j if at is None else at).clamp_max(self.tokens.shape[1] - 1)
        write = j[None, :] < count[:, None]
        images = (write & (self.forced[idx] < 0)).sum(1, keepdim=True)  # image tokens of this block
        self.tokens.scatter_(1, idx, torch.where(write, block, self.tokens.gather(1, idx)))
        self.accept_map.scatter_(1, idx, torch.where(write, images.expand(-1, m), self.accept_map.gather(1, idx)))
        self.active_forwards += active.long()
        self.n += count
        return count

    def force(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Drafts (B, n) at stream ``positions`` with every forced position set to its structural id."""
        f = self.forced[positions.clamp(0, self.forced.shape[0] - 1)]
        return torch.where(f >= 0, f, tokens)

    def force_law(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Draft laws (B, n, V) with a point mass at every forced position."""
        f = self.forced[positions.clamp(0, self.forced.shape[0] - 1)]
        return torch.where((f >= 0)[..., None], torch.zeros_like(q).scatter_(-1, f.clamp_min(0)[..., None], 1.0), q)

    def image_tokens(self) -> torch.Tensor:
        """(B, H*W) the committed image codes, structural tokens removed."""
        if not self.layout.row_end:
            return self.tokens[:, : self.L]
        return self.tokens[:, self.layout.image_index(self.device)]

    def positions(self, start: torch.Tensor, n: int) -> torch.Tensor:
        """Grid indices (B, n) start, start+1, ... for a chain of n tokens."""
        return start[:, None] + torch.arange(n, device=self.device)

    def stats(self, wall_s: float, draft_forwards: int) -> Stats:
        """``tokens`` counts image tokens only; the heatmap covers the image grid."""
        B = self.n.shape[0]
        H, W = self.layout.height, self.layout.width
        N, fwd = self.layout.num_tokens, self.target.forwards
        grid = self.accept_map[:, : self.L] if not self.layout.row_end else self.accept_map[:, self.layout.image_index(self.device)]
        return Stats(
            tokens=N,
            target_forwards=fwd,
            draft_forwards=draft_forwards,
            step_compression=N / max(fwd, 1),
            mean_accepted_length=float((N / self.active_forwards.clamp_min(1).float()).mean()),
            wall_s=wall_s,
            accept_map=grid.reshape(B, H, W).cpu(),
            extra=dict(self.extra),
            block_sizes=self.block_sizes(),
            live_spans=self.live_spans(),
            forward_s=self.forward_seconds(),
        )

    def block_sizes(self) -> dict[str, dict[int, int]]:
        """Forwards by block size of the target, and of the draft model / EAGLE drafter where they ran."""
        out = {"target": dict(sorted(self.target.sizes.items()))}
        if self.draft is not None and self.draft.sizes:
            out["draft"] = dict(sorted(self.draft.sizes.items()))
        if self.drafts.sizes:
            out["drafter"] = dict(sorted(self.drafts.sizes.items()))
        return out

    def forward_seconds(self) -> dict[str, float]:
        """Per model that ran, the seconds spent inside its forwards (the law included, as the cost curve
        times them); on CPU only, where a forward returns when its work is done ({} elsewhere)."""
        if self.device.type != "cpu":
            return {}
        views = {"target": self.target, "draft": self.draft, "drafter": self.drafts}
        return {kind: views[kind].seconds for kind in self.block_sizes()}

    def live_spans(self) -> dict[str, dict[int, float]]:
        """Per model and block size, the mean live span of its forwards (``KVCache.spans``; a forward's
        attention cost grows with it): what the bench prices each forward at."""
        models = {"target": self.target.model, "draft": self.draft and self.draft.model, "drafter": self.drafter}
        out = {}
        for kind in self.block_sizes():  # a model that ran no forward in this decode may hold an older cache
            spans = getattr(getattr(models[kind], "cache", None), "spans", None)
            if spans:
                out[kind] = {n: total / calls for n, (calls, total) in sorted(spans.items())}
        return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0
