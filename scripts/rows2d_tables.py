"""The 2-D methods' benchmark pages (docs/results/rows2d-emoji-t2i.md, rows2d-emoji.md) from their committed
JSON: ``scripts/results_tables.py`` calls :func:`page`; nothing here is typed from a run by hand.

Inputs under docs/results/data/: ``rows2d-<model>-b<batch>-t<T>.json`` (``specvis bench`` runs with their
``.quality.npz`` observations), ``rows2d-load.json`` (the machine's load average at each run's start and
end), and for emoji-t2i ``rows2d-explore-b1-t1.json`` (scripts/rows2d_explore.py, 8 prompts) and
``rows2d-explore-b1-t1-p16.json`` (the same, 16 prompts, the settings for the goals), ``rows2d-lumina-steps.json``
(scripts/rows2d_lumina_steps.py), the quality checks ``rows2d-emoji-t2i-b8-t1-q64.json`` and
``rows2d-emoji-t2i-b8-t1-q128.json`` (scripts/bench_emoji.sh rows2d-q64, rows2d-q128) and
``rows2d-batch-tail.json`` (scripts/rows2d_batch_tail.py: each sample's own forwards at batch 8 and 1).

The goals read the 128-image run for quality where it has the setting: its 4 seed groups hold 32 images
each (the batch-1 run's hold 8), and a sample's law does not depend on its batch neighbours
(tests/test_rows2d.py::test_a_sample_does_not_wait_for_its_batch_neighbours), so batch 8 samples the
batch-1 law. The step compression a goal asks for is batch 1's: the batch-1 run's, or for a setting it
lacks rows2d-batch-tail.json's batch-1 figure (the same 32 images and seeds, the same convention).

Quality noise: a method's FID proxy is "inside" AR's seed-group spread when |FID - FID(AR)| <= the std
of AR's FID proxy over its seed groups (the goal's test); class accuracy's spread is the std over the
same seed groups of the per-group accuracy, from the observations (``specvis bench`` reports none).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specvis.bench.quality import seed_groups
from specvis.bench.report import key_id, load_observations, markdown_table, run_key, side_path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "results" / "data"
RUNS = [("T=1", "t1", 1), ("T=1", "t1", 8), ("greedy", "t0", 1), ("greedy", "t0", 8)]
FAMILY = {"zipar": "ZipAR", "pjd": "PJD"}
Q64, Q128, TAIL = "rows2d-emoji-t2i-b8-t1-q64.json", "rows2d-emoji-t2i-b8-t1-q128.json", "rows2d-batch-tail.json"
TAIL128 = "rows2d-batch-tail-128.json"  # the same study with 128 images per call


def ident(run: dict) -> str:
    """A setting's identity across reports: method, config (its rule's included), rule."""
    return json.dumps([run["method"], run["config"], run["acceptance"]], sort_keys=True)


def batch1_compression() -> dict[str, float]:
    """Setting -> batch-1 step compression on the rows2d batch-1 run's 32 images: that run's figure, or
    rows2d-batch-tail.json's for a setting the run lacks (the same images, seeds and convention)."""
    out = {ident(r): r["step_compression_batch1"] for r in (_load(TAIL) or {}).get("rows", [])}
    out.update({ident(r): r["step_compression"] for r in (_load("rows2d-emoji-t2i-b1-t1.json") or {}).get("runs", [])})
    return out


def _load(name: str) -> dict | None:
    p = DATA / name
    return json.loads(p.read_text()) if p.exists() else None


def class_accuracy_spread(report: dict, name: str) -> dict[int, float]:
    """Run index -> std over the report's seed groups of the per-group class accuracy (NaN: no observations)."""
    _, obs = load_observations(side_path(DATA / name))
    n_batches = -(-report["num_images"] // report["batch_size"])
    out = {}
    for i, run in enumerate(report["runs"]):
        o = obs.get(key_id(run_key(report, run)))
        if o is None or "class_accuracy" not in o:
            out[i] = float("nan")
            continue
        groups = seed_groups(o["batch"], n_batches, report.get("quality_groups", 4))
        per = [float(np.nanmean(o["class_accuracy"][groups == g])) for g in np.unique(groups)]
        out[i] = float(np.std(per, ddof=1)) if len(per) > 1 else float("nan")
    return out


def short_labels(runs: list[dict]) -> list[str]:
    """Labels as specs: the method, the config entries that differ between its runs, and the acceptance
    rule with its entries that differ between the runs using it (``pjd:lag=4:window=16+lantern:delta=0.1``)."""
    def differ(items: list[dict]) -> set[str]:
        keys = {k for d in items for k in d}
        return {k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in items}) > 1}

    out = []
    for r in runs:
        same = [x["config"] for x in runs if x["method"] == r["method"]]
        cfg = {k: v for k, v in r["config"].items() if k != "acceptance_config"}
        keys = sorted(differ([{k: v for k, v in c.items() if k != "acceptance_config"} for c in same]))
        label = ":".join([r["method"]] + [f"{k}={cfg[k]}" for k in keys if k in cfg])
        if r["acceptance"] not in ("exact", "none"):
            rule = [x["config"].get("acceptance_config", {}) for x in runs if x["acceptance"] == r["acceptance"]]
            acc = r["config"].get("acceptance_config", {})
            label += "+" + ":".join([r["acceptance"]] + [f"{k}={acc[k]}" for k in sorted(differ(rule)) if k in acc])
        out.append(label)
    return out


