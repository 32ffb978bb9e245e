"""Measured total variation of ZipAR's and PJD's output law to the target (AR) law on enumerable tiny models.

``python docs/results/archive/rows2d_tv.py [--out docs/results/archive/rows2d-tv] [--samples 30000]`` writes OUT.md and
OUT.json (about a minute on one core).

Setting: the harness's tiny random decoders (tests/exactness.py ``tiny_prompt_model``, sharpened so that
a token's law depends on the whole prefix and on position), 6 image tokens over 3 codes: 3 rows x 2
columns Emu3/Lumina-shaped (one forced row end per row; codes through the text table) and Janus-shaped
(no row end), and 2 rows x 3 columns with row ends (a PJD lower row drafts only while the row above has
at least 2 tokens more, so it needs 3 columns). Each has 3 harness prompts with CFG 2.0; 3^6 = 729 grids, whose exact law under the
sampling is enumerated by the harness (teacher-forced, ``exact_law``). At T = 1 each method draws
``samples`` grids (evenly over the prompts, batches mixing them, as the harness does) and the table gives
the mean over prompts of TV(empirical, exact); AR's own row is the sampling-noise floor at the same
count (a method whose law is AR's sits at that floor). Greedy: the fraction of prompts whose grid differs
from AR's greedy grid (a point-mass law: TV 0 or 1), and the fraction of differing tokens on a random
8x8 LlamaGen over 50 codes (8 classes), where rows overlap more.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the repository's tests/
from exactness import condition_rows, exact_law, sample_counts, tiny_llamagen, tiny_prompt_model  # noqa: E402

import specvis as sv  # noqa: E402
from specvis.io import write_text  # noqa: E402

METHODS = [
    ("ar", sv.AR()),
    ("zipar window=1", sv.ZipAR(window=1)),
    ("zipar window=2", sv.ZipAR(window=2)),
    ("pjd default (window 8, lag 8 -> width, keep 0.5)", sv.PJD()),
    ("pjd lag=1 (default window, keep 0.5)", sv.PJD(lag=1)),
    ("pjd lag=3 keep_threshold=1 (no overlap: SJD)", sv.PJD(lag=3, keep_threshold=1.0)),
    ("pjd window=2 lag=1", sv.PJD(window=2, lag=1)),
    ("pjd window=2 lag=1 keep_threshold=1", sv.PJD(window=2, lag=1, keep_threshold=1.0)),
    ("pjd window=2 lag=1 rcm=false", sv.PJD(window=2, lag=1, rcm=False)),
    ("pjd window=2 lag=1 coupling=gumbel", sv.PJD(window=2, lag=1, coupling="gumbel")),
    ("pjd window=3 lag=1", sv.PJD(window=3, lag=1)),
    ("pjd window=3 lag=1 keep_threshold=1", sv.PJD(window=3, lag=1, keep_threshold=1.0)),
]
MODELS = {"row end (Emu3/Lumina shape), 3x2": dict(row_end=1, janus=False, height=3, width=2),
          "no row end (Janus shape), 3x2": dict(row_end=0, janus=True, height=3, width=2),
          "row end (Emu3/Lumina shape), 2x3": dict(row_end=1, janus=False, height=2, width=3)}


def tv_t1(model, method, samples: int) -> tuple[float, float]:
    """(mean over prompts of TV(empirical, exact), forwards per grid) at T = 1, CFG 2."""
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0)
    law = exact_law(model, [0, 1, 2], sampling).numpy()
    counts = sample_counts(model, [0, 1, 2], method, sampling, n=samples)
    emp = counts / counts.sum(-1, keepdims=True)
    fwd = sv.generate(model, condition_rows(model, [0, 1, 2]), method, sampling, seed=0).stats.target_forwards
    return float((0.5 * np.abs(emp - law).sum(-1)).mean()), float(fwd)


def greedy_diff(model, method) -> float:
    g = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    rows = condition_rows(model, [0, 1, 2])
    a = sv.generate(model, rows, sv.AR(), g, seed=0).tokens
    b = sv.generate(model, rows, method, g, seed=0).tokens
    return float((a != b).any(1).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/results/archive/rows2d-tv")
    ap.add_argument("--samples", type=int, default=30000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, kw in MODELS.items():
        model = tiny_prompt_model(0, vocab=3, **kw)
        for name, method in METHODS:
            tv, fwd = tv_t1(model, method, args.samples)
            rows.append({"model": label, "method": name, "tv_t1": tv, "forwards_t1_batch3": fwd,
                         "greedy_grids_differing": greedy_diff(model, method)})
            print(rows[-1], flush=True)
    wide = tiny_llamagen(0, vocab=50, grid=8, num_classes=8)
    g = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    classes = torch.arange(8)
    ar = sv.generate(wide, classes, sv.AR(), g, seed=0)
    wide_rows = []
    for name, method in [("zipar window=2", sv.ZipAR(window=2)), ("zipar window=4", sv.ZipAR(window=4)),
                         ("pjd default", sv.PJD()), ("pjd window=4 lag=3", sv.PJD(window=4, lag=3)),
                         ("pjd window=4 lag=3 keep_threshold=1", sv.PJD(window=4, lag=3, keep_threshold=1.0))]:
        out = sv.generate(wide, classes, method, g, seed=0)
        diff = (out.tokens != ar.tokens).float().view(8, 8, 8).mean((0, 2))
        wide_rows.append({"method": name, "tokens_differing": float(diff.mean()), "by_row": [round(float(d), 3) for d in diff],
                          "forwards": out.stats.target_forwards, "ar_forwards": ar.stats.target_forwards})
        print(wide_rows[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"samples": args.samples, "tiny": rows, "greedy_8x8": wide_rows}
    write_text(out.with_suffix(".json"), json.dumps(data, indent=1))
    lines = ["# ZipAR and PJD: measured TV to the target law on tiny models", "",
             f"Produced by `python docs/results/archive/rows2d_tv.py --samples {args.samples}` (setting in its docstring). T = 1: mean over 3",
             "prompts of TV(empirical law of the sampled grids, exact enumerated law); AR's row is the sampling-noise",
             "floor at the same sample count. Greedy: fraction of the 3 prompts whose grid differs from AR's.", "",
             "| layout | method | TV at T = 1 | forwards (batch 3, T = 1) | greedy grids differing |",
             "| --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['method']} | {r['tv_t1']:.4f} | {r['forwards_t1_batch3']:.0f} | {r['greedy_grids_differing']:.2f} |" for r in rows]
    lines += ["", "Greedy on a random 8x8 LlamaGen over 50 codes (8 classes, CFG 2): fraction of tokens differing from AR's",
              "greedy grid, overall and by image row (rows 0 and, without row ends, 1 are AR by construction).", "",
              "| method | tokens differing | by row | forwards (AR: 64) |", "| --- | ---: | --- | ---: |"]
    lines += [f"| {r['method']} | {r['tokens_differing']:.3f} | {' '.join(f'{d:.2f}' for d in r['by_row'])} | {r['forwards']} |" for r in wide_rows]
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
