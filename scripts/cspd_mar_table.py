"""Tables of docs/results/emoji-mar-cpu.md from the committed bench reports: CSpD on the emoji MAR pair
(``emoji-mar-b{1,8,64}.json``, the structure of paper 000's Table 1) and, beside it, CSpD on the
ContinuousAR pair (``emoji-cspd-b{1,8,64}.json``). Quality is the batch-64 run's (64 images); its seed
noise is the bootstrap std over those images (200 resamples of 64 with replacement) of MAR's own run.
Rewrites the blocks between ``<!-- table:NAME -->`` markers; the prose around them is kept.

    python scripts/cspd_mar_table.py docs/results/emoji-mar-cpu.md
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from specvis.bench.quality import frechet_distance
from specvis.bench.report import key_id, load_observations, run_key, side_path

BENCH = Path("docs/results/data")
BATCHES = (1, 8, 64)
RATIO_NAMES = {"paper": "paper (Eq. 4/5)", "coupled": "coupled (exact)", "trajectory": "trajectory (exact)"}


def read(stem: str) -> dict[int, dict]:
    out = {}
    for b in BATCHES:
        path = BENCH / f"{stem}-b{b}.json"
        if path.exists():
            out[b] = json.loads(path.read_text())
    return out


def cspd_runs(report: dict) -> dict[tuple, dict]:
    return {(r["config"]["ratio"], r["config"]["gamma"], r["config"]["prefill"]): r
            for r in report["runs"] if r["method"] == "cspd"}


def ar_run(report: dict) -> dict:
    return next(r for r in report["runs"] if r["method"] == "ar")


def bootstrap_noise(report_path: Path, report: dict, run: dict, n: int = 200, seed: int = 0) -> dict[str, float]:
    """Std of class accuracy and of the Frechet proxy over bootstrap resamples of the run's images."""
    refs, obs = load_observations(side_path(report_path))
    o = obs.get(key_id(run_key(report, run)))
    if not o:
        return {}
    rng = np.random.default_rng(seed)
    acc, fid = [], []
    m = len(o["class_accuracy"])
    for _ in range(n):
        i = rng.integers(0, m, m)
        acc.append(float(np.mean(o["class_accuracy"][i])))
        if "fid_proxy" in o and "fid_proxy" in refs:
            fid.append(frechet_distance(o["fid_proxy"][i], refs["fid_proxy"]))
    return {"class_accuracy": float(np.std(acc, ddof=1)), **({"fid_proxy": float(np.std(fid, ddof=1))} if fid else {})}


def fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:{spec}}{suffix}"


def speed_table(stem: str, with_quality: bool) -> str:
    reports = read(stem)
    if not reports:
        return f"(no {stem}-b*.json yet)"
    runs = {b: cspd_runs(r) for b, r in reports.items()}
    keys = sorted({k for rs in runs.values() for k in rs}, key=lambda k: (list(RATIO_NAMES).index(k[0]), k[2], k[1]))
    head = ["ratio", "gamma", "prefill", "acceptance", "tokens / target forward"]
    head += [f"batch {b} speedup" for b in BATCHES]
    if with_quality:
        head += ["class accuracy", "Frechet proxy"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    big = max(reports)  # acceptance and quality from the largest batch (most tokens)
    if with_quality:
        ar = ar_run(reports[big])
        noise = bootstrap_noise(BENCH / f"{stem}-b{big}.json", reports[big], ar)
        q = ar.get("quality", {})
        row = ["MAR's own sampler" if "mar" in stem else "AR", "-", "-", "-", fmt(ar["mean_accepted_length"])]
        row += [fmt(reports[b] and ar_run(reports[b])["images_per_s"], ".3f", " img/s") if b in reports else "-" for b in BATCHES]
        row += [f"{fmt(q.get('class_accuracy'), '.3f')} ± {fmt(noise.get('class_accuracy'), '.3f')}",
                f"{fmt(q.get('fid_proxy'), '.2f')} ± {fmt(noise.get('fid_proxy'), '.2f')}"]
        lines.append("| " + " | ".join(row) + " |")
        coarser = [json.loads(p.read_text()) for p in BENCH.glob(f"{stem}-b{big}-iter*.json")]  # bench_emoji.sh mar-steps
        for rep in sorted(coarser, key=lambda r: -r["num_iter"]):  # MAR's own sampler with fewer steps
            coarse = ar_run(rep)
            q = coarse.get("quality", {})
            row = [f"MAR's own sampler, {rep['num_iter']} steps", "-", "-", "-", fmt(coarse["mean_accepted_length"]), "-", "-",
                   fmt(coarse["images_per_s"] / ar["images_per_s"], ".2f", "x"), fmt(q.get("class_accuracy"), ".3f"),
                   fmt(q.get("fid_proxy"), ".2f")]
            lines.append("| " + " | ".join(row) + " |")
    for k in keys:
        ref = runs[big].get(k) or next(rs[k] for rs in runs.values() if k in rs)
        row = [RATIO_NAMES[k[0]], str(k[1]), fmt(k[2], "g"), fmt(ref.get("acceptance_rate")), fmt(ref["mean_accepted_length"])]
        row += [fmt(runs[b][k]["speedup"], ".2f", "x") if b in runs and k in runs[b] else "-" for b in BATCHES]
        if with_quality:
            q = ref.get("quality", {})
            few = f" (n={q['n_images']})" if q.get("n_images", big) < big else ""
            row += [fmt(q.get("class_accuracy"), ".3f") + few, fmt(q.get("fid_proxy"), ".2f") + few]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else BENCH / "cspd-mar.md")
    blocks = {"cspd-mar": speed_table("emoji-mar", True), "cspd-continuous": speed_table("emoji-cspd", True)}
    text = path.read_text()
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(<!-- /table:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no <!-- table:{name} --> block")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
