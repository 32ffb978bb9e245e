"""Tables of docs/results/archive/successors.md from emoji-successors-b{1,8}.json (+ forward-cost-cpu.json).

``python docs/results/archive/successors_table.py`` prints the markdown tables. Predicted speedup (batch 1, SJD
only): AR's forwards against the run's forwards, both priced by the committed one-thread CPU cost
curve of the target (forward-cost-cpu.json, batch 1 with CFG), which measured exactly the block sizes
SJD feeds (window + 1 = 5, 9, 17 tokens); efficiency = measured speedup / predicted. Runs with a draft
model or drafter need the draft's curve too, and batch 8 a batch-8 curve: not measured, shown as "-".
"""

from __future__ import annotations

import json
from pathlib import Path

B = Path("docs/results/archive")


def label(run: dict) -> str:
    cfg = dict(run["config"])
    acc = cfg.pop("acceptance_config", None)
    cfg.pop("refine", None)
    cfg.pop("init", None) if run["method"] == "sjd" else None
    if run["method"] in ("eagle",):
        cfg.pop("depth", None), cfg.pop("top_k", None)
    parts = [f"{k}={v}" for k, v in cfg.items()]
    if acc:
        keep = {"gsd": ("group",), "lantern": ("k", "budget", "delta", "lam")}[run["acceptance"]]
        acc = {k: v for k, v in acc.items() if k in keep}
        if acc.get("budget") == "relative":
            acc.pop("delta", None)
        elif "lam" in acc:
            acc.pop("lam")
        parts.append(run["acceptance"] + "(" + ", ".join(f"{k}={v}" for k, v in acc.items()) + ")")
    return f"{run['method']} " + ", ".join(parts)


def table(batch: int) -> str:
    d = json.loads((B / f"emoji-successors-b{batch}.json").read_text())
    curve = {r["tokens"]: r["median_s"] for r in json.loads((B / "forward-cost-cpu.json").read_text())["rows"]}
    ar = next(r for r in d["runs"] if r["method"] == "ar")
    head = (f"batch {batch}, {d['num_images']} images, seed {d['seed']}, median of {d['repeats']} timed "
            f"repeat{'s' if d['repeats'] > 1 else ''}, {d['torch_threads']} torch thread, {d['device_name'] or d['device']}\n\n"
            "| method | lossless | mean accepted length | images/s | speedup | predicted | efficiency | FID proxy ± seed noise | class acc. |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    rows = []
    for r in d["runs"]:
        speed = r["images_per_s"] / ar["images_per_s"]
        pred = eff = "-"
        if batch == 1 and r["method"] in ("ar", "sjd"):
            block = 1 if r["method"] == "ar" else r["config"]["window"] + 1
            if block in curve:
                p = ar["target_forwards"] * curve[1] / (r["target_forwards"] * curve[block])
                pred, eff = f"{p:.2f}x", f"{speed / p:.2f}"
        q = r.get("quality", {})
        fid = f"{q['fid_proxy']:.2f} ± {q['fid_proxy_std']:.2f}" if "fid_proxy" in q else "-"
        acc = f"{q['class_accuracy']:.2f}" if "class_accuracy" in q else "-"
        rows.append(f"| {label(r)} | {'yes' if r['lossless'] else 'no'} | {r['mean_accepted_length']:.2f} | "
                    f"{r['images_per_s']:.3f} | {speed:.2f}x | {pred} | {eff} | {fid} | {acc} |")
    return head + "\n".join(rows) + "\n"


if __name__ == "__main__":
    for b in (1, 8):
        if (B / f"emoji-successors-b{b}.json").exists():
            print(table(b))
