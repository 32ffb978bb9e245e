"""The loop contract shared by every method: the decode context (views, rule, committed tokens), Stats.

A method is a frozen dataclass with ``name``, ``lossless`` and ``decode(ctx: DecodeContext) -> None``.
Its rounds draft a proposal (``verdicts.Chain`` / ``verdicts.Tree``), score it with one target forward,
``ctx.verify`` it with the bound acceptance rule and ``ctx.accept`` the verdict (commit + target cache
rollback), inside ``ctx.run`` (eager, or captured as CUDA graphs). A method with statistics of its own
records one typed dataclass (``ctx.record``), reported in ``Stats.extra``. ``specvis.generate`` builds the
context complete (views, bound rule, generator, graphs, progress), times the loop and assembles ``Stats``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

import torch

from ..models.base import KVCache
from .verdicts import Chain, Tree, Verdict, verify_chain_rule, verify_tree
from .rounds import run_plain, run_rounds
from .keyed import KeyedNoise
from .slots import SlotQueue
from .laws import DiscreteLaw
from .views import DrafterView, GuidedModel


@dataclass
class Stats:
    """Per-call statistics of a decode. Forward counts are batched calls; the condition pass that
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
    seeds: list[int] = field(default_factory=list)  # keyed noise: each image's seed in output order; else []

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("accept_map", "extra", "block_sizes", "live_spans", "forward_s")}
        d.update(self.extra)
        return d


