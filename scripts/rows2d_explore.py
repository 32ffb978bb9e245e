"""Count-only sweep of PJD / ZipAR / GSD settings on ``emoji-t2i`` against the 2-D methods' step-compression goals.

    python scripts/rows2d_explore.py [--prompts 16] [--batch 1] [--temperature 1] [--specs SPEC,...]
                                     [--out docs/results/data/rows2d-explore-b1-t1]

The first ``prompts`` prompts of docs/results/data/emoji-t2i-prompts.txt at the model's default sampling
(T = 1, CFG 3; ``--temperature 0``: greedy, same CFG), batch ``batch`` (seed = the batch's index), each spec
of ``SPECS`` (or of ``--specs``, a comma-separated list; a spec already in ``--out``'s JSON under the same
prompts, batch and sampling is kept, not rerun). Step compression = image tokens per sample / target
forwards, pooled over the batches; ``step_compression_mean`` is the bench's convention, the mean over
batches of ``Stats.step_compression``.
Counts only: no time, no quality (the settings worth it go to ``specvis bench`` for the FID proxy).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specvis as sv
from specvis.io import write_text
from specvis.registry import build_method, parse_method_spec

ROOT = Path(__file__).resolve().parent.parent
VR = "init=vertical-repeat"
SPECS = ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel",
         "sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=8",
         "sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=16",
         "zipar:window=1", "zipar:window=2", "zipar:window=3",
         f"pjd:window=16:lag=4:{VR}", f"pjd:window=16:lag=2:{VR}", f"pjd:window=16:lag=1:{VR}",
         f"pjd:window=32:lag=4:{VR}", f"pjd:window=16:lag=4:{VR}:keep_threshold=0",
         f"pjd:window=16:lag=4:{VR}:coupling=gumbel", f"pjd:window=16:lag=2:{VR}:coupling=gumbel",
         f"pjd:window=16:lag=4:{VR}:accept=gsd:group=8", f"pjd:window=16:lag=2:{VR}:accept=gsd:group=8",
         f"pjd:window=16:lag=4:{VR}:accept=gsd:group=16", f"pjd:window=16:lag=2:{VR}:accept=gsd:group=16",
         f"pjd:window=16:lag=4:{VR}:accept=lantern:k=50:delta=0.2",
         f"pjd:window=16:lag=4:{VR}:accept=lantern:k=50:delta=0.05", f"pjd:window=16:lag=4:{VR}:accept=lantern:k=50:delta=0.1",
         f"pjd:window=16:lag=4:{VR}:accept=lantern:k=10:delta=0.1", f"pjd:window=16:lag=2:{VR}:accept=lantern:k=50:delta=0.1",
         f"pjd:window=16:lag=2:{VR}:accept=gsd:group=16:delta_p=0.3", f"pjd:window=16:lag=4:{VR}:accept=gsd:group=8:delta_p=0.3",
         f"pjd:window=16:lag=2:{VR}:accept=gsd:group=32", f"pjd:window=16:lag=2:{VR}:accept=gsd:group=16:delta_p=0.5",
         f"pjd:window=16:lag=2:{VR}:accept=gsd:group=32:delta_p=0.5"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--specs", help="comma-separated method specs instead of SPECS")
    ap.add_argument("--out", default="docs/results/data/rows2d-explore-b1-t1")
    a = ap.parse_args()
    torch.set_num_threads(1)
    prompts = (ROOT / "docs/results/data/emoji-t2i-prompts.txt").read_text().split("\n")[: a.prompts]
    pipe = sv.load("emoji-t2i")
    d = pipe.default_sampling
    sampling = d if a.temperature == 1.0 else sv.Sampling(temperature=a.temperature, cfg_scale=d.cfg_scale)
    out = (ROOT / a.out).with_suffix(".json")
    meta = {"model": "emoji-t2i", "prompts": a.prompts, "batch": a.batch, "sampling": repr(sampling)}
    old = json.loads(out.read_text()) if out.exists() else {}
    rows = old.get("rows", []) if all(old.get(k) == v for k, v in meta.items()) else []
    for spec in a.specs.split(",") if a.specs else SPECS:
        if any(r["spec"] == spec for r in rows):
            continue
        method = build_method(*parse_method_spec(spec))
        tokens = forwards = 0
        ratios = []
        for g in range(0, len(prompts), a.batch):
            gen = pipe(prompts=prompts[g: g + a.batch], method=method, sampling=sampling, seed=g // a.batch, decode=False)
            tokens += gen.stats.tokens
            forwards += gen.stats.target_forwards
            ratios.append(gen.stats.step_compression)
        rows.append({"spec": spec, "tokens_per_sample": tokens, "target_forwards": forwards,
                     "step_compression": tokens / forwards, "step_compression_mean": sum(ratios) / len(ratios)})
        print(rows[-1], flush=True)
        write_text(out, json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
