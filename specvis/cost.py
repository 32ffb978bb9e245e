"""The forward cost curve: the seconds of one cached target / draft / drafter forward over n new tokens
(``CostProbe``, run through ``specvis.generate`` like a method), and the price of a run's forwards on it
(``predicted_time``). ``specvis bench`` predicts speedups from it, ``specvis.tune`` chooses a method by it.
It sits below both, so that the choice (``tune``), under the pipelines, needs nothing of the bench.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Any

import torch

from .methods.base import sync
from .models.base import KVCache

KINDS = ("target", "draft", "drafter")
# untimed forwards of a size before its timed ones: the first forwards after a switch of block size cost
# more (the weights of wide calls are a second, packed copy: models/weight_layout.py), and a curve timed
# on them prices AR's forward above what AR's decode takes (docs/results/archive/goal.md, "On a Zen 5 EPYC")
WARM_CALLS = 8
# timed forwards in a row after each warm-up, each one a repeat: one per warm-up multiplies the warm-up
# forwards by the repeats, and auto's calibration pays for them
TIMED_CALLS = 4
# stream fractions committed before the timed forwards: two live spans per size, through which a run's
# forwards are priced at their own mean span (``bench.report.at_span``): a forward's cost grows with
# the span it attends (goal.md, as above), and a batch's last forwards, run while its slowest row
# catches up, have the longest spans
FILLS = (0.25, 0.75)


class CostProbe:
    """A "method" whose decode commits nothing and times forwards instead: the pipeline builds the
    target/draft views (conditions, prompts and their CFG rows, grid, cache room) exactly as for a run."""

    name = "cost-probe"
    lossless = True
    acceptance = None

    def __init__(self, sizes: dict[str, list[int]], repeats: int) -> None:
        self.sizes, self.repeats = sizes, repeats
        self.pad = max((n for v in sizes.values() for n in v), default=1) + 2
        self.curve: dict[str, list[dict]] = {}

    def decode(self, ctx) -> None:
        for kind in KINDS:
            sizes = sorted(set(self.sizes.get(kind) or ()))
            if sizes:
                self.curve[kind] = measure(ctx, kind, sizes, self.repeats)


def _caches(*objs) -> list:
    return [c for c in (getattr(o, "cache", None) for o in objs) if isinstance(c, KVCache)]


def measure(ctx, kind: str, sizes: list[int], repeats: int) -> list[dict]:
    """Per block size n: the median seconds of one ``kind`` forward over n tokens per row with each
    fraction ``FILLS`` of the stream committed (every row alike), timed ``TIMED_CALLS`` in a row after
    ``WARM_CALLS`` of that size and fill, as ``spans`` [[live span, s], ...] (``KVCache.span``: the slots
    its attention read), and ``median_s``, their mean (the line through them at the mean span)."""
    dev, target = ctx.device, ctx.target
    B = target.batch
    fills = [torch.full((B,), int(f * ctx.layout.stream_len), device=dev) for f in FILLS]
    rows = (lambda t: torch.cat([t, t])) if target.cfg else (lambda t: t)
    if kind == "drafter":
        if ctx.drafter is None:
            raise ValueError("no EAGLE drafter to measure")
        drafter = ctx.drafter.model
        drafter.attach(target.model)
        drafter.setup_cache(2 * B if target.cfg else B, extra=max(sizes) + 2)
        width = drafter.config.hidden_size
        caches = _caches(drafter)

        def commit(fill):
            drafter.cache.length.zero_()
            drafter.commit(rows(fill))

        def make(n, tokens, pos):
            feats = torch.randn(tokens.shape[0] * (2 if target.cfg else 1), n, width, device=dev,
                                dtype=drafter.fc.weight.dtype)
            return lambda: drafter.forward_tokens(rows(tokens), feats, rows(pos))
    else:
        view = target if kind == "target" else ctx.draft
        if view is None:
            raise ValueError("no draft model to measure")
        model = view.model
        continuous = view.token_dim is not None  # the view's declared token kind
        (model.prefill(view.conditions) if continuous else view.prefill())
        caches = _caches(model)
        commit = view.set_committed

        def make(n, tokens, pos):
            if continuous:  # continuous tokens: the trunk's forward (the diffusion head is per token)
                x = torch.randn(B, n, view.token_dim, device=dev)
                return lambda: model.forward_tokens(rows(x), rows(pos))
            return lambda: view.forward(tokens, pos)
    tokens = {n: torch.randint(0, max(ctx.layout.vocab_size, 1), (B, n), device=dev) for n in sizes}  # continuous: unused
    fwds = [[make(n, tokens[n], fill[:, None] + torch.arange(n, device=dev)) for n in sizes] for fill in fills]
    times = [[[] for _ in sizes] for _ in fills]
    spans = [[0] * len(sizes) for _ in fills]
    # fills and sizes interleaved, so that a slow spell of the machine slows every one alike; each round
    # runs WARM_CALLS untimed forwards of a size and fill, then TIMED_CALLS timed ones, as in a decode,
    # whose forwards are of one size (AR, SJD) or alternate between the same few; the first round's
    # timings are dropped
    for r in range(1 + -(-repeats // TIMED_CALLS)):
        for f, fill in enumerate(fills):
            commit(fill)
            for c in caches:  # live spans (KVCache.live) cover the committed stream, not only the prompt
                c.refresh(int(c.length.max()))
            bounds = [c.bound for c in caches]  # reset before every forward: each sees the same prefix
            for k, fwd in enumerate(fwds[f]):
                spans[f][k] = caches[0].span(bounds[0] + sizes[k]) if caches else 0
                for i in range(WARM_CALLS + TIMED_CALLS):
                    for c, b in zip(caches, bounds):
                        c.bound = b
                    sync(dev)
                    t0 = time.perf_counter()
                    fwd()
                    sync(dev)
                    if r and i >= WARM_CALLS:
                        times[f][k].append(time.perf_counter() - t0)
    out = []
    for k, n in enumerate(sizes):
        med = [statistics.median(times[f][k]) for f in range(len(fills))]
        out.append({"tokens": n, "median_s": sum(med) / len(med), "spans": [[spans[f][k], t] for f, t in enumerate(med)]})
    return out


# a run's forwards by block size (tokens per row -> batched calls) and the cost curve each is priced on
BLOCK_FIELDS = {"target_block_sizes": "target", "draft_block_sizes": "draft", "drafter_block_sizes": "drafter"}


def block_size_fields(stats) -> dict[str, dict[str, float]]:
    """Forwards by block size summed over runs (an iterable of ``Stats``: ``Stats.block_sizes``), as
    report fields ``target_block_sizes`` / ``draft_block_sizes`` / ``drafter_block_sizes`` ({"n": calls}),
    and the mean live span of those forwards (``Stats.live_spans``, weighted by calls) as
    ``target_live_spans`` / ... ({"n": slots})."""
    calls: dict[str, dict[int, int]] = {}
    spans: dict[str, dict[int, list[float]]] = {}
    for st in stats:
        for kind, hist in getattr(st, "block_sizes", {}).items():
            acc = calls.setdefault(kind, {})
            mean = getattr(st, "live_spans", {}).get(kind, {})
            for n, c in hist.items():
                acc[int(n)] = acc.get(int(n), 0) + int(c)
                if n in mean:
                    w = spans.setdefault(kind, {}).setdefault(int(n), [0.0, 0.0])
                    w[0] += int(c)
                    w[1] += int(c) * float(mean[n])
    out: dict[str, dict[str, float]] = {f"{k}_block_sizes": {str(n): v[n] for n in sorted(v)} for k, v in calls.items()}
    out.update({f"{k}_live_spans": {str(n): t / c for n, (c, t) in sorted(v.items()) if c}
                for k, v in spans.items()})
    return out


def forward_fields(run: dict[str, Any]) -> SimpleNamespace:
    """A report run's forwards by block size and their live spans, shaped like ``Stats``'s."""
    def field(kind: str, name: str, cast) -> dict[int, Any]:
        return {int(n): cast(v) for n, v in (run.get(f"{kind}_{name}") or {}).items()}

    kinds = BLOCK_FIELDS.values()
    return SimpleNamespace(block_sizes={k: field(k, "block_sizes", int) for k in kinds if run.get(f"{k}_block_sizes")},
                           live_spans={k: field(k, "live_spans", float) for k in kinds if run.get(f"{k}_live_spans")})


def at_span(row: dict[str, Any], span: float | None) -> float:
    """Seconds of a curve row's forward at live span ``span``: on the line through its two timed spans
    (``spans``: [[slots, s], [slots, s]], attention grows with the span), else its ``median_s``."""
    pts = row.get("spans")
    if span is None or not pts or len(pts) < 2 or pts[0][0] == pts[1][0]:
        return float(row["median_s"])
    (l0, t0), (l1, t1) = pts[0], pts[1]
    return max(0.0, t0 + (t1 - t0) * (float(span) - l0) / (l1 - l0))


def curve_cost(rows: list[dict[str, Any]], n: int, span: float | None = None) -> float:
    """Seconds of one forward over ``n`` tokens, at live span ``span`` (``at_span``; None: the row's
    ``median_s``), from a cost curve [{"tokens", "median_s"[, "spans"]}, ...]: the measured size,
    else linear between (or beyond) the nearest two measured sizes."""
    pts = sorted((int(r["tokens"]), at_span(r, span)) for r in rows)
    for k, t in pts:
        if k == n:
            return t
    if len(pts) == 1:
        return pts[0][1]
    lo = max([p for p in pts if p[0] < n], key=lambda p: p[0], default=None) or pts[0]
    hi = min([p for p in pts if p[0] > n and p != lo], key=lambda p: p[0], default=None)
    if hi is None:  # beyond the largest: the last two points' slope
        lo, hi = pts[-2], pts[-1]
    elif lo[0] > n:  # below the smallest: the first two points' slope
        lo, hi = pts[0], pts[1]
    return max(0.0, lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0]))


def predicted_time(run: dict[str, Any], curve: dict[str, list]) -> float | None:
    """Seconds a run's forwards cost on ``curve`` (``report["cost_curve"]``): the sum over its target
    forwards of cost_target(block size, live span) and over its draft-model / EAGLE-drafter forwards of
    cost_draft / cost_drafter(block size, live span), all at the report's batch size and CFG, each block
    size at the mean live span of the run's forwards of that size (``target_live_spans``, ...; without
    them at the curve's ``median_s``): a batch whose last rows lag runs its last forwards over the
    longest spans. The prefill is
    included, priced as a 1-token forward for every method alike (its real cost, a pass over the
    condition, is the same for every method). A last batch smaller than the batch size is priced at
    the full batch's cost, like every other. Other work (sampling, acceptance, tree building) is
    left out: that is what ``efficiency`` below 1 shows. None when the run has no block sizes (a
    report from before they were recorded) or the curve lacks a kind the run used."""
    if not run.get("target_block_sizes"):
        return None
    total = 0.0
    for field_name, kind in BLOCK_FIELDS.items():
        hist = run.get(field_name) or {}
        if not hist:
            continue
        rows = curve.get(kind)
        if not rows:
            return None
        spans = run.get(f"{kind}_live_spans") or {}
        total += sum(int(c) * curve_cost(rows, int(n), spans.get(str(n))) for n, c in hist.items())
    if int(run.get("draft_forwards", 0)) and not (run.get("draft_block_sizes") or run.get("drafter_block_sizes")):
        return None
    return total
