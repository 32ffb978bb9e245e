"""Cost of one cached target forward over n new tokens, relative to n = 1: what bounds the
wall-clock speedup of any verify-n-tokens method on a given device. ``cost_curve`` measures the
target, the draft model and the EAGLE drafter at once (``specvis bench`` predicts speedups from it).

    python -m specvis.bench.forward_cost --model emoji --tokens 1,3,5,9,17,33 --batch-size 1 \
        --json docs/benchmarks/forward-cost-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..io import write_text
from ..methods.base import sync
from ..models.base import KVCache
from ..zoo import load

KINDS = ("target", "draft", "drafter")
# untimed forwards of a size before its timed ones. Switching sizes costs the first forwards after the
# switch: on the Zen 5 EPYC, batch 1, the emoji target's 1-token forwards after 17-token ones took 1.91,
# 1.74, 1.46, 1.41, 1.39, 1.34 ms (the weights of wide calls are a second, packed copy:
# models/weight_layout.py). With one untimed forward a goal run's curve priced AR's forward at 1.99 ms
# while AR's decode took 1.80 ms a token; with three, 1.77 ms against 1.58
WARM_CALLS = 8
# timed forwards in a row after each warm-up, each one a repeat. One per warm-up made a curve of 20
# repeats cost 198 forwards a size (auto's calibration: 22 s at batch 1, 68 s at batch 8, emoji bundle)
TIMED_CALLS = 4
# stream fractions committed before the timed forwards: two live spans per size, through which a run's
# forwards are priced at their own mean span (``bench.report.at_span``). At batch 8 a 17-token forward
# of the emoji target took 15-17 ms at spans of 64-128 slots and 19-22 ms at 192-275, and a batch's last
# forwards, run while its slowest row catches up, have the longest spans
FILLS = (0.25, 0.75)


class _Probe:
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
                self.curve[kind] = _measure(ctx, kind, sizes, self.repeats)


def _caches(*objs) -> list:
    return [c for c in (getattr(o, "cache", None) for o in objs) if isinstance(c, KVCache)]


def _measure(ctx, kind: str, sizes: list[int], repeats: int) -> list[dict]:
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


@torch.no_grad()
def cost_curve(pipe, sizes: dict[str, list[int]], batch_size: int, repeats: int = 5, sampling=None,
               prompts: list | None = None, grid: tuple[int | None, int | None] = (None, None)) -> dict[str, list[dict]]:
    """Median seconds (of ``repeats`` timed forwards or a few more: ``TIMED_CALLS`` in a row after
    each ``WARM_CALLS`` untimed ones of their size and fill, a first such round dropped) of one cached
    forward over n tokens per row,
    for each kind of ``sizes`` ({"target": [n, ...], "draft": [...], "drafter": [...]}: the target, the
    draft model, the EAGLE drafter), at ``batch_size`` images with both CFG halves as ``sampling``
    (default: the pipeline's) runs them, after each fraction ``FILLS`` of the stream. Class-conditional
    pipelines use classes 0, 1, ...; text-to-image ones ``prompts`` (row i: prompt i mod len) on ``grid``.
    Returns {kind: [{"tokens": n, "median_s": s, "spans": [[live span, s], ...]}, ...]} for the kinds
    asked for (``_measure``)."""
    probe = _Probe(sizes, repeats)
    sampling = sampling or pipe.default_sampling
    if prompts is None:
        pipe([i % pipe.num_classes for i in range(batch_size)], probe, sampling, decode=False)
    else:
        pipe(prompts=[prompts[i % len(prompts)] for i in range(batch_size)], method=probe, sampling=sampling,
             decode=False, height=grid[0], width=grid[1])
    return probe.curve


def forward_cost(pipe, sizes: list[int], batch_size: int, repeats: int = 20, kind: str = "target",
                 **kw) -> list[dict]:
    """Seconds of a ``kind`` forward (target, draft or drafter) over n tokens mid-stream (``cost_curve``'s
    ``median_s``), both CFG halves as the pipeline's default sampling runs them (``cost_curve``), with
    ``relative_to_1``: the cost over that of the first size."""
    rows = cost_curve(pipe, {kind: list(sizes)}, batch_size, repeats, **kw)[kind]
    for r in rows:
        r["relative_to_1"] = r["median_s"] / rows[0]["median_s"]
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="emoji")
    p.add_argument("--tokens", default="1,3,5,9,17,33")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--json")
    a = p.parse_args(argv)
    pipe = load(a.model)
    rows = forward_cost(pipe, [int(t) for t in a.tokens.split(",")], a.batch_size)
    report = {"model": a.model, "device": pipe.device.type, "batch_size": a.batch_size,
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "rows": rows}
    for r in rows:
        print(f"{r['tokens']:3d} tokens: {r['median_s'] * 1e3:7.2f} ms  ({r['relative_to_1']:.2f}x one token)")
    if a.json:
        write_text(a.json, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
