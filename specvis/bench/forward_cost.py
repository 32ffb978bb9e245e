"""Cost of one cached target forward over n new tokens, relative to n = 1: what bounds the
wall-clock speedup of any verify-n-tokens method on a given device. ``cost_curve`` measures the
target, the draft model and the EAGLE drafter at once (``specvis bench`` predicts speedups from it).

    python -m specvis.bench.forward_cost --model emoji --tokens 1,3,5,9,17,33 --batch-size 1 \
        --json docs/results/archive/forward-cost-cpu.json
"""

from __future__ import annotations

import argparse
import json

import torch

from ..cost import FILLS, KINDS, TIMED_CALLS, WARM_CALLS, CostProbe, measure  # noqa: F401 (names kept here)
from ..outputs import write_text
from ..zoo import load


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
    asked for (``specvis.cost.measure``)."""
    probe = CostProbe(sizes, repeats)
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
