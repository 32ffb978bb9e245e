"""Cached forward cost on a GPU: eager, captured as a CUDA graph, and torch.compile + graph, for the
emoji target (fp32) and a random LlamaGen of GPT-L shape (24 layers, dim 1024, bf16), batch 1 with
CFG, block sizes 1..25; writes JSON (median ms over 50 replays).

    python scripts/gpu_forward_cost.py --json docs/results/data/forward-cost-h100.json
"""

import argparse
import json
import statistics
import time

import torch

import specvis as sv
from specvis.methods.base import GuidedModel
from specvis.models.llamagen import LlamaGen, LlamaGenConfig

SIZES = (1, 3, 5, 9, 17, 25)


def median_ms(fn, reps: int = 50) -> float:
    times = []
    for _ in range(reps + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:]) * 1e3


@torch.no_grad()
def curve(model, mode: str) -> list[dict]:
    view = GuidedModel(model, torch.zeros(1, dtype=torch.long, device="cuda"), sv.Sampling(cfg_scale=3.0), max(SIZES) + 2)
    view.prefill()
    start = torch.full((1,), model.layout.num_tokens // 2, device="cuda")
    view.set_committed(start)
    rows = []
    for n in SIZES:
        tok = torch.randint(0, model.layout.vocab_size, (1, n), device="cuda")
        pos = start[:, None] + torch.arange(n, device="cuda")
        fwd = lambda: view.forward(tok, pos)  # noqa: E731
        if mode == "eager":
            rows.append({"tokens": n, "ms": round(median_ms(fwd), 4)})
            continue
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fwd()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fwd()
        rows.append({"tokens": n, "ms": round(median_ms(graph.replay), 4)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--only", default="", help="measure only the models whose name contains this")
    ap.add_argument("--modes", default="eager,graph,compile+graph", help="comma-separated: eager, graph, compile+graph")
    a = ap.parse_args()
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "batch_size": 1, "cfg": True, "curves": []}
    models = {"emoji fp32": lambda: sv.load("emoji", "cuda").target,
              "gpt-l bf16 (random)": lambda: LlamaGen(LlamaGenConfig(dim=1024, n_layer=24, n_head=16)).cuda().eval().to(torch.bfloat16)}
    for name, build in models.items():
        if a.only not in name:
            continue
        for mode in a.modes.split(","):
            model = build()
            if mode == "compile+graph":
                model.compile_decoder()
            rows = curve(model, mode)
            report["curves"].append({"model": name, "mode": mode, "rows": rows})
            print(name, mode, rows, flush=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
