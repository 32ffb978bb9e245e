"""Bench reports: run keys, JSON layout, markdown table, run labels, and merging shard reports."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from ..cost import (BLOCK_FIELDS, forward_fields, at_span, block_size_fields, curve_cost,  # noqa: F401 (names kept here)
                    predicted_time)
from ..io import read_text
from ..outputs import write_arrays, write_text
from .quality import seed_groups, summarize

# report fields that, with a run's method/config/acceptance, identify a completed configuration
KEY_FIELDS = ("model", "device", "batch_size", "num_images", "seed", "sampling", "shards", "shard_index")
OPTIONAL_KEY_FIELDS = ("num_iter", "continuous")  # in the key only where the report has them (older keys stay valid)
TIMING_FIELDS = ("wall_s", "wall_s_repeats", "images_per_s", "speedup", "speedup_rounds", "predicted_speedup",
                 "efficiency", "forward_s_repeats", "forward_share", "round_efficiency", "forward_vs_curve")


MARKER = ("specvis_report", "bench")  # the first field of every report ``run_bench`` writes


def is_bench_report(obj: Any) -> bool:
    """Whether ``obj`` (a parsed JSON file) is a bench report: a JSON object carrying ``MARKER``, or one
    written before the marker (``specvis_version``, ``model`` and a list of run objects)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("runs"), list) or not all(isinstance(r, dict) for r in obj["runs"]):
        return False
    return obj.get(MARKER[0]) == MARKER[1] or ("specvis_version" in obj and "model" in obj)


def read_report(path: str | Path, what: str = "--json") -> dict[str, Any]:
    """The bench report at ``path`` (a regular file, ``io.read_text``), or one line naming ``what`` that
    says it is not one: nothing that is not a report is ever taken for one (or overwritten)."""
    try:
        obj = json.loads(read_text(path, what))
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path}: not a specvis bench report (not JSON: {e.msg}, line {e.lineno}); "
                         f"give another path or move the file") from None
    if not is_bench_report(obj):
        raise ValueError(f"{what} {path}: not a specvis bench report (a JSON {type(obj).__name__} without its "
                         f"{MARKER[0]!r} field); give another path or move the file")
    return obj


def run_key(report: dict[str, Any], run: dict[str, Any]) -> str:
    """Canonical key of a run within a report (what resume matches on)."""
    key = {k: report.get(k, 1 if k == "shards" else 0 if k == "shard_index" else None) for k in KEY_FIELDS}
    key.update({k: report[k] for k in OPTIONAL_KEY_FIELDS if k in report})
    key.update(method=run["method"], config=run["config"], acceptance=run["acceptance"])
    return json.dumps(key, sort_keys=True)


