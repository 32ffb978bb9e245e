"""Markdown table of the committed GPU benchmarks (docs/results/data/emoji-<gpu>-b<B>-<mode>.json):
images/s per method in each mode (eager, captured rounds, captured + torch.compile), the speedup over
AR in the same mode, and the mean accepted length.

    python scripts/gpu_table.py h100 > docs/results/emoji-h100.md
"""

import json
import sys
from pathlib import Path

MODES = ("eager", "graphs", "compile")
HEAD = {"eager": "eager", "graphs": "captured rounds", "compile": "captured + compile"}


def label(run: dict) -> str:
    cfg = {k: v for k, v in run["config"].items() if k not in ("refine", "beta", "depth_step", "topk_step")}
    acc = cfg.pop("acceptance_config", None)
    text = run["method"] + (" " + ", ".join(f"{k}={v}" for k, v in cfg.items()) if cfg else "")
    return text + (f" + lantern(k={acc['k']}, delta={acc['delta']})" if acc else "")


def main(gpu: str) -> None:
    root = Path(__file__).resolve().parent.parent / "docs" / "results" / "data"
    out = [f"# emoji bundle on {gpu.upper()}", ""]
    for batch in (1, 8, 64):
        reports = {m: json.loads(p.read_text()) for m in MODES if (p := root / f"emoji-{gpu}-b{batch}-{m}.json").exists()}
        if not reports:
            continue
        first = next(iter(reports.values()))
        out += [f"## batch {batch}", "",
                f"{first['device_name']}, torch {first['torch']}, {first['dtype']}, seed {first['seed']}, temperature "
                f"{first['sampling']['temperature']}, CFG {first['sampling']['cfg_scale']}; images per mode: "
                + ", ".join(f"{HEAD[m]} {r['num_images']}" for m, r in reports.items()), "",
                "| method | mean accepted length | " + " | ".join(f"{HEAD[m]} img/s (x AR)" for m in reports) + " |",
                "| --- | ---: | " + " | ".join("---:" for _ in reports) + " |"]
        rows: dict[str, dict] = {}
        for m, r in reports.items():
            for run in r["runs"]:
                rows.setdefault(label(run), {})[m] = run
        for name, by_mode in rows.items():
            acc = next(iter(by_mode.values()))["mean_accepted_length"]
            cells = [f"{by_mode[m]['images_per_s']:.2f} ({by_mode[m]['speedup']:.2f}x)" if m in by_mode else "-" for m in reports]
            out.append(f"| {name} | {acc:.2f} | " + " | ".join(cells) + " |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "h100")
