"""PJD's mean accepted length under ``Exact`` and under ``Coupled`` (keyed noise) on the embedded models.

    python scripts/pjd_coupled_acceptance.py [--num 16] [--seed 0] [--out docs/results/data/pjd-coupled.json]

One call per cell, fp32, T = 1, keyed noise: ``emoji`` classes 0 .. num - 1, ``emoji-t2i`` the first num / 2
prompts of docs/results/data/emoji-t2i-prompts.txt. Rows: PJD's default (rows overlapping) and its SJD
configuration (``lag`` = width, ``keep_threshold=1``: rows never overlap). Columns: ``Exact``; ``Coupled``
with its drafts raced against the keyed noise (the method as built); ``Coupled`` with each draft drawn from
its law by the generator instead (``JacobiRows.draw`` replaced for that column only), which shows what the
keyed drafts bring. Counts only (image tokens per target forward, the mean over images): no timing, so it
may run beside other work. Prints a markdown table; writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

import specvis as sv
from specvis.accept import Coupled
from specvis.methods import pjd as pjd_module
from specvis.sampling import sample

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "docs" / "results" / "data" / "emoji-t2i-prompts.txt"


def accepted(pipe, inputs: dict, method, seed: int, independent: bool = False) -> float:
    """Mean accepted length of one call; ``independent``: drafts drawn by the generator, not the keyed race."""
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
    keyed_draw = pjd_module.JacobiRows.draw
    if independent:
        pjd_module.JacobiRows.draw = lambda self, ctx, q, race, at, live: sample(q, ctx.generator)
    try:
        return pipe(**inputs, method=method, sampling=sampling, seed=seed, decode=False).stats.mean_accepted_length
    finally:
        pjd_module.JacobiRows.draw = keyed_draw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num", type=int, default=16, help="emoji images (emoji-t2i: half as many prompts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/data/pjd-coupled.json")
    a = ap.parse_args()
    if not 2 <= a.num <= 1024:
        ap.error(f"--num must be in 2..1024, got {a.num}")
    torch.manual_seed(0)
    rows = []
    for model in ("emoji", "emoji-t2i"):
        pipe = sv.load(model, dtype="float32")
        if pipe.conditioning == "class":
            inputs = {"classes": [k % pipe.num_classes for k in range(a.num)]}
        else:
            inputs = {"prompts": PROMPTS.read_text().splitlines()[: a.num // 2]}
        width = pipe.target.layout.width
        for name, kw in (("default", {}), ("no overlap", {"lag": width, "keep_threshold": 1.0})):
            row = {"model": model, "pjd": name,
                   "exact": accepted(pipe, inputs, sv.PJD(acceptance=sv.Exact(), **kw), a.seed),
                   "coupled": accepted(pipe, inputs, sv.PJD(acceptance=Coupled(), **kw), a.seed),
                   "coupled_independent_drafts": accepted(pipe, inputs, sv.PJD(acceptance=Coupled(), **kw), a.seed,
                                                          independent=True)}
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    print("| model | PJD | Exact | Coupled, keyed drafts | Coupled, drafts drawn independently |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['pjd']} | {r['exact']:.2f} | {r['coupled']:.2f} | {r['coupled_independent_drafts']:.2f} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"command": "python scripts/pjd_coupled_acceptance.py " + " ".join(sys.argv[1:]),
                                       "num": a.num, "seed": a.seed, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
