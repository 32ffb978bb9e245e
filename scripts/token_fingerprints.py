"""Tokens of every method on every embedded model at fixed seeds, as hashes: a check that a reshaping
of the code changes no output.

Each case runs one method spec (the bench's spec strings) on one bundle through the public pipeline
call, at a fixed seed, batch and sampling (stream noise, pinned: ``noise="stream"``, so that the hashes
stay those of the draws from the call's seeded stream whatever the library's default noise), and records a SHA-256 of the tokens (continuous models:
of the latents rounded to 5 decimals) and the target forward count. ``--out FILE`` writes them;
``--check FILE`` reruns and prints every case that differs (exit 1 if any). Same machine, same torch
build: float rounding in the kernels can differ across CPUs, so this is a before/after check of one
change on one machine, not a CI test.

    python scripts/token_fingerprints.py --out /tmp/before.json     # before the change
    python scripts/token_fingerprints.py --check /tmp/before.json   # after it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

import specvis as sv
from specvis.registry import method_from_spec

SAMPLED = {"temperature": 1.0}
GREEDY = {"temperature": 0.0}

# (bundle, call arguments, sampling overrides, method specs)
CASES = [
    ("emoji", {"classes": [0, 7]}, SAMPLED,
     ["ar", "speculative:gamma=4", "sjd:window=8:coupling=none", "sjd:window=16:coupling=maximal:init=horizontal-sample",
      "sjd:window=16:init=vertical-sample", "sjd:window=8:accept=lantern:k=20:delta=0.2",
      "sjd:window=8:accept=lantern:k=10:budget=relative:lam=5", "sjd:window=8:accept=gsd:group=25",
      "speculative:gamma=3:accept=gsd", "eagle:depth=4:top_k=4:total_tokens=16", "adt:init=vertical:total_tokens=16",
      "adt:init=random:total_tokens=12:static_shapes=true", "static-tree", "static-tree:tree=chain",
      "eagle:total_tokens=24:accept=lantern:k=20"]),
    ("emoji", {"classes": [1]}, GREEDY,
     ["ar", "jacobi:window=8", "sjd:window=8", "speculative:gamma=4", "eagle:total_tokens=16", "static-tree"]),
    ("emoji-t2i", {"prompts": ["cat face"]}, SAMPLED,
     ["ar", "sjd:window=16:init=vertical-sample", "speculative:gamma=4", "eagle:total_tokens=16", "adt:total_tokens=16",
      "static-tree"]),
    ("random-tiny", {"classes": [0, 1, 2, 3]}, SAMPLED,
     ["ar", "sjd:window=4:coupling=none", "speculative:gamma=2", "eagle:total_tokens=12"]),
    ("emoji-continuous", {"classes": [2]}, SAMPLED, ["ar", "cspd:gamma=4:ratio=coupled"]),
    ("emoji-mar", {"classes": [2]}, SAMPLED, ["ar", "cspd:gamma=4"]),
]
SEED = 1234


def fingerprint(out) -> str:
    if getattr(out, "latents", None) is not None:
        data = torch.round(out.latents.float().cpu() * 1e5).to(torch.int64)
    else:
        data = out.tokens.cpu().to(torch.int64)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]


def run_all() -> dict[str, dict]:
    torch.set_num_threads(1)
    results = {}
    for bundle, call, sampling, specs in CASES:
        pipe = sv.load(bundle)
        s = sv.Sampling(**{**vars(pipe.default_sampling), "noise": "stream", **sampling})
        for spec in specs:
            key = f"{bundle} | {json.dumps(call)} | T={s.temperature} | {spec}"
            t0 = time.perf_counter()
            out = pipe(method=method_from_spec(spec), sampling=s, seed=SEED, decode=False, **call)
            results[key] = {"tokens": fingerprint(out), "target_forwards": out.stats.target_forwards}
            print(f"{time.perf_counter() - t0:6.1f}s  {key}: {results[key]}", file=sys.stderr, flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the fingerprints here")
    g.add_argument("--check", help="compare with fingerprints written before")
    a = ap.parse_args()
    results = run_all()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {len(results)} fingerprints to {a.out}")
        return 0
    before = json.loads(Path(a.check).read_text())
    bad = [k for k in sorted(set(before) | set(results)) if before.get(k) != results.get(k)]
    for k in bad:
        print(f"DIFFERS {k}: before {before.get(k)} after {results.get(k)}")
    print(f"{len(results) - len(bad)} of {len(set(before) | set(results))} cases equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
