"""Cost of one cached target forward over n new tokens, relative to n = 1: what bounds the
wall-clock speedup of any verify-n-tokens method on a given device.

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
from ..methods.base import GuidedModel, sync
from ..zoo import load


@torch.no_grad()
def forward_cost(pipe, sizes: list[int], batch_size: int, repeats: int = 20) -> list[dict]:
    """Median seconds of a forward over n tokens after a half-filled prefix, both CFG halves as the
    pipeline's default sampling runs them."""
    model, dev = pipe.target, pipe.device
    cond = torch.arange(batch_size, device=dev) % pipe.num_classes
    view = GuidedModel(model, cond, pipe.default_sampling, max(sizes) + 2)
    view.prefill()
    start = torch.full((batch_size,), model.layout.num_tokens // 2, device=dev)
    view.set_committed(start)
    rows = []
    for n in sizes:
        tokens = torch.randint(0, model.layout.vocab_size, (batch_size, n), device=dev)
        pos = start[:, None] + torch.arange(n, device=dev)
        times = []
        for _ in range(repeats + 2):
            sync(dev)
            t0 = time.perf_counter()
            view.forward(tokens, pos)
            sync(dev)
            times.append(time.perf_counter() - t0)
        rows.append({"tokens": n, "median_s": statistics.median(times[2:])})
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