def joint_labels(*reports: dict) -> list[list[str]]:
    """short_labels over the runs of several reports together, so one setting has one label in all."""
    runs = [r for rep in reports for r in rep["runs"]]
    labels, out = short_labels(runs), []
    for rep in reports:
        out.append(labels[:len(rep["runs"])])
        labels = labels[len(rep["runs"]):]
    return out


def later(run: dict) -> bool:
    """A setting added after the first pass (scripts/bench_emoji.sh rows2d ``more``: ZipAR window 1, PJD with
    LANTERN, PJD lag 2 with GSD, resumed into the same JSON): its images/s come from a later, differently
    loaded window. A run made alone ran every setting in one pass."""
    if (_load("rows2d-load.json") or {}).get("alone"):
        return False
    return (run["method"] == "zipar" and run["config"].get("window") == 1) or \
        (run["method"] == "pjd" and (run["acceptance"] == "lantern" or run["config"].get("lag") == 2))


def _noise(run: dict, ar: dict) -> str:
    q, qa = run.get("quality", {}), ar.get("quality", {})
    if run is ar or "fid_proxy" not in q or "fid_proxy_std" not in qa:
        return "-"
    d = q["fid_proxy"] - qa["fid_proxy"]
    if abs(d) <= qa["fid_proxy_std"]:
        return f"{d:+.2f} (inside)"
    both = float(np.hypot(qa["fid_proxy_std"], q.get("fid_proxy_std", 0.0)))
    side = "worse" if d > 0 else "better"
    return f"{d:+.2f} ({side}; " + ("inside the combined spread)" if abs(d) <= both else "outside the combined spread too)")


def _fid(run: dict) -> str:
    q = run.get("quality", {})
    return f"{q['fid_proxy']:.2f} ± {q['fid_proxy_std']:.2f}" if "fid_proxy_std" in q else "-"


def _acc(run: dict, std: float) -> str:
    q = run.get("quality", {})
    if "class_accuracy" not in q:
        return "-"
    return f"{q['class_accuracy']:.2f}" + ("" if np.isnan(std) else f" ± {std:.2f}")