class DecodeContext:
    """Everything a method's loop needs, complete when built: the target view, the draft model's and
    EAGLE drafter's views (each counts its own forwards), the bound acceptance rule, the generator or the
    keyed noise (``seeds``: image k's seed + k), the round runner's settings and the committed-token
    buffer with per-row lengths (rows never wait for each other)."""

    def __init__(self, target: GuidedModel, generator: torch.Generator, pad: int, *,
                 draft: GuidedModel | None = None, drafter: DrafterView | None = None, rule: Any = None,
                 graphs: bool = False, progress: Callable[[float], None] | None = None,
                 seeds: list[int] | None = None, coupled: bool = False) -> None:
        self.target, self.draft, self.drafter = target, draft, drafter
        self.rule = rule  # the method's acceptance rule, bound (``generate``); None for methods without one
        self.generator = generator
        self.graphs = graphs  # on CUDA: replay each round as a captured CUDA graph (methods/rounds.py)
        self.progress = progress  # callable(fraction) after each round (``generate(progress=)``)
        self.counted: list = [v for v in (target, draft, drafter) if v is not None]  # views whose counts rounds advance
        self.method_stats: Any = None  # the method's own statistics (a dataclass, ``record``)
        layout = target.model.layout
        self.layout, self.L, self.V = layout, layout.stream_len, layout.law_size  # stream positions, law width
        B, dev = target.batch, next(target.model.parameters()).device
        self.tokens = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        # continuous-token targets: the committed tokens themselves (``tokens`` then holds zeros)
        C = target.token_dim
        self.latents = None if C is None else torch.zeros(B, self.L + pad, C, device=dev)
        self.filled = torch.zeros(B, self.L + pad, dtype=torch.bool, device=dev)  # committed stream positions
        self.accept_map = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        self.n = torch.zeros(B, dtype=torch.long, device=dev)  # committed stream tokens per row
        self.active_forwards = torch.zeros(B, dtype=torch.long, device=dev)
        forced = layout.forced(dev) if layout.row_end else torch.empty(0, dtype=torch.long, device=dev)
        self.forced = torch.nn.functional.pad(forced, (0, self.L + pad - forced.shape[0]), value=-1)
        self.queue: SlotQueue | None = None  # more samples than rows (``generate(batch_size=)``, methods/slots.py)
        self.on_refill: Callable[[torch.Tensor, DiscreteLaw], None] | None = None  # the method's reset of restarted rows
        self.keyed = None if seeds is None else KeyedNoise(seeds, B, self.V, dev)  # else: draws from ``generator``
        self.coupled = coupled  # verify against the point masses of the keyed races (``accept.Coupled``)

    @property
    def device(self) -> torch.device:
        return self.n.device

    def run(self, round_fn: Callable[[], None], rounds: int | None = None, capture: bool = True,
            refill: Callable[[torch.Tensor, DiscreteLaw], None] | None = None) -> None:
        """Call ``round_fn`` (one round, state updated in place) until every row is done, or exactly
        ``rounds`` times; captured and replayed as a CUDA graph when ``graphs`` is on and the device is
        CUDA (``methods/rounds.py``). ``capture=False`` (or a target view that is not ``capturable``): rounds
        that read the host (a data-dependent loop) run eagerly, without pinned live spans. ``refill(fresh, law)``
        (continuous batching, ``methods/slots.py``): reset the method's state of the rows ``fresh`` (B,) bool,
        restarted with a new sample whose first token (committed) was drawn from ``law`` (B, V; rows ``fresh``);
        with more samples than rows, rounds run until every sample is done."""
        self.on_refill = refill
        if self.queue is not None:
            rounds = None
        if capture and self.target.capturable:
            run_rounds(self, round_fn, self.graphs, rounds)
        else:
            run_plain(self, round_fn, rounds)

    def record(self, stats: Any) -> None:
        """The method's own statistics, a dataclass of floats: ``Stats.extra`` reports its fields."""
        self.method_stats = stats

    @property
    def max_rounds(self) -> int:
        """The most rounds a ``run`` may take: each commits a token per unfinished row (``run_rounds``); with
        more samples than rows, a row may run every sample the others leave."""
        return self.L if self.queue is None else self.L * (self.queue.samples - self.queue.rows + 1)

    def report_progress(self) -> None:
        """Tell ``progress`` (if set) the fraction of the stream the slowest row has committed."""
        if self.progress is not None:
            self.progress(min(1.0, float(self.n.min()) / self.L) if self.queue is None else self.queue.progress(self.n, self.L))

    def live_caches(self) -> list:
        """The static caches of the target, draft model and EAGLE drafter whose forwards attend over a live span
        (``KVCache.live``); the done-check tightens their bounds."""
        return [v.cache for v in self.counted if isinstance(v.cache, KVCache) and v.cache.bucket > 0]

    def done(self) -> bool:
        """True when every row has its whole grid (one host sync per decoding step). The same transfer
        reads the longest row of every live cache, which tightens its live-span bound. With more samples
        than rows it reads which rows are complete: their samples leave and waiting ones restart free
        rows (``SlotQueue.turn``), and it is True when every sample is done."""
        complete = self.n >= self.L
        if self.queue is None:
            complete = complete.all()[None]
        caches = self.live_caches()
        flags = torch.cat([complete.long(), *(c.length.max()[None] for c in caches)]).tolist()
        rows = len(flags) - len(caches)
        for cache, longest in zip(caches, flags[rows:]):
            cache.refresh(longest)
        if self.queue is None:
            return bool(flags[0])
        return self.queue.turn(self, flags[:rows])

    def draw(self, law: DiscreteLaw, positions: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """A token per law at stream ``positions`` (laws of ``rows``): keyed race, or from the generator."""
        return law.sample(self.generator) if self.keyed is None else self.keyed.draw(law.probs, positions, rows)

    def restart_rows(self, rows: torch.Tensor, first: torch.Tensor) -> None:
        """Rows ``rows`` start a new sample whose first token is ``first`` (drawn from its prefix's law, a
        forward of its own: counted as the row's first): the committed buffer holds it alone."""
        for buf in (self.tokens, self.accept_map, self.filled):
            buf[rows] = 0
        self.tokens[rows, 0] = first
        self.filled[rows, 0] = True
        self.accept_map[rows, 0] = 1
        self.n[rows] = 1
        self.active_forwards[rows] = 1

    def verify(self, p: DiscreteLaw, proposal: Chain | Tree) -> Verdict:
        """The acceptance rule's walk over ``proposal`` against the target laws ``p`` of its positions
        (a chain: after the last committed token and each draft; a tree: after each node)."""
        if self.rule is None:
            raise ValueError("this method has no acceptance rule to verify drafts with")
        if self.coupled:  # the point mass at each position's keyed choice (``accept.Coupled``)
            at = proposal.positions + 1 if isinstance(proposal, Tree) else self.positions(self.n, p.probs.shape[1])
            p = DiscreteLaw(self.keyed.choices(p.probs, at))
        if isinstance(proposal, Tree):
            return verify_tree(self.rule, proposal, p.probs, self.generator, soft=p.soft)
        return verify_chain_rule(self.rule, p.probs, proposal, self.generator, soft=p.soft)

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
        target forward. Finished rows ignore it; entries beyond a row's count go to the first padding
        column (so an unused ``at`` entry never overwrites a position the same row commits). Returns the
        per-row count actually committed. The buffer only: ``accept`` also updates the target cache."""
        active = self.n < self.L
        count = torch.where(active, torch.minimum(count, self.L - self.n), torch.zeros_like(count))
        m = block.shape[1]
        j = torch.arange(m, device=self.device)
        write = j[None, :] < count[:, None]
        idx = torch.where(write, (self.n[:, None] + j if at is None else at).clamp_max(self.tokens.shape[1] - 1), self.L)
        images = (write & (self.forced[idx] < 0)).sum(1, keepdim=True)  # image tokens of this block
        if self.latents is None:
            self.tokens.scatter_(1, idx, torch.where(write, block, self.tokens.gather(1, idx)))
        else:  # continuous tokens (B, m, C)
            at3 = idx[..., None].expand(-1, -1, block.shape[-1])
            self.latents.scatter_(1, at3, torch.where(write[..., None], block, self.latents.gather(1, at3)))
        self.accept_map.scatter_(1, idx, torch.where(write, images.expand(-1, m), self.accept_map.gather(1, idx)))
        self.filled.scatter_(1, idx, self.filled.gather(1, idx) | write)
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
        """(B, H*W) the committed image codes, structural tokens removed (every sample's, with a queue)."""
        tokens = self.tokens[:, : self.L] if self.queue is None else self.queue.tokens
        if not self.layout.row_end:
            return tokens
        return tokens[:, self.layout.image_index(self.device)]

    def positions(self, start: torch.Tensor, n: int) -> torch.Tensor:
        """Grid indices (B, n) start, start+1, ... for a chain of n tokens."""
        return start[:, None] + torch.arange(n, device=self.device)

    def stats(self, wall_s: float) -> Stats:
        """``tokens`` counts image tokens only; the heatmap covers the image grid; draft forwards are the
        draft model's and the EAGLE drafter's (their views count them); ``extra`` the method's record."""
        H, W = self.layout.height, self.layout.width
        N, fwd = self.layout.num_tokens, self.target.forwards
        q = self.queue
        accept, active = (self.accept_map[:, : self.L], self.active_forwards) if q is None else (q.accept_map, q.active_forwards)
        grid = accept if not self.layout.row_end else accept[:, self.layout.image_index(self.device)]
        per_row = 1.0 if q is None else q.samples / q.rows  # samples a row ran: tokens per row over the forwards
        return Stats(
            tokens=N,
            target_forwards=fwd,
            draft_forwards=sum(v.forwards for v in (self.draft, self.drafter) if v is not None),
            step_compression=N * per_row / max(fwd, 1),
            mean_accepted_length=float((N / active.clamp_min(1).float()).mean()),
            wall_s=wall_s,
            accept_map=grid.reshape(-1, H, W).cpu(),
            extra={} if self.method_stats is None else asdict(self.method_stats),
            block_sizes=self.block_sizes(),
            live_spans=self.live_spans(),
            forward_s=self.forward_seconds(),
            seeds=[] if self.keyed is None else list(self.keyed.image_seeds),
        )

    def block_sizes(self) -> dict[str, dict[int, int]]:
        """Forwards by block size of the target, and of the draft model / EAGLE drafter where they ran."""
        out = {"target": dict(sorted(self.target.sizes.items()))}
        if self.draft is not None and self.draft.sizes:
            out["draft"] = dict(sorted(self.draft.sizes.items()))
        if self.drafter is not None and self.drafter.sizes:
            out["drafter"] = dict(sorted(self.drafter.sizes.items()))
        return out

    def forward_seconds(self) -> dict[str, float]:
        """Per model that ran, the seconds spent inside its forwards (the law included, as the cost curve
        times them); on CPU only, where a forward returns when its work is done ({} elsewhere)."""
        if self.device.type != "cpu":
            return {}
        views = {"target": self.target, "draft": self.draft, "drafter": self.drafter}
        return {kind: views[kind].seconds for kind in self.block_sizes()}

    def live_spans(self) -> dict[str, dict[int, float]]:
        """Per model and block size, the mean live span of its forwards (``KVCache.spans``; a forward's
        attention cost grows with it): what the bench prices each forward at."""
        views = {"target": self.target, "draft": self.draft, "drafter": self.drafter}
        out = {}
        for kind in self.block_sizes():  # a model that ran no forward in this decode may hold an older cache
            cache = views[kind].cache
            spans = cache.spans if isinstance(cache, KVCache) else None
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
