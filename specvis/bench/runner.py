"""``specvis bench``: AR first, then each method on the same classes and seeds; warm-up excluded;
each configuration timed ``repeats`` times in rounds, a round interleaved batch by batch across the
methods (batch 1 of every method, then batch 2, ...), and the median wall-clock reported (docs/design/api.md).

With ``json_path`` the report is written after every round and a rerun reuses the runs
whose key (model, device, batch size, number of images, seed, sampling, shard, method, config,
acceptance) matches, so an interrupted benchmark resumes. ``shards``/``shard_index`` take every
``shards``-th batch of the work list; ``report.merge_reports`` joins the shard reports.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from .. import __version__
from ..cpu_features import cpu_description
from ..generate import keyed_method
from ..job import Job
from ..pipeline import call_sampling
from ..progress import ImageBar
from ..registry import build_method, describe, parse_method_spec
from ..sampling import Sampling
from ..shards import Work, batches, shard_work  # the one work split, shared with specvis sample
from .quality import Metric, QualitySource, build_metrics, seed_groups, summarize
from .forward_cost import cost_curve as measure_curve
from .report import (BLOCK_FIELDS, MARKER, block_size_fields, key_id, load_observations, markdown_table, read_report, run_key,
                     save_observations, set_speedups, side_path, write_report)

__all__ = ["batches", "shard_work", "Bench", "run_bench", "markdown_table"]

def _accept_maps(per_batch: list[tuple[int, Any]], work: Work) -> tuple[dict[str, list], dict[str, int]]:
    """Per-class mean accept maps (rounded to 1e-4) and image counts."""
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    for (classes, _), (_, out) in zip(work, per_batch):
        amap = out.stats.accept_map.double()
        for row, c in enumerate(classes):
            sums[c] = sums.get(c, 0) + amap[row]
            counts[c] = counts.get(c, 0) + 1
    order = sorted(sums)
    return ({str(c): (sums[c] / counts[c]).mul(1e4).round().div(1e4).tolist() for c in order},
            {str(c): counts[c] for c in order})


WARMUPS = ("batch", "row", "none")


def _run(pipe, conds: list[int], method, sampling: Sampling, seed: int, prompts: list | None,
         grid: tuple[int | None, int | None] = (None, None), rows: int | None = None):
    """One batch: class ids, or for a text-to-image pipeline prompt indices into ``prompts`` (on ``grid``);
    ``rows``: at most that many at once (continuous batching)."""
    if prompts is None:
        return pipe(conds, method, sampling, seed=seed, decode=False, batch_size=rows)
    return pipe(prompts=[prompts[c] for c in conds], method=method, sampling=sampling, seed=seed, decode=False,
                height=grid[0], width=grid[1], batch_size=rows)


def _round(pipe, methods: list, work: Work, sampling: Sampling, bar: ImageBar | None, warmup: str,
           prompts: list | None, grid: tuple[int | None, int | None],
           between: Callable[[list[list[tuple[int, Any]]]], None] | None = None,
           rows: int | None = None) -> list[tuple[float, list[tuple[int, Any]]]]:
    """One timed pass of every method over ``work``, interleaved per batch: every method's untimed
    warm-up (the first batch; ``warmup="row"``: its first sample only, every code path at a fraction of
    the cost; ``"none"``: the pass pays any one-time cost), then batch 1 of every method, batch 2 of
    every method, ... so that a machine drifting within the round slows every method alike.
    ``between(outputs so far)`` runs after each batch of every method (untimed: the cost-curve sampler).
    ``rows``: each batch runs through at most that many rows (continuous batching).
    Returns per method (summed wall-clock, [(batch size, output)])."""
    if warmup != "none":
        classes = work[0][0] if warmup == "batch" else work[0][0][:1]
        for method in methods:
            _run(pipe, classes, method, sampling, work[0][1], prompts, grid, rows)  # warm-up, not timed
    walls = [0.0] * len(methods)
    outputs: list[list[tuple[int, Any]]] = [[] for _ in methods]
    for classes, seed in work:
        for i, method in enumerate(methods):
            out = _run(pipe, classes, method, sampling, seed, prompts, grid, rows)
            walls[i] += out.stats.wall_s
            outputs[i].append((len(classes), out))
            if bar is not None:
                bar.update(len(classes))
        if between is not None:
            between(outputs)
    return list(zip(walls, outputs))


def forward_seconds(outputs: list[tuple[int, Any]]) -> float | None:
    """Seconds a pass spent inside model forwards (``Stats.forward_s`` summed), or None where a batch
    has none (not timed off CPU)."""
    if not outputs or not all(o.stats.forward_s for _, o in outputs):
        return None
    return sum(sum(o.stats.forward_s.values()) for _, o in outputs)


def add_repeat(run: dict[str, Any], wall: float, forward: float | None = None) -> None:
    """Record one more timed pass of ``run``: ``wall_s`` is the median of ``wall_s_repeats``; ``forward``,
    the pass's seconds inside forwards, joins ``forward_s_repeats`` (pass for pass with the walls; the
    field is dropped once a pass lacks it)."""
    fwd = run.pop("forward_s_repeats", [])
    if forward is not None and len(fwd) == len(run.get("wall_s_repeats", [])):
        run["forward_s_repeats"] = [*fwd, forward]
    run["wall_s_repeats"] = [*run.get("wall_s_repeats", []), wall]
    run["wall_s"] = statistics.median(run["wall_s_repeats"])
    run["images_per_s"] = run["n_images"] / run["wall_s"] if run["wall_s"] > 0 else float("nan")


def new_run(method, work: Work, first: list[tuple[int, Any]], wall: float) -> dict[str, Any]:
    """A run from ``method``'s first timed pass over ``work`` (``_round``): token and forward counts
    (identical in later passes, which ``run_bench`` adds with ``add_repeat``), one wall-clock."""
    n_images = sum(n for n, _ in first)
    tokens = sum(n * o.stats.tokens for n, o in first)
    name, config, rule = describe(method)
    maps, counts = _accept_maps(first, work)
    extra_keys = sorted({k for _, o in first for k, v in o.stats.extra.items() if isinstance(v, (int, float))})
    extra = {k: sum(n * float(o.stats.extra.get(k, 0.0)) for n, o in first) / n_images for k in extra_keys}
    run = {
        "method": name,
        "config": config,
        "acceptance": rule,
        "lossless": bool(method.lossless),
        "n_images": n_images,
        "tokens": tokens,
        "target_forwards": sum(o.stats.target_forwards for _, o in first),
        "draft_forwards": sum(o.stats.draft_forwards for _, o in first),
        **block_size_fields(o.stats for _, o in first),
        "step_compression": sum(n * o.stats.step_compression for n, o in first) / n_images,
        "mean_accepted_length": sum(n * o.stats.mean_accepted_length for n, o in first) / n_images,
        "quality": {},
        **extra,  # method-specific means, e.g. mean_tree_depth (d-bar) of the tree methods
        # sv.Auto: what it ran, and why (tune.Calibration)
        **({"auto_choice": first[0][1].calibration.explain()} if first[0][1].calibration is not None else {}),
        "accept_map_per_class": maps,
        "images_per_class": counts,
    }
    add_repeat(run, wall, forward_seconds(first))
    return run


def observe(pipe, metrics: list[Metric], per_batch: list[tuple[int, Any]], work: Work,
            batch_index: list[int], prompts: list | None = None) -> dict[str, np.ndarray]:
    """Decode each batch's tokens and collect every metric's per-image observations (+ labels, batch).
    An image's label is its class, or for a prompt the class the prompt asks for
    (``pipe.prompt_class``, -1 when it names none)."""
    obs: dict[str, list[np.ndarray]] = {"labels": [], "batch": []}
    asked = None if prompts is None else [pipe.prompt_class(p) for p in prompts]
    for (classes, _), (_, out), j in zip(work, per_batch, batch_index):
        images = np.stack([np.asarray(im.convert("RGB")) for im in pipe.images_of(out)])
        labels = np.asarray(classes if asked is None else [asked[c] for c in classes], np.int64)
        for metric in metrics:
            for k, v in metric.observe(images, labels).items():
                obs.setdefault(k, []).append(np.asarray(v))
        obs["labels"].append(labels)
        obs["batch"].append(np.full(len(classes), j, np.int64))
    return {k: np.concatenate(v) for k, v in obs.items()}


# report fields of text-to-image runs that, besides report.KEY_FIELDS, a resumed run must share
TEXT_FIELDS = ("prompts", "height", "width", "draft")
# report fields that must match for a resumed bench to reuse an earlier report's cost curve
CURVE_FIELDS = ("model", "device", "device_name", "torch", "dtype", "graphs", "compile", "batch_size", "sampling",
                "prompts", "height", "width", "draft")
CURVE_REPEATS = 5
CURVE_SAMPLES_PER_ROUND = 8  # cost-curve samples taken during each round of timed passes


def needed_sizes(runs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The block sizes the runs' forwards used, per cost-curve kind (the target's always with 1: AR)."""
    need: dict[str, set[int]] = {"target": {1}}
    for r in runs:
        for field_name, kind in BLOCK_FIELDS.items():
            need.setdefault(kind, set()).update(int(n) for n in (r.get(field_name) or {}))
    return {k: sorted(v) for k, v in need.items() if v}


