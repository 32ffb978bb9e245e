"""Step compression of ZipAR and PJD against AR, SJD and GSD on a tiny random Lumina-mGPT-layout model
(counts, no timing, no quality: random weights make no images).

    python scripts/rows2d_lumina_steps.py [--grid 8] [--codes 64] [--prompts 16] [--out docs/results/data/rows2d-lumina-steps]

The checkpoint: transformers' ``ChameleonForConditionalGeneration`` (hidden 64, 2 layers, 4 heads, 2 KV heads,
swin norm, seed 0) over a character tokenizer with the Chameleon special tokens and ``codes`` image tokens,
weights re-drawn at unit scale (matrices N(0, 1/in), embeddings N(0, 1), vectors 1 + 0.1 N or 0.1 N),
``architectures`` set to Lumina-mGPT's XLLMX class, written to a temporary directory and loaded with
``sv.load`` (the build of tests/test_chameleon.py, larger). The Lumina layout forces one row-end token per
row (``grid`` x ``grid`` image tokens, ``grid + 1`` stream positions a row). Prompts: ``prompts`` short
strings; each spec at batch 1 (seed = prompt index) and batch 8 (seed = group index), T = 1 (CFG 3) and
greedy (CFG 3). Step compression = image tokens per sample / target forwards (``Stats.step_compression``:
a batch-8 forward counts once). A random model's law is sharper and less spatial than a trained one's,
so these counts show the schedule on the row-end layout, not what a trained Lumina-mGPT would reach.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

import specvis as sv
from specvis.io import write_text
from specvis.registry import build_method, parse_method_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel",
         "sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=8",
         "zipar:window=2", "zipar:window=4", "pjd:init=vertical-repeat", "pjd:window=16:lag=4:init=vertical-repeat",
         "pjd:window=16:lag=4:init=vertical-repeat:accept=gsd:group=8"]


def make_lumina(path: Path, codes: int, seed: int = 0) -> None:
    """tests/test_chameleon.py's tiny Lumina-mGPT-layout checkpoint with ``codes`` image tokens (swin norm,
    512 positions)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_chameleon import make_chameleon

    make_chameleon(path, lumina=True, swin=True, seed=seed, codes=codes, max_positions=512)


def run(pipe, spec: str, prompts: list[str], batch: int, sampling, grid: int) -> dict:
    method = build_method(*parse_method_spec(spec))
    tokens = forwards = 0
    for g in range(0, len(prompts), batch):
        out = pipe(prompts=prompts[g: g + batch], method=method, sampling=sampling, seed=g // batch, decode=False,
                   height=grid, width=grid)
        tokens += out.stats.tokens
        forwards += out.stats.target_forwards
    return {"spec": spec, "batch": batch, "tokens_per_sample": tokens, "target_forwards": forwards,
            "step_compression": tokens / forwards}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=int, default=8)
    ap.add_argument("--codes", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--out", default="docs/results/data/rows2d-lumina-steps")
    a = ap.parse_args()
    torch.set_num_threads(1)
    words = ["a red apple", "cat", "blue sky", "green tree", "dog on grass", "sun", "fish", "car",
             "house", "moon", "bird", "flower", "hat", "boat", "star", "cake"]
    prompts = [words[i % len(words)] for i in range(a.prompts)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        make_lumina(Path(d), a.codes)
        pipe = sv.load(d)
        assert pipe.target.layout.row_end, "the checkpoint did not load with Lumina-mGPT's row-end layout"
        samplings = (("T=1", sv.Sampling(temperature=1.0, cfg_scale=3.0)), ("greedy", sv.Sampling(temperature=0.0, cfg_scale=3.0)))
        for label, sampling in samplings:
            for batch in (1, 8):
                for spec in SPECS:
                    r = {"sampling": label, **run(pipe, spec, prompts, batch, sampling, a.grid)}
                    rows.append(r)
                    print(r, flush=True)
    out = ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"model": f"tiny random Lumina-mGPT layout, {a.codes} codes, {a.grid}x{a.grid} + row ends",
            "prompts": a.prompts, "rows": rows}
    write_text(out.with_suffix(".json"), json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