def key_id(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def paired_speedups(run: dict[str, Any], ar: dict[str, Any]) -> list[float] | None:
    """Per round of interleaved passes, the run's images/s over AR's in the same round (None when
    the passes were not interleaved or the two runs have different pass counts)."""
    walls, ar_walls = run.get("wall_s_repeats") or [], ar.get("wall_s_repeats") or []
    if len(walls) != len(ar_walls) or len(walls) < 2 or min(walls + ar_walls) <= 0:
        return None
    return [(run["n_images"] / w) / (ar["n_images"] / a) for w, a in zip(walls, ar_walls)]


def forward_shares(run: dict[str, Any]) -> list[float] | None:
    """Per timed pass, the share of its wall-clock spent inside model forwards (``forward_s_repeats``
    over ``wall_s_repeats``), or None where the passes were not timed that way (off CPU, older reports)."""
    fwd, walls = run.get("forward_s_repeats") or [], run.get("wall_s_repeats") or []
    if not fwd or len(fwd) != len(walls) or min(walls) <= 0:
        return None
    return [f / w for f, w in zip(fwd, walls)]


def set_speedups(report: dict[str, Any]) -> None:
    """``speedup`` = images_per_s over the ``ar`` run's (the first run); with interleaved passes
    (``pass_order``) the median over rounds of that ratio within each round (``speedup_rounds``), so
    that a machine drifting between rounds cancels. With a ``cost_curve`` in the report:
    ``predicted_speedup`` = AR's predicted time over the run's (``predicted_time``: what the forwards
    alone would take on this device; AR's is exactly 1) and ``efficiency`` = speedup /
    predicted_speedup (how much of the forward-bound speedup the run realises).

    Where the passes timed their forwards (``forward_s_repeats``, CPU), the efficiency splits in two:
    ``forward_share`` (median over passes of the wall-clock share inside forwards),
    ``round_efficiency`` = median over rounds of the run's share over AR's in the same round, i.e. the
    speedup over what the forwards, as they ran in the decode, allow (1 - the round's other work beyond
    AR's), and ``forward_vs_curve`` = the forwards' median seconds in a pass over their price on the
    curve (above 1: a forward costs more in the decode than repeated alone, e.g. a draft model whose
    weights the target's forward pushed out of cache). efficiency = round_efficiency x AR's
    forward_vs_curve / the run's, up to the medians."""
    runs = report["runs"]
    ar = next((r for r in runs if r["method"] == "ar"), runs[0] if runs else None)
    curve = report.get("cost_curve") or {}
    t_ar = predicted_time(ar, curve) if ar and curve else None
    interleaved = str(report.get("pass_order", "")).startswith("interleaved")
    ar_shares = forward_shares(ar) if ar else None
    for r in runs:
        rounds = paired_speedups(r, ar) if ar and interleaved else None
        if rounds is not None:
            r["speedup_rounds"] = rounds
            r["speedup"] = statistics.median(rounds)
        else:
            r.pop("speedup_rounds", None)
            r["speedup"] = r["images_per_s"] / ar["images_per_s"] if ar and ar["images_per_s"] > 0 else float("nan")
        for k in ("forward_share", "round_efficiency", "forward_vs_curve", "predicted_speedup", "efficiency"):
            r.pop(k, None)
        shares = forward_shares(r)
        if shares is not None:
            r["forward_share"] = statistics.median(shares)
            if interleaved and ar_shares is not None and len(ar_shares) == len(shares):
                r["round_efficiency"] = statistics.median(s / a for s, a in zip(shares, ar_shares))
        t = predicted_time(r, curve) if t_ar else None
        if t is None or t <= 0:
            continue
        r["predicted_speedup"] = t_ar / t
        r["efficiency"] = r["speedup"] / r["predicted_speedup"]
        if shares is not None:
            r["forward_vs_curve"] = statistics.median(r["forward_s_repeats"]) / t


def dumps(obj: Any, indent: int = 1, _level: int = 0) -> str:
    """JSON with dicts indented and lists of scalars (accept maps) kept on one line each."""
    pad, inner = " " * (indent * _level), " " * (indent * (_level + 1))
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent, _level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and any(isinstance(v, (dict, list)) for v in obj):
        if all(isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v) for v in obj):
            return "[" + ", ".join(json.dumps(v) for v in obj) + "]"
        return "[\n" + ",\n".join(inner + dumps(v, indent, _level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def side_path(json_path: str | Path) -> Path:
    """The quality observations file next to a report JSON (``X.json`` -> ``X.quality.npz``)."""
    p = Path(json_path)
    return p.with_name(p.stem + ".quality.npz")


def save_observations(path: Path, refs: dict[str, np.ndarray], obs: dict[str, dict[str, np.ndarray]]) -> None:
    """Reference features and per-run observations (incl. ``labels`` and ``batch``), atomically."""
    arrays = {f"ref__{k}": v for k, v in refs.items()}
    for rid, d in obs.items():
        arrays.update({f"run__{rid}__{k}": v for k, v in d.items()})
    write_arrays(path, arrays)


def load_observations(path: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Inverse of :func:`save_observations`; ({}, {}) when the file is absent or unreadable."""
    refs: dict[str, np.ndarray] = {}
    obs: dict[str, dict[str, np.ndarray]] = {}
    try:
        with np.load(path) as z:
            for name in z.files:
                parts = name.split("__")
                if parts[0] == "ref":
                    refs[parts[1]] = z[name]
                elif parts[0] == "run":
                    obs.setdefault(parts[1], {})[parts[2]] = z[name]
    except (OSError, ValueError):
        return {}, {}
    return refs, obs


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, dumps(report) + "\n")


# ------------------------------------------------------------------------------------------ labels


def _cfg_text(config: dict[str, Any]) -> str:
    """``k=v, ...``; a list of consecutive integers longer than 3 as ``first..last`` (auto's probe classes)."""
    def text(v: Any) -> str:
        if isinstance(v, list) and len(v) > 3 and all(isinstance(x, int) for x in v) and v == list(range(v[0], v[-1] + 1)):
            return f"{v[0]}..{v[-1]}"
        return str(v)
    return ", ".join(f"{k}={text(v)}" for k, v in config.items()) or "-"


def run_labels(runs: list[dict[str, Any]]) -> list[str]:
    """Short unique labels: method (+ acceptance unless exact/none), plus the config entries that
    differ between runs sharing that label."""
    base = [r["method"] + ("" if r["acceptance"] in ("exact", "none") else f"+{r['acceptance']}") for r in runs]
    out = list(base)
    for label in set(base):
        same = [i for i, b in enumerate(base) if b == label]
        if len(same) < 2:
            continue
        keys = sorted({k for i in same for k in runs[i]["config"]})
        differ = [k for k in keys if len({json.dumps(runs[i]["config"].get(k), sort_keys=True) for i in same}) > 1]
        for i in same:
            cfg = runs[i]["config"]
            out[i] = label + "(" + ", ".join(f"{k}={cfg.get(k)}" for k in differ) + ")"
    return out


# ------------------------------------------------------------------------------------------ markdown

QUALITY_COLUMNS = (("fid_proxy", "FID proxy", ".2f"), ("class_accuracy", "class acc.", ".2f"),
                   ("fid", "FID", ".2f"), ("clip_score", "CLIP score", ".2f"))


EXTRA_COLUMNS = (("mean_tree_depth", "mean tree depth"), ("acceptance_rate", "acceptance rate"))
FORWARD_COLUMNS = (("forward_vs_curve", "forwards / curve"), ("round_efficiency", "round efficiency"))


def markdown_table(report: dict[str, Any]) -> str:
    """The runs of a report as a markdown table (quality columns when any run has them)."""
    n = report.get("n_images") or report["num_images"]
    shard = f", shard {report['shard_index']} of {report['shards']}" if report.get("shards", 1) > 1 else ""
    head = (f"model `{report['model']}` on {report['device']} ({report.get('device_name', '')}), "
            f"batch {report['batch_size']}, {n} images, seed {report['seed']}{shard}, "
            f"torch {report['torch']}" + (f", {report['dtype']}" if report.get("dtype", "float32") != "float32" else "")
            + f", median of {report.get('repeats', 1)}"
            + (f" passes ({report['pass_order']})" if report.get("pass_order") and report.get("repeats", 1) > 1 else "")
            + "\n\n")
    qcols = [c for c in QUALITY_COLUMNS if any(c[0] in r.get("quality", {}) for r in report["runs"])]
    xcols = [c for c in EXTRA_COLUMNS if any(c[0] in r for r in report["runs"])]
    pcols = any("predicted_speedup" in r for r in report["runs"])
    fcols = [c for c in FORWARD_COLUMNS if any(c[0] in r for r in report["runs"])]
    cols = ["method", "config", "acceptance", "lossless", "step compression", "mean accepted length"] \
        + [c[1] for c in xcols] + ["images/s", "speedup"] + (["predicted speedup", "efficiency"] if pcols else []) \
        + [c[1] for c in fcols] + [c[1] for c in qcols]
    rows = ["| " + " | ".join(cols) + " |", "| " + " | ".join(["---"] * 4 + ["---:"] * (len(cols) - 4)) + " |"]
    for r in report["runs"]:
        cells = [r["method"], _cfg_text(r["config"]), r["acceptance"], "yes" if r["lossless"] else "no",
                 f"{r['step_compression']:.2f}", f"{r['mean_accepted_length']:.2f}"] \
            + [f"{r[k]:.2f}" if k in r else "-" for k, _ in xcols] + [f"{r['images_per_s']:.3f}", f"{r['speedup']:.2f}x"]
        if pcols:
            cells += [f"{r['predicted_speedup']:.2f}x" if "predicted_speedup" in r else "-",
                      f"{r['efficiency']:.2f}" if "efficiency" in r else "-"]
        cells += [f"{r[k]:.2f}" if k in r else "-" for k, _ in fcols]
        q = r.get("quality", {})
        for key, _, fmt in qcols:
            v = q.get(key)
            cell = "-" if v is None else format(v, fmt)
            if v is not None and f"{key}_std" in q:
                cell += f" ± {format(q[f'{key}_std'], fmt)}"
            cells.append(cell)
        rows.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n" + _table_notes(report, n, bool(qcols), pcols, bool(fcols))


def _table_notes(report: dict[str, Any], n: int, qcols: bool, pcols: bool, fcols: bool) -> str:
    """What the table's quality, speedup, predicted-speedup and forward columns mean, for those it has."""
    note = ""
    per_batch = report.get("pass_order") == "interleaved per batch"
    if qcols:
        nq = next((r["quality"].get("n_images") for r in report["runs"] if r.get("quality")), n)
        g = report.get("quality_groups", 4)
        share = "a quarter" if g == 4 else f"1/{g}"
        note = (f"\nQuality over {nq} images per method; ± is the std of the metric over "
                f"{g} seed groups ({share} of the images each), so differences well inside it are noise.\n")
    if any(r.get("speedup_rounds") for r in report["runs"]):
        note += ("\nSpeedup: in each round of passes (every method's pass r"
                 + (", batch by batch: batch 1 of every method, then batch 2, ..." if per_batch else "")
                 + "), the run's images/s over AR's; the median over rounds ("
                 + ("drift within and between rounds cancels" if per_batch else "drift between rounds cancels") + ").\n")
    if pcols:
        spans = any(r.get("target_live_spans") for r in report.get("runs", [])) and any(
            row.get("spans") for row in (report.get("cost_curve") or {}).get("target", []))
        note += ("\nPredicted speedup: AR's forward time over the run's, from the forward cost curve (target, "
                 "draft, drafter by block size" + (", at the mean live span of the run's forwards" if spans else "")
                 + ") measured in the same benchmark"
                 + (" during the passes (median of its samples)" if per_batch
                    else " after every round of passes (median over rounds)" if report.get("pass_order") == "interleaved" else "")
                 + "; efficiency = speedup / predicted.\n")
    if fcols:
        note += ("\nForwards / curve: the seconds spent inside the run's forwards in a pass (timed in the decode, "
                 "median pass) over their price on the curve. Round efficiency: the run's share of wall-clock inside "
                 "forwards over AR's, per round (median): the speedup realised of what its forwards, as they ran, "
                 "allow. efficiency = round efficiency x AR's forwards / curve over the run's.\n")
    return note


# ------------------------------------------------------------------------------------------ merge


def _per_class_merge(runs: list[dict[str, Any]]) -> tuple[dict[str, list], dict[str, int]]:
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for r in runs:
        for c, m in (r.get("accept_map_per_class") or {}).items():
            k = int(r["images_per_class"][c])
            sums[c] = sums.get(c, 0) + np.asarray(m, np.float64) * k
            counts[c] = counts.get(c, 0) + k
    order = sorted(sums, key=int)
    return ({c: np.round(sums[c] / counts[c], 4).tolist() for c in order}, {c: counts[c] for c in order})


def _ident(run: dict) -> str:
    return json.dumps([run["method"], run["config"], run["acceptance"]], sort_keys=True)


def _shard_runs(paths: list, reports: list[dict[str, Any]], run0: dict[str, Any]) -> list[tuple[dict, dict]]:
    """(shard report, its run) of ``run0``'s method, config and rule in every shard."""
    parts = []
    for p, r in zip(paths, reports):
        match = [x for x in r["runs"] if _ident(x) == _ident(run0)]
        if not match:
            raise ValueError(f"cannot merge: {p} lacks the run {run0['method']} {run0['config']}")
        parts.append((r, match[0]))
    return parts


def _merged_counts(run0: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One run from its shards' runs: counts, forwards by block size and wall-clock summed, per-image
    means weighted by images, per-class accept maps merged; quality left to the caller."""
    n = sum(int(x["n_images"]) for x in runs)
    m = {k: run0[k] for k in ("method", "config", "acceptance", "lossless")}
    m["n_images"] = n
    for k in ("tokens", "target_forwards", "draft_forwards"):
        m[k] = sum(int(x[k]) for x in runs)
    m.update(block_size_fields(map(forward_fields, runs)))  # summed over the shards, spans weighted
    for k in ("step_compression", "mean_accepted_length"):
        m[k] = sum(x[k] * x["n_images"] for x in runs) / n
    m["wall_s"] = sum(x["wall_s"] for x in runs)
    m["wall_s_repeats"] = [sum(w) for w in zip(*(x.get("wall_s_repeats", [x["wall_s"]]) for x in runs))]
    fwd = [x.get("forward_s_repeats") for x in runs]
    if all(f and len(f) == len(m["wall_s_repeats"]) for f in fwd):
        m["forward_s_repeats"] = [sum(f) for f in zip(*fwd)]
    m["images_per_s"] = n / m["wall_s"] if m["wall_s"] > 0 else float("nan")
    for k, v in run0.items():  # method-specific means (Stats.extra, e.g. mean_tree_depth), image-weighted
        if k not in m and k not in TIMING_FIELDS and isinstance(v, float) \
                and all(k in x for x in runs):
            m[k] = sum(x[k] * x["n_images"] for x in runs) / n
    m["quality"] = {}
    m["accept_map_per_class"], m["images_per_class"] = _per_class_merge(runs)
    return m


def _mean_quality(q0: dict[str, Any], runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Quality of shards without observation files: the per-image means weighted by images; Frechet
    figures, stds and seed groups dropped (they do not average)."""
    out: dict[str, Any] = {}
    frechet = {k[len("n_reference_"):] for k in q0 if k.startswith("n_reference_")}
    for key in q0:
        plain = key not in frechet and key != "n_images" and not key.startswith("n_reference_") \
            and not key.endswith(("_std", "_groups"))
        if plain and all(key in x.get("quality", {}) for x in runs):
            out[key] = sum(x["quality"][key] * x["n_images"] for x in runs) / n
    if out:
        out["n_images"] = n
    return out


def merge_reports(paths: list[str | Path], out_json: str | Path | None = None) -> dict[str, Any]:
    """Merge shard reports into the report of one unsharded run: counts and wall-clock summed, rates
    and speedups recomputed, per-class accept maps weighted by images, quality recomputed from the
    shards' observation files when all are present (else mean metrics weighted, Frechet ones dropped).
    Forwards by block size are summed; the first shard's ``cost_curve`` prices them (predicted speedups)."""
    reports = [read_report(p, "--merge") for p in paths]
    first = reports[0]
    for p, r in zip(paths, reports):
        for k in ("model", "device", "batch_size", "num_images", "seed", "sampling", "shards"):
            if r.get(k) != first.get(k):
                raise ValueError(f"cannot merge {p}: its {k} {r.get(k)!r} differs from {paths[0]}'s {first.get(k)!r}")
    shards = int(first.get("shards", 1))
    indices = sorted(int(r.get("shard_index", 0)) for r in reports)
    if indices != list(range(shards)):
        raise ValueError(f"cannot merge: need shards 0..{shards - 1} once each, got indices {indices}")
    sides = [load_observations(side_path(p)) for p in paths]
    merged = {k: v for k, v in first.items() if k != "runs"}
    merged.update(shards=1, shard_index=0, merged_from=[str(p) for p in paths], runs=[])
    merged.pop("n_images", None)
    n_batches = -(-int(first["num_images"]) // int(first["batch_size"]))
    groups = int(first.get("quality_groups", 4))
    all_refs: dict[str, np.ndarray] = {}
    all_obs: dict[str, dict[str, np.ndarray]] = {}

    for run0 in first["runs"]:
        parts = _shard_runs(paths, reports, run0)
        m = _merged_counts(run0, [x for _, x in parts])
        rid = key_id(run_key(merged, m))
        pieces = [side[1].get(key_id(run_key(r, x))) for side, (r, x) in zip(sides, parts)]
        if run0.get("quality") and all(pc is not None for pc in pieces):
            obs = {k: np.concatenate([pc[k] for pc in pieces]) for k in pieces[0]}
            order = np.lexsort((np.arange(len(obs["batch"])), obs["batch"]))
            obs = {k: v[order] for k, v in obs.items()}
            refs = {k: v for side in sides for k, v in side[0].items()}
            metric_obs = {k: v for k, v in obs.items() if k not in ("labels", "batch")}
            m["quality"] = summarize(metric_obs, refs, seed_groups(obs["batch"], n_batches, groups))
            all_refs.update(refs)
            all_obs[rid] = obs
        elif run0.get("quality"):  # no observations: average the per-image means, drop Frechet figures
            m["quality"] = _mean_quality(run0["quality"], [x for _, x in parts], m["n_images"])
        merged["runs"].append(m)
    set_speedups(merged)
    if out_json is not None:
        write_report(merged, out_json)
        if all_obs:
            save_observations(side_path(out_json), all_refs, all_obs)
    return merged
