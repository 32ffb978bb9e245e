"""The bundle target in bf16 against fp32 on this CPU: how far bf16 moves the sampling law, how far a
bf16 law depends on the block it is computed in (what "exact" means for a bf16 model), the forward
cost curve of each dtype, and AR and SJD in each dtype against the faster AR, timed image by image in one
process. One torch thread; run it alone on a core.

    taskset -c 0 python docs/results/archive/bf16_probe.py --out docs/results/archive/bf16-cpu
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specvis as sv
from specvis.bench.forward_cost import forward_cost
from specvis.cpu_features import cpu_name, native_dot_products
from specvis.io import write_text
from specvis.methods.base import GuidedModel

DTYPES = ("fp32", "bf16")


def laws(pipe: sv.Pipeline, classes: torch.Tensor, tokens: torch.Tensor, block: int) -> torch.Tensor:
    """The guided sampling law (B, N, V) of every stream position given the earlier tokens, the
    stream fed to the cached model in blocks of ``block`` tokens (1: as AR computes it)."""
    view = GuidedModel(pipe.target, classes, pipe.default_sampling, extra=block + 2)
    out = [view.prefill().probs[:, None]]
    B, N = tokens.shape
    for i in range(0, N - 1, block):
        j = min(i + block, N - 1)
        view.set_committed(torch.full((B,), i))
        out.append(view.forward(tokens[:, i:j], torch.arange(i, j)[None].expand(B, -1)).probs)
    return torch.cat(out, 1)


def tv(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Total variation per position, 1/2 sum |a - b|: mean, 99th percentile and max."""
    t = 0.5 * (a - b).abs().sum(-1).flatten()
    return {"mean": float(t.mean()), "p99": float(t.quantile(0.99)), "max": float(t.max())}


def law_distances(pipes: dict, images: int, seed: int) -> dict:
    classes = torch.arange(images) % pipes["fp32"].num_classes
    tokens = sv.generate(pipes["fp32"].target, classes, sv.AR(), pipes["fp32"].default_sampling, seed=seed).tokens
    L = {(d, k): laws(pipes[d], classes, tokens, k) for d in DTYPES for k in (1, 17)}
    one = {d: torch.cat([laws(pipes[d], classes[i:i + 1], tokens[i:i + 1], 1) for i in range(images)]) for d in DTYPES}
    return {
        "images": images,
        "positions": int(tokens.numel()),
        "fp32_vs_bf16": tv(L["fp32", 1], L["bf16", 1]),
        **{f"{d}_block1_vs_block17": tv(L[d, 1], L[d, 17]) for d in DTYPES},
        **{f"{d}_batch1_vs_batch{images}": tv(one[d], L[d, 1]) for d in DTYPES},
    }


SPEED = (("fp32", "ar"), ("bf16", "ar"), ("fp32", "sjd"), ("bf16", "sjd"))  # timed configurations


def method(name: str):
    return sv.AR() if name == "ar" else sv.SJD(window=16, init="vertical-sample", coupling="gumbel")


def speed(pipes: dict, images: int, rounds: int, seed: int) -> dict:
    """images/s at batch 1 of AR and SJD window 16 in fp32 and in bf16, timed image by image
    in turn (image i in every configuration, then image i + 1); per round, each over the faster AR."""
    for d, m in SPEED:  # warm-up
        sv.generate(pipes[d].target, torch.tensor([0]), method(m), pipes[d].default_sampling, seed=seed)
    per_round = {f"{d} {m}": [] for d, m in SPEED}
    for _ in range(rounds):
        spent = dict.fromkeys(per_round, 0.0)
        for i in range(images):
            for d, m in SPEED:
                p = pipes[d]
                t0 = time.perf_counter()
                sv.generate(p.target, torch.tensor([i % p.num_classes]), method(m), p.default_sampling, seed=seed + i)
                spent[f"{d} {m}"] += time.perf_counter() - t0
        for k in per_round:
            per_round[k].append(images / spent[k])
    fastest_ar = [max(a, b) for a, b in zip(per_round["fp32 ar"], per_round["bf16 ar"])]
    over = {k: [v / f for v, f in zip(per_round[k], fastest_ar)] for k in per_round}
    return {"images_per_round": images, "images_per_s": per_round, "over_fastest_ar": over,
            "median_over_fastest_ar": {k: statistics.median(v) for k, v in over.items()}}


