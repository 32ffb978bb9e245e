"""How far is a method's output law from the target's? Two-sample tests on continuous tokens.

``energy_test`` is the energy distance E = 2 E|X - Y| - E|X - X'| - E|Y - Y'| (Szekely & Rizzo) with a
permutation p-value; with ``strata`` (the class of each sample, both sets generated for the same class
list) labels are permuted only within a class, so class mixing adds no variance.

``python -m specvis.bench.two_sample`` draws ``--num`` images with each CSpD ratio, two independent
target-only sets (AR) and one draft-only set, all for the same balanced class list and disjoint seeds,
and compares each set with the first AR set on two views: the first token CSpD drafts (position = the
pre-filled count, where a biased ratio shows with nothing else mixed in) and the whole latent grid.
Controls: the second AR set (same law: its p-values are uniform when the test is calibrated) and the
draft-only set (a different law: the test must reject it, or it is too weak at this sample size to
say anything about the ratios). With the bundle's classifier it adds the benchmark's quality proxy
(``fid_proxy``) per set.

    python -m specvis.bench.two_sample --model emoji-continuous --num 256 --out docs/results/data/emoji-cspd-two-sample.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..outputs import write_text
from ..methods.ar import AR
from ..methods.cspd import CSpD
from ..pipeline import call_sampling


def energy_test(x: torch.Tensor, y: torch.Tensor, perms: int = 500, seed: int = 0,
                strata: torch.Tensor | None = None) -> tuple[float, float]:
    """(p-value, energy distance) of samples x (n, ...) against y (m, ...); every permutation is
    evaluated in one matmul against the pairwise distance matrix. ``strata`` (n + m,) restricts the
    permutations to exchanges inside each stratum."""
    z = torch.cat([x, y]).double().reshape(x.shape[0] + y.shape[0], -1)
    n, N = x.shape[0], z.shape[0]
    m = N - n
    D = torch.cdist(z, z)
    g = torch.Generator().manual_seed(seed)
    first = torch.arange(N) < n
    groups = [torch.arange(N)] if strata is None else [torch.nonzero(strata == s).flatten() for s in strata.unique()]
    masks = [first]
    for _ in range(perms):
        mask = torch.zeros(N, dtype=torch.bool)
        for idx in groups:  # shuffle which members of each stratum belong to x
            mask[idx] = first[idx][torch.randperm(len(idx), generator=g)]
        masks.append(mask)
    W = torch.stack(masks, 1).double()
    DW = D @ W
    xx = (W * DW).sum(0) / n ** 2
    xy = ((1 - W) * DW).sum(0) / (n * m)
    yy = ((1 - W) * (D.sum(1, keepdim=True) - DW)).sum(0) / m ** 2
    e = 2 * xy - xx - yy
    return float(((e[1:] >= e[0]).sum() + 1) / (perms + 1)), float(e[0])


def draw(pipe, method, classes: list[int], batch_size: int, seed: int) -> tuple[torch.Tensor, dict, float]:
    """Latents (n, L, C) of ``method`` for ``classes``, batch j seeded ``seed + j``; mean extras; wall seconds."""
    out, extras, wall = [], {}, 0.0
    for j, start in enumerate(range(0, len(classes), batch_size)):
        g = pipe(classes[start:start + batch_size], method, seed=seed + j, decode=False)
        out.append(g.latents)
        wall += g.stats.wall_s
        for k, v in g.stats.extra.items():
            extras[k] = extras.get(k, 0.0) + float(v) * len(g.latents) / len(classes)
    return torch.cat(out), extras, wall


def run(pipe, num: int, batch_size: int, gamma: int, prefill: float, perms: int, seed: int = 0,
        ratios: tuple[str, ...] = ("paper", "coupled", "trajectory"), data_dir: str | None = None) -> dict:
    classes = [i % pipe.num_classes for i in range(num)]
    strata = torch.tensor(classes + classes)
    draft_only = dataclasses.replace(pipe, target=pipe.draft, draft=None)
    methods = [("ar", AR(), pipe), ("ar (control)", AR(), pipe), ("draft only (control)", AR(), draft_only)] \
        + [(f"cspd {r}", CSpD(gamma, prefill, ratio=r), pipe) for r in ratios]
    first_drafted = CSpD(gamma, prefill).prefill_tokens(pipe.target.layout.num_tokens)
    metric = _proxy(pipe, data_dir)
    sets, rows = {}, []
    for i, (label, method, runner) in enumerate(methods):
        t = time.monotonic()
        lat, extras, wall = draw(runner, method, classes, batch_size, seed + 10_000 * i)
        sets[label] = lat
        row = {"set": label, "seed": seed + 10_000 * i, "wall_s": round(wall, 2), **{k: round(v, 4) for k, v in extras.items()
                                                                                     if k in ("acceptance_rate", "resample_tries", "resample_fallbacks")}}
        if i > 0:
            ref = sets["ar"]
            p_tok, e_tok = energy_test(lat[:, first_drafted], ref[:, first_drafted], perms, seed, strata)
            p_img, e_img = energy_test(lat, ref, perms, seed, strata)
            row.update(first_drafted_token={"energy": round(e_tok, 5), "p": round(p_tok, 4)},
                       image={"energy": round(e_img, 5), "p": round(p_img, 4)})
        if metric is not None:
            from .quality import summarize

            images = np.stack([np.asarray(im.convert("RGB")) for im in pipe.to_images(lat)])
            obs = metric.observe(images, np.asarray(classes))
            q = summarize(obs, metric.references)
            row.update(fid_proxy=round(q["fid_proxy"], 3), class_accuracy=round(q["class_accuracy"], 3))
        rows.append(row)
        print(json.dumps(row), f"({time.monotonic() - t:.0f}s)", flush=True)
    return {"model": pipe.name, "num_images": num, "batch_size": batch_size, "gamma": gamma, "prefill": prefill,
            "first_drafted_position": first_drafted, "permutations": perms, "torch_threads": torch.get_num_threads(),
            "sampling": vars(call_sampling(pipe)),  # what the calls ran with (the noise resolved)
            "sets": rows}


def _proxy(pipe, data_dir: str | None):
    """The bundle's classifier proxy metric, or None."""
    from .quality import QualitySource, build_metrics

    metrics = build_metrics(None, QualitySource(pipe, Path(data_dir) if data_dir else None), warn=lambda _: None)
    return metrics[0] if metrics else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.bench.two_sample", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="emoji-continuous")
    p.add_argument("--num", type=int, default=256, help="images per set")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--gamma", type=int, default=8)
    p.add_argument("--prefill", type=float, default=0.05)
    p.add_argument("--perms", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSON report")
    a = p.parse_args(argv)
    try:
        from ..zoo import load

        if a.num < 2 or a.batch_size < 1 or a.perms < 1:
            raise ValueError("--num must be >= 2, --batch-size and --perms >= 1")
        report = run(load(a.model), a.num, a.batch_size, a.gamma, a.prefill, a.perms, a.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.out:
        write_text(a.out, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