def _covers(curve: dict[str, list], need: dict[str, list[int]]) -> bool:
    return all({int(r["tokens"]) for r in curve.get(k) or []} >= set(v) for k, v in need.items())


def _previous_curve(json_path: Path | None, report: dict[str, Any]) -> dict[str, list] | None:
    """The ``cost_curve`` of an earlier report at ``json_path`` measured under the same CURVE_FIELDS."""
    if json_path is None or not json_path.exists():
        return None
    try:
        old = read_report(json_path)
    except ValueError:
        return None
    curve = old.get("cost_curve")
    if not isinstance(curve, dict) or any(old.get(k) != report.get(k) for k in CURVE_FIELDS):
        return None
    return curve


def measure_cost_curve(pipe, report: dict[str, Any], sampling: Sampling, prompts: list | None,
                       runs: list[dict[str, Any]], previous: dict[str, list] | None = None,
                       repeats: int = CURVE_REPEATS) -> dict[str, list]:
    """The forward cost curve ``runs`` need (``needed_sizes``): ``previous`` when it covers them, else
    measured now on the pipeline's device at the report's batch size and sampling (median of
    ``repeats``; ``forward_cost.cost_curve``)."""
    need = needed_sizes(runs)
    if previous is not None and _covers(previous, need):
        print("specvis: reusing the forward cost curve of the earlier report", file=sys.stderr)
        return previous
    return measure_curve(pipe, need, report["batch_size"], repeats, sampling=sampling, prompts=prompts,
                         grid=(report.get("height"), report.get("width")))


