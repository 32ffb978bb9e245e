"""Does ``torch.compile`` of the cached block stack pay on this CPU? Eager against compiled, measured
three ways on the bundle (one torch thread):

1. steady state: the median cached forward over n tokens (``specvis.bench.forward_cost``: 2 untimed
   calls, so the graph for that shape is compiled before timing);
2. one AR image, first call: what a user pays, compilation of a graph per (block size, live span
   bucket) included;
3. the same image again: every graph compiled, guards only.

    taskset -c 1 python docs/results/archive/compile_probe.py --json docs/results/archive/compile-cpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import specvis as sv
from specvis.bench.forward_cost import forward_cost
from specvis.io import write_text


def ar_image(pipe, seed: int) -> float:
    t0 = time.perf_counter()
    pipe([0], sv.AR(), seed=seed, decode=False)
    return time.perf_counter() - t0


def probe(compiled: bool, sizes: list[int], batches: list[int]) -> dict:
    pipe = sv.load("emoji", threads=1, compile="always" if compiled else False)
    out: dict = {"compile": compiled, "forward_ms": {}}
    out["ar_image_first_s"] = ar_image(pipe, 0)
    out["ar_image_again_s"] = ar_image(pipe, 1)
    for B in batches:
        rows = forward_cost(pipe, sizes, B, repeats=20)
        out["forward_ms"][str(B)] = {str(r["tokens"]): r["median_s"] * 1e3 for r in rows}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,5,17")
    p.add_argument("--batch-size", default="1,8")
    p.add_argument("--json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(t) for t in a.tokens.split(",")]
    batches = [int(b) for b in a.batch_size.split(",")]
    runs = [probe(False, sizes, batches), probe(True, sizes, batches)]
    report = {"model": "emoji", "device": "cpu", "torch": torch.__version__, "torch_threads": 1, "runs": runs}
    for r in runs:
        name = "compiled" if r["compile"] else "eager"
        print(f"{name:9s} AR image: first {r['ar_image_first_s']:.2f} s, again {r['ar_image_again_s']:.2f} s; "
              + "; ".join(f"batch {B}: " + ", ".join(f"{n} tok {ms:.2f} ms" for n, ms in v.items())
                          for B, v in r["forward_ms"].items()), flush=True)
    if a.json:
        write_text(a.json, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
