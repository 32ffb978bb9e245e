"""Where batch 8 loses step compression for the 2-D methods, and continuous batching
(docs/results/rows2d-emoji-t2i.md).

    python scripts/rows2d_batch_tail.py [--prompts 32] [--batch 8] [--seed 777] [--specs SPEC,...]
                                        [--out docs/results/data/rows2d-batch-tail.json]

On ``emoji-t2i`` at the model's sampling (T = 1, CFG 3), with the bench's work list (image i gets prompt i
mod 64, batch j seed ``seed`` + j: ``specvis.shards.batches``, so the counts are those of
``scripts/bench_emoji.sh rows2d``), each spec runs at batch ``batch`` and at batch 1. Per sample, its
*own* forwards are the rounds it was active in: every round of an unfinished sample commits >= 1 image
token (its top row), and each token's accept-map entry is the count its round committed, so the sum of
1 / entry over the grid counts them (checked against ``Stats.mean_accepted_length``). Reported:

- the batch's forwards against the maximum of its samples' own forwards (equal: nothing runs past the
  slowest sample);
- own step compression at batch ``batch`` (the mean over samples of N / own forwards, the bench's mean
  accepted length) against batch 1's on the same prompts (other seeds: equal up to sampling noise if no
  sample is slowed by a neighbour), and the mean per-image difference of forwards with its standard error;
- the tail model: batch 1's per-image forwards grouped into the same batches, max per batch, as the
  predicted batch step compression, against the measured one;
- continuous batching (``pipe(..., batch_size=batch)``, ``specvis/methods/slots.py``): all images in one
  call through ``batch`` rows, a finished image's row taking the next prompt, seed ``seed``; its step
  compression (each row's tokens over the batched forwards, the prefix forwards of later images
  included) against batch 1's.
Step compression as the bench reports it: the mean over images of N / the forwards each took.
Counts only: no time, no quality.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import specvis as sv
from specvis.cli import read_prompts
from specvis.io import write_text
from specvis.registry import build_method, describe, parse_method_spec
from specvis.shards import batches

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["pjd", "pjd:window=16:lag=4:init=vertical-repeat",
         "pjd:window=16:lag=2:init=vertical-repeat:accept=gsd:group=32:delta_p=0.5",
         "zipar:window=1"]


def own_forwards(accept_map: torch.Tensor) -> list[int]:
    """Per sample, the forwards it was active in (the prefill included): sum over its grid of 1 / entry."""
    return (1.0 / accept_map.flatten(1).double()).sum(1).round().long().tolist()


def run(pipe, prompts: list[str], method, work: list, sampling) -> tuple[int, list[tuple[int, list[int]]]]:
    """(image tokens per sample, per batch of ``work``: (the batch's target forwards, its samples' own forwards))."""
    out, N = [], 0
    for conds, seed in work:
        g = pipe(prompts=[prompts[c] for c in conds], method=method, sampling=sampling, seed=seed, decode=False)
        own = own_forwards(g.stats.accept_map)
        N = g.stats.tokens
        mal = sum(N / f for f in own) / len(own)
        if abs(mal - g.stats.mean_accepted_length) > 1e-6 * mal:
            raise RuntimeError(f"own forwards {own} disagree with mean accepted length {g.stats.mean_accepted_length}")
        out.append((g.stats.target_forwards, own))
    return N, out


def run_continuous(pipe, prompts: list[str], method, images: int, batch: int, seed: int, sampling) -> dict:
    """All ``images`` in one call through ``batch`` rows (continuous batching): its counts."""
    g = pipe(prompts=[prompts[i % len(prompts)] for i in range(images)], method=method, sampling=sampling, seed=seed,
             decode=False, batch_size=batch)
    own = own_forwards(g.stats.accept_map)
    return {"continuous_forwards": g.stats.target_forwards, "continuous_own_forwards": own,
            "step_compression_continuous": g.stats.step_compression,
            "step_compression_own_continuous": sum(g.stats.tokens / f for f in own) / len(own)}


def summarise(spec: str, N: int, b: list[tuple[int, list[int]]], one: list[tuple[int, list[int]]], batch: int) -> dict:
    own_b = [f for _, fs in b for f in fs]
    own_1 = [fs[0] for _, fs in one]
    n = len(own_b)
    batch_fwd = [f for f, _ in b]
    pred = [max(own_1[j * batch: (j + 1) * batch]) for j in range(len(b))]
    diff = [x - y for x, y in zip(own_b, own_1)]
    mean_d = sum(diff) / n
    sd = math.sqrt(sum((d - mean_d) ** 2 for d in diff) / (n - 1)) if n > 1 else float("nan")
    mean = lambda xs: sum(xs) / len(xs)
    return {
        "spec": spec, "tokens_per_sample": N, "images": n,
        "batch_forwards": batch_fwd, "batch_own_forwards": [fs for _, fs in b], "batch1_forwards": own_1,
        "batch_forwards_equal_max_own": all(f == max(fs) for f, fs in b),
        # the bench's convention (specvis.bench.runner.new_run): the mean over images of N / the forwards it took
        "step_compression_batch": mean([N / f for f in batch_fwd]),
        "step_compression_own_batch": mean([N / f for f in own_b]),  # the bench's mean accepted length
        "step_compression_batch1": mean([N / f for f in own_1]),
        "step_compression_tail_model": mean([N / f for f in pred]),
        "own_minus_batch1_forwards_mean": mean_d, "own_minus_batch1_forwards_se": sd / math.sqrt(n),
        "batch1_forwards_mean": mean(own_1),
        "batch1_forwards_sd": math.sqrt(sum((f - mean(own_1)) ** 2 for f in own_1) / (n - 1)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32, help="images (image i gets prompt i mod 64)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=777, help="batch j runs with seed + j (the bench's)")
    ap.add_argument("--specs", default=",".join(SPECS), help="comma-separated method specs")
    ap.add_argument("--out", default="docs/results/data/rows2d-batch-tail.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    prompts = read_prompts(str(ROOT / "docs/results/data/emoji-t2i-prompts.txt"))
    pipe = sv.load("emoji-t2i")
    sampling = pipe.default_sampling
    work_b = batches(a.prompts, a.batch, len(prompts), a.seed)
    work_1 = batches(a.prompts, 1, len(prompts), a.seed)
    path = ROOT / a.out
    data = json.loads(path.read_text()) if path.exists() else {}
    meta = {"model": "emoji-t2i", "images": a.prompts, "batch": a.batch, "seed": a.seed, "sampling": repr(sampling)}
    rows = data.get("rows", []) if all(data.get(k) == v for k, v in meta.items()) else []
    for spec in a.specs.split(","):
        method = build_method(*parse_method_spec(spec))
        r = next((r for r in rows if r["spec"] == spec), None)
        if r is None:
            N, b = run(pipe, prompts, method, work_b, sampling)
            _, one = run(pipe, prompts, method, work_1, sampling)
            name, config, rule = describe(method)
            r = {"method": name, "config": config, "acceptance": rule, **summarise(spec, N, b, one, a.batch)}
            rows.append(r)
        if "step_compression_continuous" not in r:  # resumed rows from before continuous batching
            r.update(run_continuous(pipe, prompts, method, a.prompts, a.batch, a.seed, sampling))
            r["continuous_over_batch1"] = r["step_compression_continuous"] / r["step_compression_batch1"]
        print(f"{spec}: batch {r['step_compression_batch']:.3f}  own at batch {a.batch} {r['step_compression_own_batch']:.3f}  "
              f"batch 1 {r['step_compression_batch1']:.3f}  tail model {r['step_compression_tail_model']:.3f}  "
              f"forwards = max own: {r['batch_forwards_equal_max_own']}  continuous {r['step_compression_continuous']:.3f} "
              f"({r['continuous_over_batch1']:.3f}x batch 1)", flush=True)
        write_text(path, json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
