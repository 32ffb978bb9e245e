"""A roofline PROJECTION of a committed bench report onto a memory-bound GPU (not a measurement).

Each forward of k tokens over R rows (batch x 2 with CFG) is priced at
    t(k) = max(bytes / bandwidth, flops / peak),
    bytes = 2 P + R c 2 n_layer d_kv 2        (bf16 weights read once; the K and V of c cached positions per row)
    flops = 2 P R k + 4 n_layer d R k c       (matmuls; attention scores and values)
with P the model's parameters, c the mean context (prefix + half the image), and the run's recorded
forwards by block size (``target_block_sizes``, ``draft_block_sizes``, ``drafter_block_sizes``) summed
like ``specvis.bench.report.predicted_time`` does with a measured curve. Launch latency, sampling and
acceptance work are left out: this is the ceiling of a regime where a forward costs its bytes (large
models, captured rounds), not what specvis does on a GPU today (docs/results/emoji-h100.md: the 4.5M
emoji model is launch-bound at ~5 ms a forward, where this model prices it at microseconds).

Two model sets are priced with the SAME forward counts: the models the report ran, and Janus-Pro-sized
ones (7B target, 1B draft, an EAGLE head of one 7B decoder layer reading the 7B image head): what these
speedups would be IF the large models accepted like the small ones (an assumption, labelled as such).

    python docs/results/archive/roofline.py docs/results/data/emoji-t2i-b1.json docs/results/data/emoji-t2i-b8.json \\
        --out docs/results/archive/roofline-emoji-t2i.md
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

GPUS = {  # vendor datasheet figures (dense bf16)
    "h100-sxm": {"name": "NVIDIA H100 SXM5", "bandwidth": 3.35e12, "peak": 989e12},
    "h200": {"name": "NVIDIA H200", "bandwidth": 4.8e12, "peak": 989e12},
}
BYTES = 2  # bf16


@dataclass
class Shape:
    params: float
    n_layer: int
    dim: int
    kv_dim: int

    def cost(self, k: int, rows: int, context: float, gpu: dict) -> float:
        nbytes = BYTES * self.params + rows * context * 2 * self.n_layer * self.kv_dim * BYTES
        flops = 2 * self.params * rows * k + 4 * self.n_layer * self.dim * rows * k * context
        return max(nbytes / gpu["bandwidth"], flops / gpu["peak"])


def janus_pro_7b() -> dict[str, Shape]:
    """Janus-Pro-7B's language model (30 layers, 4096 wide, MHA, FFN 11008, 16384 image codes) as
    target, Janus-Pro-1B's (24 x 2048, FFN 5632) as draft, an EAGLE head of one 7B layer plus its
    fc (2d -> d), reading the target's image head (d x 16384)."""
    def lm(n_layer: int, d: int, ffn: int, vocab: int = 16384) -> float:
        return n_layer * (4 * d * d + 3 * d * ffn) + 2 * d * vocab
    d = 4096
    head = 4 * d * d + 3 * d * 11008 + 2 * d * d + d * 16384
    return {"target": Shape(lm(30, d, 11008), 30, d, d), "draft": Shape(lm(24, 2048, 5632), 24, 2048, 2048),
            "drafter": Shape(head, 1, d, d)}


def shapes_of(model: str) -> dict[str, Shape]:
    """The report's own models, loaded to count their parameters."""
    import specvis as sv

    pipe = sv.load(model)
    out = {}
    for kind in ("target", "draft", "drafter"):
        m = getattr(pipe, kind, None)
        if m is None:
            continue
        cfg = getattr(m, "config", None)
        n_layer = getattr(cfg, "n_layer", None) or getattr(cfg, "num_hidden_layers", None) or len(getattr(m, "layers", [])) or 1
        dim = getattr(cfg, "dim", None) or getattr(cfg, "hidden_size", None)
        kv = getattr(cfg, "n_kv_head", None) or getattr(cfg, "num_key_value_heads", None)
        heads = getattr(cfg, "n_head", None) or getattr(cfg, "num_attention_heads", None)
        out[kind] = Shape(sum(p.numel() for p in m.parameters()), n_layer, dim, dim * kv // heads)
    return out


FIELDS = {"target_block_sizes": "target", "draft_block_sizes": "draft", "drafter_block_sizes": "drafter"}


def projected_time(run: dict, shapes: dict[str, Shape], rows: int, context: float, gpu: dict) -> float | None:
    if not run.get("target_block_sizes"):
        return None
    total = 0.0
    for field, kind in FIELDS.items():
        for k, count in (run.get(field) or {}).items():
            if kind not in shapes:
                return None
            total += int(count) * shapes[kind].cost(int(k), rows, context, gpu)
    return total


def table(report: dict, sets: dict[str, dict[str, Shape]], gpu: dict) -> str:
    rows = report["batch_size"] * (2 if report["sampling"]["cfg_scale"] != 1 else 1)
    L = report["runs"][0]["tokens"] / report["runs"][0]["n_images"]
    context = 16 + L / 2  # prompt/condition prefix (order of magnitude) + half the image
    ar = report["runs"][0]
    base = {name: projected_time(ar, s, rows, context, gpu) for name, s in sets.items()}
    head = ["method", "config", "tokens / forward", "measured speedup (CPU)"] + [f"projected: {n}" for n in sets]
    out = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for run in report["runs"]:
        config = {k: v for k, v in run["config"].items() if k not in ("acceptance_config", "static_shapes", "depth_range", "topk_range")}
        rule = "" if run.get("acceptance") in (None, "exact", "none") else f" ({run['acceptance']})"
        cells = [run["method"] + rule, f"`{json.dumps(config, separators=(',', ':'))}`", f"{run['mean_accepted_length']:.2f}",
                 f"{run['speedup']:.2f}x"]
        for name, s in sets.items():
            t = projected_time(run, s, rows, context, gpu)
            cells.append(f"{base[name] / t:.2f}x" if t and base[name] else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--gpu", default="h100-sxm", choices=sorted(GPUS))
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    gpu = GPUS[a.gpu]
    parts = [f"# Roofline projection: {gpu['name']} ({gpu['bandwidth'] / 1e12:.2f} TB/s, {gpu['peak'] / 1e12:.0f} "
             "TFLOP/s bf16)\n", "**A projection, not a measurement.** Generated by `docs/results/archive/roofline.py` (its docstring gives "
             "the cost model) from the forward counts of the committed CPU runs named below; the measured CPU speedup "
             "is shown beside it for reference only.\n"]
    shapes_cache: dict[str, dict[str, Shape]] = {}
    for path in a.reports:
        report = json.loads(Path(path).read_text())
        own = shapes_cache.setdefault(report["model"], shapes_of(report["model"]))
        sets = {f"{report['model']} as run": own, "Janus-Pro-7B-sized (if it accepted alike)": janus_pro_7b()}
        parts.append(f"## {Path(path).name}: batch {report['batch_size']}, CFG {report['sampling']['cfg_scale']}\n")
        parts.append(table(report, sets, gpu) + "\n")
    Path(a.out).write_text("\n".join(parts))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