def summary(model: str, label: str, tag: str) -> list[str]:
    """Batch 1 against batch 8 at one sampling: counts and speed, then quality with its noise."""
    names = {b: f"rows2d-{model}-b{b}-{tag}.json" for b in (1, 8)}
    reps = {b: _load(n) for b, n in names.items()}
    if any(r is None for r in reps.values()):
        return [f"({label}: run not committed yet)", ""]
    lab = dict(zip((1, 8), joint_labels(reps[1], reps[8])))
    labels = lab[1]
    by = {b: {k: r for k, r in zip(lab[b], reps[b]["runs"])} for b in (1, 8)}
    ars = {b: next(r for r in reps[b]["runs"] if r["method"] == "ar") for b in (1, 8)}
    acc = {b: class_accuracy_spread(reps[b], names[b]) for b in (1, 8)}
    idx = {b: {k: i for i, k in enumerate(lab[b])} for b in (1, 8)}
    out = [f"### {label}: step compression and speed", "",
           "| method | b1 step compression | b1 mean accepted length | b1 images/s | b1 speedup "
           "| b8 step compression | b8 mean accepted length | b8 images/s | b8 speedup | b8 / b1 step compression |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in labels:
        a, b = by[1][k], by[8].get(k)
        mark = " (later pass: speed not comparable)" if later(a) else ""
        cells = [k + mark, f"{a['step_compression']:.2f}", f"{a['mean_accepted_length']:.2f}", f"{a['images_per_s']:.3f}",
                 f"{a['speedup']:.2f}x"]
        cells += ([f"{b['step_compression']:.2f}", f"{b['mean_accepted_length']:.2f}", f"{b['images_per_s']:.3f}",
                   f"{b['speedup']:.2f}x", f"{b['step_compression'] / a['step_compression']:.2f}"] if b else ["-"] * 5)
        out.append("| " + " | ".join(cells) + " |")
    def groups(r: dict) -> int:
        return max(1, min(r.get("quality_groups", 4), -(-r["num_images"] // r["batch_size"])))

    out += ["", f"### {label}: quality (batch 1: {reps[1]['num_images']} images in {groups(reps[1])} seed groups, "
            f"batch 8: {reps[8]['num_images']} images in {groups(reps[8])} seed groups)", "",
            "| method | b1 FID proxy | b1 vs AR | b1 class acc. | b8 FID proxy | b8 vs AR | b8 class acc. |",
            "| --- | ---: | --- | ---: | ---: | --- | ---: |"]
    for k in labels:
        cells = [k]
        for bs in (1, 8):
            r = by[bs].get(k)
            cells += [_fid(r), _noise(r, ars[bs]), _acc(r, acc[bs][idx[bs][k]])] if r else ["-"] * 3
        out.append("| " + " | ".join(cells) + " |")
    def outside(bs: int, k: str) -> str | None:
        r, a = by[bs].get(k), ars[bs]
        if r is None or r is a or "fid_proxy" not in r.get("quality", {}) or "fid_proxy_std" not in a["quality"]:
            return None
        d = r["quality"]["fid_proxy"] - a["quality"]["fid_proxy"]
        return None if abs(d) <= a["quality"]["fid_proxy_std"] else ("worse" if d > 0 else "better")

    both = [k for k in labels if outside(1, k) and outside(1, k) == outside(8, k)]
    one = [f"{k} ({outside(1, k) or outside(8, k)} at batch {1 if outside(1, k) else 8} only)"
           for k in labels if k not in both and (outside(1, k) or outside(8, k))]
    rest = [k for k in labels if k not in both and not (outside(1, k) or outside(8, k)) and by[1][k] is not ars[1]]
    out += ["", "FID proxy against AR's seed-group spread: "
            + (f"outside it the same way at both batch sizes: {', '.join(f'{k} ({outside(1, k)})' for k in both)}; " if both else
               "no method is outside it the same way at both batch sizes; ")
            + (f"outside at one batch size only (not a consistent change): {', '.join(one)}; " if one else "")
            + (f"inside the noise at both: {', '.join(rest)}." if rest else "none inside the noise at both.")]
    d = ars[8]["quality"].get("fid_proxy", float("nan")) - ars[1]["quality"].get("fid_proxy", float("nan"))
    out += ["", f"AR at batch 8 against AR at batch 1 (the same law, other seeds): FID proxy {d:+.2f}, the size of "
            "pure sampling noise at these image counts."]
    return out + [""]


def goals() -> list[str]:
    """Issue 48's goals on emoji-t2i at T = 1, evaluated from the batch-1 and batch-8 runs."""
    b1, b8 = _load("rows2d-emoji-t2i-b1-t1.json"), _load("rows2d-emoji-t2i-b8-t1.json")
    if b1 is None or b8 is None:
        return ["(goals: runs not committed yet)", ""]
    lab1, lab8 = joint_labels(b1, b8)
    runs = dict(zip(lab1, b1["runs"]))
    ar = next(r for r in b1["runs"] if r["method"] == "ar")
    sjd = next(r for r in b1["runs"] if r["method"] == "sjd" and r["acceptance"] == "exact")
    spread = ar["quality"]["fid_proxy_std"]

    def inside(r: dict) -> bool:
        return abs(r["quality"]["fid_proxy"] - ar["quality"]["fid_proxy"]) <= spread

    pjd = {k: r for k, r in runs.items() if r["method"] == "pjd"}
    best = max(pjd, key=lambda k: pjd[k]["step_compression"])
    ok = {k: r for k, r in pjd.items() if inside(r)}
    best_ok = max(ok, key=lambda k: ok[k]["step_compression"]) if ok else None
    target = 1.5 * sjd["step_compression"]
    g1 = best_ok is not None and ok[best_ok]["step_compression"] >= target
    lines = ["## Goals (emoji-t2i, T = 1)", "",
             f"AR's FID proxy at batch 1: {ar['quality']['fid_proxy']:.2f} ± {spread:.2f} (seed-group std); "
             f"SJD (gumbel, w16): {sjd['step_compression']:.2f} tokens per target forward, so the first goal asks "
             f"PJD for >= {target:.2f}.", "",
             f"- PJD >= 1.5x SJD's step compression with the FID proxy inside AR's spread: **{'met' if g1 else 'not met'}** "
             "on the 32 batch-1 images (4 seed groups of 8). "
             f"Highest PJD: {best} at {pjd[best]['step_compression']:.2f} "
             f"({pjd[best]['step_compression'] / sjd['step_compression']:.2f}x SJD; FID proxy {_fid(pjd[best])}, "
             f"vs AR {_noise(pjd[best], ar)})"
             + (f"; highest with the FID proxy inside AR's spread: {best_ok} at {ok[best_ok]['step_compression']:.2f} "
                f"({ok[best_ok]['step_compression'] / sjd['step_compression']:.2f}x)." if best_ok else
                "; no PJD setting has its FID proxy inside AR's spread.")]
    q = _load(Q64)
    if q is not None:
        qar = next(r for r in q["runs"] if r["method"] == "ar")
        qlab = dict(zip(joint_labels(b1, q)[1], q["runs"]))
        hits = [k for k in pjd if pjd[k]["step_compression"] >= target and k in qlab]
        if hits:
            lines.append("  Second look at the PJD settings that reach the step compression (64 images, batch 8, seed "
                         f"{q['seed']}, below): " + "; ".join(f"{k}: FID proxy vs AR {_noise(qlab[k], qar)}" for k in hits)
                         + ".")
    cand = {k: r for k, r in runs.items() if r["method"] in ("pjd", "zipar") or r["acceptance"] == "gsd"}
    top = max(cand, key=lambda k: cand[k]["step_compression"])
    top_ok = [k for k in cand if inside(cand[k])]
    top_ok_k = max(top_ok, key=lambda k: cand[k]["step_compression"]) if top_ok else None
    g2 = top_ok_k is not None and cand[top_ok_k]["step_compression"] >= 6
    lines.append(f"- The best of PJD / ZipAR / GSD >= 6 tokens per target forward (quality kept): **{'met' if g2 else 'not met'}**"
                 " on the 32 batch-1 images. "
                 f"Highest: {top} at {cand[top]['step_compression']:.2f} (FID proxy {_fid(cand[top])}, vs AR {_noise(cand[top], ar)})"
                 + (f"; highest inside AR's spread: {top_ok_k} at {cand[top_ok_k]['step_compression']:.2f}." if top_ok_k else "."))
    lines += decision(target)
    r8 = dict(zip(lab8, b8["runs"]))
    ratios = {k: r8[k]["step_compression"] / runs[k]["step_compression"] for k in runs if k in r8 and runs[k]["method"] in ("pjd", "zipar")}
    labels = {ident(runs[k]): k for k in ratios}
    if b8.get("continuous"):  # the benchmark's batch 8 is continuous; batches run one by one: the tail study
        lines += batch_verdict(labels) + [_verdict(
            "with continuous batching (the batch-8 run, T = 1 tables below: each method's 32 images in one call through 8 rows, a "
            "finished image's row taking the next prompt)", ratios)
            + " The loss left is one tail per call (the last images' rows idle) and one prefix forward per 8 later "
              "images, instead of a tail per batch; rows2d-batch-tail.json's continuous column is the same call."
            + more_images(labels)]
    else:
        lines.append(_verdict("batches of 8 run one by one", ratios) + tail_sentence())
    return lines + [""]


def more_images(labels: dict[str, str]) -> str:
    """The continuous figure with more images per call (rows2d-batch-tail-128.json), where it was run."""
    d = _load(TAIL128)
    rows = [(labels.get(ident(r), r["spec"]), r) for r in (d or {}).get("rows", []) if "step_compression_continuous" in r]
    if not rows:
        return ""
    return (f" With {d['images']} images per call (image i prompt i mod 64, seed {d['seed']}: "
            f"[data/{TAIL128}](data/{TAIL128}), `python scripts/rows2d_batch_tail.py --prompts {d['images']}`), against "
            "batch 1 on the same images: " + ", ".join(
                f"{k}: {r['step_compression_continuous']:.2f} against {r['step_compression_batch1']:.2f}, "
                f"{r['continuous_over_batch1']:.3f} (batches of 8 one by one: "
                f"{r['step_compression_batch'] / r['step_compression_batch1']:.3f})" for k, r in rows) + ".")


def _verdict(how: str, ratios: dict[str, float]) -> str:
    low = [k for k, v in ratios.items() if v < 0.9]
    return (f"- Batch 8 step compression >= 0.9x batch 1 (PJD, ZipAR), {how}: "
            f"**{'met' if not low else 'not met for ' + ', '.join(low)}** ("
            + ", ".join(f"{k}: {v:.3f}" for k, v in ratios.items()) + ").")


def batch_verdict(labels: dict[str, str]) -> list[str]:
    """The batch goal in batches of 8 run one by one (rows2d-batch-tail.json: the same 32 images and seeds as
    the batch-1 run), for every PJD / ZipAR setting of the batch-8 table the study ran."""
    rows = {ident(r): r for r in (_load(TAIL) or {}).get("rows", [])}
    ratios = {k: rows[i]["step_compression_batch"] / rows[i]["step_compression_batch1"] for i, k in labels.items() if i in rows}
    return [_verdict("batches of 8 run one by one (rows2d-batch-tail.json)", ratios) + tail_sentence()] if ratios else []


def decision(target: float) -> list[str]:
    """The goals' verdict on the 128-image run: each setting's batch-1 step compression against the goal,
    its FID proxy against AR's seed-group spread in that run."""
    q = _load(Q128)
    if q is None:
        return []
    sc = batch1_compression()
    qar = next(r for r in q["runs"] if r["method"] == "ar")
    spread = qar["quality"]["fid_proxy_std"]
    base = _load("rows2d-emoji-t2i-b1-t1.json")
    labels = joint_labels(base, q)[1] if base else short_labels(q["runs"])  # as the quality table labels them
    acc = class_accuracy_spread(q, Q128)
    cls = {ident(r): _acc(r, acc[i]) for i, r in enumerate(q["runs"])}
    rows = [(k, r, sc.get(ident(r))) for k, r in zip(labels, q["runs"]) if r["method"] != "ar"]

    def ok(r: dict) -> bool:
        return abs(r["quality"]["fid_proxy"] - qar["quality"]["fid_proxy"]) <= spread

    def verdict(name: str, need: float, family: tuple[str, ...]) -> str:
        hits = [(k, r, c) for k, r, c in rows if c is not None and c >= need and
                (r["method"] in family or (r["acceptance"] == "gsd" and "gsd" in family))]
        good = [(k, c) for k, r, c in hits if ok(r)]
        head = (f"  {name} on the 128-image run: **{'met' if good else 'not met'}**"
                + (f" (by {', '.join(k for k, _ in good)})" if good else "") + ". ")
        if not hits:
            return head + f"No setting of it in that run reaches {need:.2f} at batch 1."
        return head + "Every setting reaching it: " + "; ".join(f"{k}: batch 1 {c:.2f}, FID proxy vs AR {_noise(r, qar)}, per seed group {paired(r, qar)}, "
                                f"class accuracy {cls[ident(r)]} (AR {cls[ident(qar)]})" for k, r, c in hits) + "."
    sjd = next((r for r in q["runs"] if r["method"] == "sjd" and r["acceptance"] == "exact"), None)
    noise = f" SJD (AR's law) lands at {_noise(sjd, qar)} there: the size of pure sampling noise." if sjd else ""
    passing = [r["quality"]["fid_proxy"] - qar["quality"]["fid_proxy"] for _, r, c in rows
               if r["method"] == "pjd" and ok(r) and c is not None and c >= target]
    if len(passing) > 1 and all(d > 0 for d in passing):
        noise += (f" Every PJD setting that passes lands on the worse side of AR ({min(passing):+.2f} to {max(passing):+.2f}): "
                  "each difference is inside the noise, but a small loss that these image counts cannot resolve is possible.")
    return [f"- Decision run ({q['num_images']} images a setting, batch 8, seed {q['seed']}, 4 seed groups of "
            f"{q['num_images'] // 4}; AR's FID proxy {_fid(qar)}; quality table below).{noise} The goal's test compares the "
            "whole run's FID proxy with AR's seed-group std, the spread of a quarter-run figure: a lenient test, so each "
            "setting also gets its per-group difference from AR (the same prompts and seeds) with its standard error.",
            verdict("PJD >= 1.5x SJD with the FID proxy inside AR's spread", target, ("pjd",)),
            verdict("The best of PJD / ZipAR / GSD >= 6 with the FID proxy inside AR's spread", 6.0, ("pjd", "zipar", "gsd"))]


def paired(run: dict, ar: dict) -> str:
    """The FID proxy's difference from AR's per seed group (the same prompts and seeds in both), mean ± its
    standard error: a finer noise test than the whole-run difference against AR's group std."""
    a, b = ar["quality"].get("fid_proxy_groups"), run["quality"].get("fid_proxy_groups")
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return "-"
    d = np.asarray(b) - np.asarray(a)
    return f"{d.mean():+.2f} ± {d.std(ddof=1) / np.sqrt(len(d)):.2f} (s.e.)"


def tail_sentence() -> str:
    """rows2d-batch-tail.json in one sentence: the batch-8 loss is the tail, or a sample was slowed."""
    d = _load(TAIL)
    if d is None:
        return ""
    rows = [r for r in d["rows"] if r["method"] == "pjd"]
    if not rows:
        return ""
    all_max = all(r["batch_forwards_equal_max_own"] for r in d["rows"])
    same = [abs(r["own_minus_batch1_forwards_mean"]) <= 2 * r["own_minus_batch1_forwards_se"] for r in rows]
    parts = [f"{r['spec']}: own {r['step_compression_own_batch']:.2f} at batch {d['batch']} against {r['step_compression_batch1']:.2f} "
             f"at batch 1 (forwards per image {r['own_minus_batch1_forwards_mean']:+.1f} ± {r['own_minus_batch1_forwards_se']:.1f} "
             f"s.e.), the batch {r['step_compression_batch']:.2f}, the tail model {r['step_compression_tail_model']:.2f}" for r in rows]
    head = (" Why (rows2d-batch-tail.json, the same 32 images and seeds, each sample's own forwards): the batch's forwards "
            + ("equal its slowest sample's own forwards in every batch" if all_max else
               "exceed its slowest sample's own forwards in some batch") + "; a sample's own step compression at batch 8 "
            + ("agrees with batch 1's within 2 standard errors" if all(same) else "differs from batch 1's by more than 2 "
               "standard errors for some setting") + " (" + "; ".join(parts) + ")")
    if all_max and all(same):
        return head + (": the loss is the tail, samples that finished waiting for the batch's slowest, not a sample slowed "
                       "by its neighbours (test_a_sample_does_not_wait_for_its_batch_neighbours).")
    return head + "."


def resumed(name: str) -> str:
    """A note when the run was resumed in several passes (rows2d-load.json lists each)."""
    stem = Path(name).stem
    passes = [r for r in (_load("rows2d-load.json") or {}).get("runs", []) if r["run"].split(" ")[0] == stem]
    if len(passes) < 2:
        return ""
    return (f" The run was resumed in {len(passes)} passes with settings added (load table above): images/s of settings "
            "from different passes are not comparable.")


def quality_check(name: str, case: str) -> list[str]:
    """A quality-only second look (more images, other seeds) at the settings nearest the goals."""
    rep = _load(name)
    if rep is None:
        return []
    sc = batch1_compression()
    ar = next(r for r in rep["runs"] if r["method"] == "ar")
    acc = class_accuracy_spread(rep, name)
    groups = max(1, min(rep.get("quality_groups", 4), -(-rep["num_images"] // rep["batch_size"])))
    out = [f"## Quality check: {rep['num_images']} images, other seeds (T = 1, batch 8)", "",
           f"From [data/{name}](data/{name}): {rep['num_images']} images per method, seed {rep['seed']} (no other run "
           f"uses it), {groups} seed groups of {rep['num_images'] // groups}; the settings nearest the goals against AR and "
           f"SJD (`scripts/bench_emoji.sh {case}`). Step compression and images/s as measured at batch 8, on the busy "
           "machine; b1 step compression: the setting's batch-1 figure on the 32 batch-1 images (the batch-1 run, "
           "or rows2d-batch-tail.json where that run lacks the setting)." + resumed(name), "",
           "| method | b1 step compression | b8 step compression | images/s | FID proxy | vs AR | class acc. |",
           "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    base = _load("rows2d-emoji-t2i-b1-t1.json")
    labels = joint_labels(base, rep)[1] if base else short_labels(rep["runs"])
    for i, (k, r) in enumerate(zip(labels, rep["runs"])):
        b1 = sc.get(ident(r))
        out.append(f"| {k} | {'-' if b1 is None else f'{b1:.2f}'} | {r['step_compression']:.2f} | {r['images_per_s']:.3f} | "
                   f"{_fid(r)} | {_noise(r, ar)} | {_acc(r, acc[i])} |")
    return out + [""]


def tail_table() -> list[str]:
    """rows2d-batch-tail.json: the batch's forwards against its samples' own, batch 8 against batch 1."""
    d = _load(TAIL)
    if d is None:
        return []
    out = ["## Batch 8: the tail, and continuous batching (counts)", "",
           f"From [data/{TAIL}](data/{TAIL}) (`python scripts/rows2d_batch_tail.py`): the {d['images']} images of the "
           f"batch-1 and batch-8 runs (image i prompt i mod 64; batch j seed {d['seed']} + j), each setting run at batch "
           f"{d['batch']} and at batch 1. A sample's *own* forwards are the rounds it was active in (from its accept map); "
           f"step compression in the bench's convention (the mean over images of {d['rows'][0]['tokens_per_sample']} image tokens "
           "/ forwards). *own* at batch 8 is the "
           "bench's mean accepted length; the tail model groups batch 1's per-image forwards into the same batches and "
           "takes each batch's maximum. Batch 1 and batch 8 draw other random numbers, so own figures agree up to "
           "sampling noise (the difference in forwards per image is given with its standard error). *Continuous*: the "
           f"same {d['images']} prompts in one call through {d['batch']} rows (`batch_size={d['batch']}`, seed "
           f"{d['seed']}), a finished image's row restarting with the next prompt (specvis/methods/slots.py); its step "
           "compression is each row's tokens over the batched forwards, the prefix forwards of the later images "
           "included.", "",
           "| method | batch 1 | own at batch 8 | own forwards - batch 1's, per image | batch 8 (the batch's forwards) "
           "| tail model | batch / own | batch forwards = slowest sample's | continuous (one call, 8 rows) "
           "| continuous / batch 1 |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in d["rows"]:
        cont = ("- | -" if "step_compression_continuous" not in r else
                f"{r['step_compression_continuous']:.2f} | {r['continuous_over_batch1']:.3f}")
        out.append(f"| {r['spec']} | {r['step_compression_batch1']:.2f} | {r['step_compression_own_batch']:.2f} | "
                   f"{r['own_minus_batch1_forwards_mean']:+.1f} ± {r['own_minus_batch1_forwards_se']:.1f} | "
                   f"{r['step_compression_batch']:.2f} | {r['step_compression_tail_model']:.2f} | "
                   f"{r['step_compression_batch'] / r['step_compression_own_batch']:.3f} | "
                   f"{'yes' if r['batch_forwards_equal_max_own'] else 'no'} | {cont} |")
    return out + [""]


def counts_table(name: str, title: str) -> list[str]:
    """A count-only JSON (rows of spec, step_compression, optionally sampling and batch) as a table."""
    d = _load(name)
    if d is None:
        return [f"({title}: not committed yet)", ""]
    rows = d["rows"]
    has_cond = "sampling" in rows[0]
    ar = {(r.get("sampling"), r.get("batch")): r for r in rows if r["spec"] == "ar"}
    head = ["sampling", "batch"] if has_cond else []
    mean = "step_compression_mean" in rows[0]  # rows2d_explore's per-image mean (the bench's convention)
    tail = ["per-image mean"] if mean else []
    out = [f"From [data/{name}](data/{name}).", "",
           "| " + " | ".join(head + ["method", "image tokens per target forward", "AR's forwards / forwards"] + tail) + " |",
           "| " + " | ".join(["---"] * len(head) + ["---", "---:", "---:"] + ["---:"] * len(tail)) + " |"]
    for r in rows:
        a = ar.get((r.get("sampling"), r.get("batch")))  # no AR row: AR's forwards are the image tokens (no row end)
        a_fwd = a["target_forwards"] if a is not None else r["tokens_per_sample"]
        cond = [r["sampling"], str(r["batch"])] if has_cond else []
        out.append("| " + " | ".join(cond + [r["spec"], f"{r['step_compression']:.2f}", f"{a_fwd / r['target_forwards']:.2f}"]
                                     + ([f"{r['step_compression_mean']:.2f}"] if mean else [])) + " |")
    return out + [""]


def speed_note() -> list[str]:
    """How the speed columns were measured: alone (rows2d-load.json says so) or on the busy shared machine."""
    if (_load("rows2d-load.json") or {}).get("alone"):
        return ["**Speed was measured alone**: one benchmark at a time, one torch thread pinned to core 0, no other "
                "job on the 2-core machine (the load averages are below). Step compression, mean accepted length "
                "and quality do not depend on the load."]
    return ["**Speed is measured on a busy shared 2-core machine** (other sessions' jobs ran alongside; the load "
            "averages are below): images/s and speedup are what that machine gave, not a timing claim. Step "
            "compression, mean accepted length and quality do not depend on the load."]


def load_table(model: str) -> list[str]:
    d = _load("rows2d-load.json")
    rows = [r for r in (d or {}).get("runs", []) if r["run"].startswith(f"rows2d-{model}-b")]
    if not rows:
        return []
    out = ["Load average of the machine (1, 5, 15 min) at each run's start and end, as /proc/loadavg read:", "",
           "| run | start (UTC) | load at start | end (UTC) | load at end |", "| --- | --- | --- | --- | --- |"]
    out += [f"| {r['run']} | {r['start']} | {r['load_start']} | {r['end']} | {r['load_end']} |" for r in rows]
    one = [x[1] for x in d.get("load_log", [])]
    if one:
        out += ["", f"Read once a minute from {d['load_log'][0][0]} to {d['load_log'][-1][0]} UTC, the 1-minute load "
                f"ranged {min(one):.2f}-{max(one):.2f} (mean {sum(one) / len(one):.2f}) on the 2 cores"
                + (": the benchmark's own thread." if d.get("alone") else ": each run had well under one core to itself.")]
    return out + [""]


INTRO = {
    "emoji-t2i": ("`emoji-t2i` (text-to-image, Janus-Pro format): ZipAR and PJD against AR, SJD and GSD",
                  "the 64 prompts of [data/emoji-t2i-prompts.txt](data/emoji-t2i-prompts.txt) (image i gets prompt i mod 64)"),
    "emoji": ("`emoji` (class-conditional LlamaGen, 11 classes): ZipAR and PJD against AR, SJD and GSD",
              "the bundle's classes in turn"),
}


def page(model: str) -> str:
    title, what = INTRO[model]
    out = [f"# {title}", "", "<!-- generated by scripts/results_tables.py from docs/results/data/: do not edit by hand -->", "",
           f"Issue 48's benchmark: `specvis bench --model {model}` on {what}, seed 777, CFG as the model's default, "
           "at T = 1 (the model's sampling) and greedy, batch 1 and 8, one timed pass, one torch thread "
           "(`OMP_NUM_THREADS=1`), `--warmup row --no-cost-curve` (the exact commands: `scripts/bench_emoji.sh rows2d "
           f"{model}`). SJD is window 16, vertical-sample init, Gumbel coupling; GSD is that SJD with `accept=gsd:group=8`; "
           "PJD and ZipAR as the spec column says (`pjd:...:accept=gsd` is PJD with GSD's rule on the top row)."
           + (" Batch 8 is continuous batching (`--continuous`): each method's images in one call through 8 rows, a "
              "finished image's row taking the next; its step compression is each row's tokens over the batched forwards."
              if (_load(f"rows2d-{model}-b8-t1.json") or {}).get("continuous") else ""), "",
           *speed_note(), "",
           "Quality: FID proxy (the bundle classifier's features against its reference set) with ± the std over "
           "the seed groups (consecutive batches; their number is in each quality table's heading); class accuracy with ± the std of the per-group "
           "accuracy. \"vs AR\" is the FID proxy's difference from AR's in the same run: *inside* when within AR's "
           "seed-group std (the goal's test, noise), else better/worse, and whether it is still within the combined spread "
           "sqrt(std_AR^2 + std^2). SJD and AR sample the same law (SJD is exact), so SJD's difference from AR is "
           "pure noise: it shows how far an equal-law method lands from AR at these image counts. The image counts (in each "
           "table's heading) are small (a 2-core machine): a "
           "group's FID proxy comes from 2-8 images, so spreads are wide and only large changes are measurable.", ""]
    out += load_table(model)
    if model == "emoji-t2i":
        out += goals()
    for label, tag in (("T = 1", "t1"), ("greedy", "t0")):
        out += [f"## {label}", ""] + summary(model, label, tag)
    if model == "emoji-t2i":
        out += quality_check(Q128, "rows2d-q128")
        out += quality_check(Q64, "rows2d-q64")
        out += tail_table()
    if model == "emoji-t2i":
        out += ["## PJD / ZipAR / GSD settings explored (counts only, batch 1, T = 1)", "",
                "`python scripts/rows2d_explore.py --prompts 8`: the first 8 prompts, seed = prompt index; no quality "
                "(the settings that matter ran in the benchmark above).", ""]
        out += counts_table("rows2d-explore-b1-t1.json", "exploration")
        if _load("rows2d-explore-b1-t1-p16.json") is not None:
            out += ["Settings for the goals, 16 prompts (`python scripts/rows2d_explore.py --prompts 16 --specs ... --out "
                    "docs/results/data/rows2d-explore-b1-t1-p16`; the specs are the JSON's): step compression pooled over "
                    "the prompts (tokens / forwards) and the bench's convention (the mean over prompts of each one's step compression).", ""]
            out += counts_table("rows2d-explore-b1-t1-p16.json", "exploration, 16 prompts")
        out += ["## Tiny Lumina-mGPT-layout model (counts only)", "",
                "`python scripts/rows2d_lumina_steps.py --prompts 16`: a random 2-layer Chameleon checkpoint with "
                "Lumina-mGPT's architecture name (64 image codes, 8 x 8 grid, one forced row-end token a row), 16 "
                "prompts, batch 1 and 8, T = 1 and greedy (CFG 3). A forced row end costs AR a forward, so AR's "
                "tokens per forward is 64 / 72; the last column is the step compression against AR. Random weights: "
                "the counts show the schedule on the row-end layout, not what a trained Lumina-mGPT reaches.", ""]
        out += counts_table("rows2d-lumina-steps.json", "Lumina layout")
    out += ["## The runs as `specvis bench` wrote them", ""]
    for label, tag, bs in RUNS:
        name = f"rows2d-{model}-b{bs}-{tag}.json"
        rep = _load(name)
        if rep is None:
            continue
        out += [f"### {label}, batch {bs}", "", f"From [data/{name}](data/{name}).", "", markdown_table(rep).rstrip(), ""]
    return "\n".join(out)