def curves(pipes: dict, sizes: list[int], alternations: int) -> dict:
    """Target forward cost per dtype, the two measured in turn ``alternations`` times; median per size."""
    runs = {d: [] for d in DTYPES}
    for _ in range(alternations):
        for d in DTYPES:
            runs[d].append(forward_cost(pipes[d], sizes, batch_size=1))
    out = {}
    for d in DTYPES:
        ms = [statistics.median(r[i]["median_s"] for r in runs[d]) * 1e3 for i in range(len(sizes))]
        out[d] = [{"tokens": n, "median_ms": round(m, 3), "relative_to_1": round(m / ms[0], 3)} for n, m in zip(sizes, ms)]
    return out


def markdown(r: dict) -> str:
    lines = [f"# bf16 against fp32 on this CPU ({r['cpu']}, torch {r['torch']}, one thread)", "",
             "Written by `docs/results/archive/bf16_probe.py`; the JSON beside this file has every figure.", "",
             "## Target forward cost (batch 1, CFG: two rows), ms", "",
             "| tokens | fp32 | bf16 | fp32 / one token | bf16 / one token |", "| ---: | ---: | ---: | ---: | ---: |"]
    for a, b in zip(r["cost_curve"]["fp32"], r["cost_curve"]["bf16"]):
        lines.append(f"| {a['tokens']} | {a['median_ms']:.2f} | {b['median_ms']:.2f} | {a['relative_to_1']:.2f}x | {b['relative_to_1']:.2f}x |")
    if "speed" in r:
        s = r["speed"]
        keys = list(s["images_per_s"])
        lines += ["", "## Batch 1, timed image by image in turn (SJD: window 16, vertical-sample, Gumbel)", "",
                  "| round | " + " | ".join(f"{k} images/s" for k in keys) + " | " + " | ".join(f"{k} / fastest AR" for k in keys) + " |",
                  "| ---: |" + " ---: |" * (2 * len(keys))]
        for i in range(len(s["images_per_s"][keys[0]])):
            lines.append(f"| {i + 1} | " + " | ".join(f"{s['images_per_s'][k][i]:.3f}" for k in keys) + " | "
                         + " | ".join(f"{s['over_fastest_ar'][k][i]:.2f}x" for k in keys) + " |")
        lines += ["", "Median over rounds, against the faster AR of the same round: "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in s["median_over_fastest_ar"].items())
                  + f" ({s['images_per_round']} images a round)."]
    lines += ["", "## Sampling laws (temperature 1, CFG 3): total variation per position", "",
              f"{r['laws']['images']} AR sequences of the fp32 target, {r['laws']['positions']} positions; the law of "
              "each position given the earlier tokens, computed by the cached model.", "",
              "| pair | mean | 99th percentile | max |", "| --- | ---: | ---: | ---: |"]
    for k, v in r["laws"].items():
        if isinstance(v, dict):
            lines.append(f"| {k.replace('_', ' ')} | {v['mean']:.2e} | {v['p99']:.2e} | {v['max']:.2e} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="path prefix: writes PREFIX.json and PREFIX.md")
    p.add_argument("--images", type=int, default=32, help="images per configuration per timed round (0: no timed images)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=90)
    a = p.parse_args()
    torch.set_num_threads(1)
    pipes = {"fp32": sv.load("emoji", threads=1), "bf16": sv.load("emoji", dtype="bf16", threads=1)}
    bf16 = "with" if native_dot_products(torch.bfloat16) else "without"
    report = {"cpu": f"{cpu_name()}, {bf16} bf16 dot products", "torch": torch.__version__,
              "laws": law_distances(pipes, 8, a.seed),
              "cost_curve": curves(pipes, [1, 5, 9, 17, 33], 5)}
    if a.images:
        report["speed"] = speed(pipes, a.images, a.rounds, a.seed)
    write_text(a.out + ".json", json.dumps(report, indent=1) + "\n")
    write_text(a.out + ".md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