def median_curve(samples: list[dict[str, list]]) -> dict[str, list]:
    """Per kind and block size, the median over cost-curve samples of their ``median_s`` and of each of
    their ``spans``' seconds (samples taken by one bench share their spans)."""
    times: dict[str, dict[int, list[dict]]] = {}
    for curve in samples:
        for kind, rows in curve.items():
            for r in rows:
                times.setdefault(kind, {}).setdefault(int(r["tokens"]), []).append(r)
    out: dict[str, list] = {}
    for kind, by in times.items():
        out[kind] = []
        for n, rows in sorted(by.items()):
            row = {"tokens": n, "median_s": statistics.median(float(r["median_s"]) for r in rows)}
            spans = [r.get("spans") for r in rows]
            if all(spans) and len({tuple(p[0] for p in sp) for sp in spans}) == 1:
                row["spans"] = [[span, statistics.median(float(sp[k][1]) for sp in spans)]
                                for k, (span, _) in enumerate(spans[0])]
            out[kind].append(row)
    return out


def _load_previous(json_path: Path | None, report: dict[str, Any]) -> tuple[dict[str, dict], dict, dict]:
    """Completed runs of an earlier report at ``json_path`` by key, and its observation file (none when
    it was run on other prompts, grid or draft)."""
    if json_path is None or not json_path.exists():
        return {}, {}, {}
    old = read_report(json_path)  # anything else is refused, never overwritten
    try:
        done = {run_key(old, r): r for r in old["runs"]}
    except (KeyError, TypeError):
        raise ValueError(f"--json {json_path}: a bench report whose runs lack their method, config or acceptance; "
                         "give another path or move the file") from None
    changed = [k for k in TEXT_FIELDS if old.get(k) != report.get(k)]
    if changed and done:
        print(f"specvis: {json_path} was run with other {', '.join(changed)}; starting afresh", file=sys.stderr)
        return {}, {}, {}
    refs, obs = load_observations(side_path(json_path))
    return done, refs, obs


