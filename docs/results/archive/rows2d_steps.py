"""Step compression of ZipAR and PJD against AR, SJD and GSD on ``emoji-t2i`` (counts, no timing).

    python docs/results/archive/rows2d_steps.py [--prompts 16] [--out docs/results/archive/rows2d-steps]

The first ``prompts`` prompts of docs/results/data/emoji-t2i-prompts.txt, each method at batch 1 (each
prompt alone, seed = its index) and at batch 8 (consecutive groups of 8, seed = the group's index), at
the model's default sampling (T = 1) and greedy. Step compression = image tokens per sample / target
forwards, summed over the runs (a batch-8 forward counts once, as ``Stats.step_compression``). Also for the 2-D methods the share of
tokens committed by lower rows and the mean rows in flight (``Stats.extra``). Counts only: no wall time
is reported (the machine is shared); the quality of these settings is not measured here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specvis as sv
from specvis.io import write_text
from specvis.registry import build_method, parse_method_spec

ROOT = Path(__file__).resolve().parents[3]  # the repository: this script lives in docs/results/archive
SPECS = ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel",
         "sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd",
         "zipar:window=4", "zipar:window=8", "pjd", "pjd:init=vertical-repeat", "pjd:window=16:lag=4",
         "pjd:window=16:lag=4:init=vertical-repeat", "pjd:window=16:lag=4:init=vertical-repeat:coupling=gumbel:keep_threshold=1"]


def run(pipe, spec: str, prompts: list[str], batch: int, sampling) -> dict:
    method = build_method(*parse_method_spec(spec))
    tokens = forwards = 0
    extra: dict[str, float] = {}
    for g in range(0, len(prompts), batch):
        out = pipe(prompts=prompts[g: g + batch], method=method, sampling=sampling, seed=g // batch, decode=False)
        tokens += out.stats.tokens  # image tokens per sample: a batch's step compression is per sample
        forwards += out.stats.target_forwards
        for k, v in out.stats.extra.items():
            extra[k] = extra.get(k, 0.0) + v
    row = {"spec": spec, "batch": batch, "tokens_per_sample": tokens, "target_forwards": forwards,
           "step_compression": tokens / forwards}
    if "lower_tokens" in extra:
        row["lower_row_share"] = extra["lower_tokens"] / max(extra["lower_tokens"] + extra["top_tokens"], 1.0)
        row["mean_rows_in_flight"] = extra["mean_rows_in_flight"] / -(-len(prompts) // batch)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--out", default="docs/results/archive/rows2d-steps")
    a = ap.parse_args()
    torch.set_num_threads(1)
    prompts = (ROOT / "docs/results/data/emoji-t2i-prompts.txt").read_text().split("\n")[: a.prompts]
    pipe = sv.load("emoji-t2i")
    rows = []
    for label, sampling in (("T=1", pipe.default_sampling), ("greedy", sv.Sampling(temperature=0.0, cfg_scale=pipe.default_sampling.cfg_scale))):
        for batch in (1, 8):
            for spec in SPECS:
                r = {"sampling": label, **run(pipe, spec, prompts, batch, sampling)}
                rows.append(r)
                print(r, flush=True)
    out = ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"model": "emoji-t2i", "prompts": a.prompts, "default_sampling": repr(pipe.default_sampling), "rows": rows}
    write_text(out.with_suffix(".json"), json.dumps(data, indent=1))
    lines = ["# Step compression of the 2-D methods on emoji-t2i (counts, no timing)", "",
             f"Produced by `python docs/results/archive/rows2d_steps.py --prompts {a.prompts}` (setting in its docstring): "
             f"the first {a.prompts} prompts, default sampling `{pipe.default_sampling}` (T=1) and greedy (same CFG).", "",
             "| sampling | batch | method | step compression | batch-8 / batch-1 | lower-row share | rows in flight |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    b1 = {(r["sampling"], r["spec"]): r["step_compression"] for r in rows if r["batch"] == 1}
    for r in rows:
        ratio = f"{r['step_compression'] / b1[(r['sampling'], r['spec'])]:.2f}" if r["batch"] == 8 else "-"
        share = f"{r['lower_row_share']:.2f}" if "lower_row_share" in r else "-"
        flight = f"{r['mean_rows_in_flight']:.2f}" if "mean_rows_in_flight" in r else "-"
        lines.append(f"| {r['sampling']} | {r['batch']} | {r['spec']} | {r['step_compression']:.2f} | {ratio} | {share} | {flight} |")
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