@dataclasses.dataclass(frozen=True)
class Bench:
    """How ``run_bench`` runs a job: ``specs`` (method specs such as ``"sjd:window=16"``; ``ar`` always
    runs first), ``repeats`` timed passes, the ``acceptance`` rule of the methods that take one and
    whose spec names none, the untimed ``warmup`` (``WARMUPS``), the shard of the batches to run
    (``shards``, ``shard_index``), quality ``metrics`` (None: the bundle's classifier proxy when present;
    () for none) with their reference ``data_dir`` and ``quality_groups``, the forward ``cost_curve``,
    and ``continuous`` batching."""

    specs: tuple[str, ...] = ()
    repeats: int = 1
    acceptance: str | None = None
    warmup: str = "batch"
    shards: int = 1
    shard_index: int = 0
    metrics: tuple[str, ...] | None = None
    data_dir: str | Path | None = None
    quality_groups: int = 4
    cost_curve: bool = False
    continuous: bool = False


def _checked(pipe, job: Job, bench: Bench) -> tuple[Sampling, list | None, tuple[int | None, int | None]]:
    """The job's counts, warm-up and conditions, checked before any run: (its sampling, resolved;
    its prompts, None for class ids; their grid)."""
    if not all(isinstance(n, int) and n >= 1 for n in (job.num, job.batch_size, bench.repeats)):
        raise ValueError("--num, --batch-size and --repeats must be >= 1")
    if bench.warmup not in WARMUPS:
        raise ValueError(f"--warmup must be one of {', '.join(WARMUPS)}, got {bench.warmup!r}")
    sampling = call_sampling(pipe, job.sampling)  # None: the model's; its noise resolved (keyed for discrete tokens)
    prompts = job.prompts
    if (prompts is None) == (pipe.num_classes == 0):
        raise ValueError(f"model {pipe.name}: " + ("text-to-image, give --prompts FILE" if prompts is None
                                                   else "class-conditional, --prompts does not apply"))
    grid: tuple[int | None, int | None] = (None, None)
    if prompts is not None:
        prompts = list(prompts)
        if not prompts:
            raise ValueError(f"model {pipe.name}: no prompts given")
        grid = pipe.set_grid(job.height, job.width)  # a grid that does not fit fails before any run
    elif job.height is not None or job.width is not None:
        raise ValueError(f"model {pipe.name} is class-conditional: --height/--width do not apply")
    return sampling, prompts, grid


def _methods(bench: Bench, sampling: Sampling, full: Work, prompts: list | None) -> list:
    """The methods of ``bench.specs``, AR first, each with the rule it runs with (a method without
    one verifies by Coupled under keyed noise); every key must be an option of its method or rule.
    ``sv.Auto`` probes the classes this bench runs, not only its first batch's."""
    parsed = [parse_method_spec(s) for s in bench.specs]
    if not parsed or parsed[0][0] != "ar":
        parsed = [("ar", {})] + [p for p in parsed if p != ("ar", {})]
    methods = [keyed_method(build_method(name, opts, bench.acceptance), sampling) for name, opts in parsed]
    if prompts is None:
        workload = tuple(dict.fromkeys(c for classes, _ in full for c in classes))
        methods = [dataclasses.replace(m, probe_classes=workload) if getattr(m, "probe_classes", ()) is None else m
                   for m in methods]
    return methods


def _header(pipe, job: Job, bench: Bench, sampling: Sampling, prompts, grid, work: Work, full: Work) -> dict[str, Any]:
    """The report's fields before any run: what ran where, and how (docs/design/api.md)."""
    extras = pipe.extras or {}
    return {
        MARKER[0]: MARKER[1], "specvis_version": __version__, "model": pipe.name, "device": str(pipe.device.type),
        "device_name": torch.cuda.get_device_name(pipe.device) if pipe.device.type == "cuda" else cpu_description(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "dtype": str(pipe.dtype).removeprefix("torch."),
        "dtype_source": extras.get("dtype_source"), "quantize": extras.get("quantize"),
        "graphs": pipe.device.type == "cuda" if pipe.graphs is None else pipe.graphs, "compile": pipe.compiled,
        "batch_size": job.batch_size, "num_images": job.num, "seed": job.seed,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "cfg_scale": sampling.cfg_scale, **({"noise": sampling.noise} if sampling.keyed else {})},
        **({"prompts": prompts, "height": grid[0], "width": grid[1], "draft": extras.get("draft")} if prompts else {}),
        **({"num_iter": pipe.num_iter} if pipe.num_iter is not None else {}),  # MAR: its sampler's steps
        **({"continuous": True} if bench.continuous else {}),
        "repeats": bench.repeats, "pass_order": "interleaved per batch", "warmup": bench.warmup,
        "shards": bench.shards, "shard_index": bench.shard_index, "n_images": sum(len(c) for c, _ in work),
        # as quality.seed_groups cuts them: at most one a batch
        "quality_groups": max(1, min(bench.quality_groups, len(full))),
        "runs": [],
    }


class _BenchRun:
    """One ``run_bench``: its work, the runs resumed from ``--json`` and those still to time, the
    quality observations, and the cost-curve samples taken between batches."""

    def __init__(self, pipe, job: Job, bench: Bench, progress: bool) -> None:
        self.pipe, self.bench = pipe, bench
        self.sampling, self.prompts, self.grid = _checked(pipe, job, bench)
        self.full = batches(job.num, job.batch_size, len(self.prompts) if self.prompts else pipe.num_classes, job.seed,
                            keyed=self.sampling.keyed)
        methods = _methods(bench, self.sampling, self.full, self.prompts)
        self.batch_index, self.work = shard_work(self.full, bench.shards, bench.shard_index)
        self.rows = None
        if bench.continuous:
            if bench.shards > 1:
                raise ValueError("--continuous runs every image in one call: it takes no --shards")
            self.work, self.rows = [([c for classes, _ in self.full for c in classes], job.seed)], job.batch_size
        self.report = _header(pipe, job, bench, self.sampling, self.prompts, self.grid, self.work, self.full)
        self.json_path = Path(job.out) if job.out is not None else None
        self.batch_size = job.batch_size
        self.resume(methods)
        passes = sum(max(0, bench.repeats - len(prev["wall_s_repeats"])) if prev else bench.repeats
                     for _, _, prev in self.todo) * len(self.work)
        images = passes // max(len(self.work), 1) * sum(len(c) for c, _ in self.work)  # the timed passes' images
        # with timed passes to run the curve is sampled alongside them, else taken from the earlier report
        self.old_curve = _previous_curve(self.json_path, self.report) if bench.cost_curve and not passes else None
        self.bar = ImageBar(images, pipe.target.layout.stream_len, "bench", enabled=progress and passes > 0)
        self.quality: list[Metric] | None = None
        self.curves: list[dict[str, list]] = []  # cost-curve samples taken during the timed passes
        self.failed: list[str] = []
        self.stride = -(-len(self.work) // CURVE_SAMPLES_PER_ROUND)

    def resume(self, methods: list) -> None:
        """Each method's key and the run an earlier report at ``--json`` holds for it (reused, with
        its quality observations), or None: still to run."""
        self.done, self.refs, all_obs = _load_previous(self.json_path, self.report)
        self.keep_obs: dict[str, dict[str, np.ndarray]] = {}
        self.todo = []
        for method in methods:
            name, config, rule = describe(method)
            key = run_key(self.report, {"method": name, "config": config, "acceptance": rule})
            self.todo.append((method, key, self.done.get(key)))
        self.runs: list[dict[str, Any] | None] = []
        for _, key, prev in self.todo:
            if prev is not None:
                prev.setdefault("wall_s_repeats", [prev["wall_s"]])
                rid = key_id(key)
                if rid in all_obs:
                    self.keep_obs[rid] = all_obs[rid]
                tqdm.write(f"reusing {prev['method']} {json.dumps(prev['config'])} from {self.json_path}", file=sys.stderr)
            self.runs.append(prev)

    def save(self) -> None:
        set_speedups(self.report)
        if self.json_path is not None:
            write_report(self.report, self.json_path)
            if self.keep_obs:
                save_observations(side_path(self.json_path), self.refs, self.keep_obs)

    def sample_curve(self, sized: list[dict[str, Any]]) -> None:
        if self.bench.cost_curve and not self.failed:
            try:
                self.curves.append(measure_cost_curve(self.pipe, self.report, self.sampling, self.prompts, sized,
                                                      self.old_curve))
            except (ValueError, RuntimeError, NotImplementedError) as e:  # no prediction beats no report
                self.failed.append(str(e))

    def between(self, outputs: list[list[tuple[int, Any]]]) -> None:
        """After each batch of a round: a cost-curve sample every ``stride`` batches, so that a machine
        that drifts during the benchmark slows every method and the curve alike instead of whichever
        ran in the slow window."""
        if len(outputs[0]) % self.stride == 0 or len(outputs[0]) == len(self.work):
            self.sample_curve([r for r in self.runs if r is not None]
                              + [block_size_fields(x.stats for _, x in o) for o in outputs])

    def add_quality(self, i: int, run: dict[str, Any], outputs: list[tuple[int, Any]]) -> None:
        """A new run's quality figures (metrics built on first need: resumed runs never load the classifier)."""
        if self.quality is None:
            self.quality = build_metrics(self.bench.metrics, QualitySource(self.pipe, Path(self.bench.data_dir)
                                                                           if self.bench.data_dir else None))
            for m in self.quality:
                self.refs.update(m.references)
        if not self.quality:
            return
        obs = observe(self.pipe, self.quality, outputs, self.work, self.batch_index, self.prompts)
        if self.bench.continuous:  # the batch each image would have had
            obs["batch"] = np.arange(len(obs["batch"])) // self.batch_size
        figures = {k: v for k, v in obs.items() if k not in ("labels", "batch")}
        groups = seed_groups(obs["batch"], len(self.full), self.bench.quality_groups)
        run["quality"] = summarize(figures, self.refs, groups)
        self.keep_obs[key_id(self.todo[i][1])] = obs

    def round(self, pending: list[int]) -> list[dict[str, Any]]:
        """Pass r of every method in ``pending`` (interleaved per batch: ``_round``); returns the runs
        it made (a method's first pass: counts, accept maps, quality)."""
        new = []
        self.bar.set_description(f"pass {min(len(r['wall_s_repeats']) if r else 0 for r in self.runs) + 1}")
        between = self.between if self.bench.cost_curve else None
        for i, (wall, outputs) in zip(pending, _round(self.pipe, [self.todo[i][0] for i in pending], self.work,
                                                      self.sampling, self.bar, self.bench.warmup, self.prompts,
                                                      self.grid, between, self.rows)):
            if self.runs[i] is not None:
                add_repeat(self.runs[i], wall, forward_seconds(outputs))
                continue
            self.runs[i] = run = new_run(self.todo[i][0], self.work, outputs, wall)
            self.add_quality(i, run, outputs)
            new.append(run)
        self.report["runs"] = [r for r in self.runs if r is not None]
        self.save()
        return new

    def finish(self) -> dict[str, Any]:
        self.bar.close()
        self.report["runs"] = self.runs
        if not self.curves and self.bench.cost_curve:  # nothing timed: the earlier report's curve when it covers the runs
            self.sample_curve(self.runs)
        if self.failed:
            print(f"specvis: could not measure the forward cost curve ({self.failed[0]}); no predicted speedups",
                  file=sys.stderr)
        elif self.curves:
            self.report["cost_curve"] = median_curve(self.curves)
        self.save()
        return self.report


def run_bench(pipe, job: Job, bench: Bench = Bench(), *, progress: bool = True,
              on_run: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Benchmark ``bench.specs`` on ``pipe`` with the job's images: ``job.num`` images per method in
    batches of ``job.batch_size`` (batch j seeded from ``job.seed``: ``shards.batches``), its
    ``sampling`` (None: the model's), ``classes`` (the model's, in turn) or ``prompts`` (text-to-image
    pipelines: image i gets prompt i mod len, on the ``height`` x ``width`` grid in image tokens,
    default native); ``job.out``: the report JSON (and ``*.quality.npz`` observations), written after
    every round and resumed from. The report records the prompts, grid and draft. ``on_run`` gets
    each run once its first pass is timed.

    ``step_compression`` and ``mean_accepted_length`` are per-image averages (tokens of an image over
    the batched target forwards it took); ``target_forwards`` counts batched calls.

    ``bench.cost_curve`` (``specvis bench``'s default; off here, where callers time things themselves):
    after every round of timed passes (every method's pass r), measure the forward cost of the target
    (and draft model / EAGLE drafter) at every block size the runs used; ``report["cost_curve"]`` is
    the median over rounds (reused from ``job.out`` when it was measured under the same settings
    and covers them), and every run gets
    ``predicted_speedup`` and ``efficiency`` (``report.set_speedups``). Each run records its forwards
    by block size (``target_block_sizes``, ``draft_block_sizes``, ``drafter_block_sizes``).

    ``bench.continuous``: every image in one call through ``job.batch_size`` rows, a finished image's
    row taking the next (``generate(batch_size=)``); image i keeps the prompt or class it gets
    otherwise, the call runs with ``job.seed``, and quality seed groups cut the images as the batches would.
    """
    state = _BenchRun(pipe, job, bench, progress)
    while pending := [i for i, run in enumerate(state.runs)
                      if run is None or len(run["wall_s_repeats"]) < bench.repeats]:
        for run in state.round(pending):
            if on_run is not None:
                on_run(run)
    return state.finish()
