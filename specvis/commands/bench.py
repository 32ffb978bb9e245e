"""``specvis bench``: one ``Job`` (the images every method makes, the report it goes to) and one
``bench.runner.Bench`` (how they are timed) from the flags; or ``--merge`` of shard reports. The
report, its markdown table and plots are written through ``specvis.outputs``."""

from __future__ import annotations

import argparse
import json

from ..job import Job
from ..progress import wanted
from ..registry import method_from_spec, parse_method_spec
from .flags import check_draft, load_pipeline, plan_memory, read_prompts, sampling_of


def check_metrics(text: str | None) -> None:
    """``--metrics``: names of ``bench.quality.METRICS`` or none, comma-separated; anything else is an
    error before the model loads (a metric that is known but unavailable here still only warns)."""
    if text is None:
        return
    from ..bench.quality import METRICS

    allowed = [*METRICS, "none"]
    for name in (m.strip() for m in text.split(",")):
        if name and name not in allowed:
            raise ValueError(f"--metrics: unknown metric {name!r}; choose from {', '.join(allowed)} (comma-separated)")


def check_outputs(a: argparse.Namespace) -> None:
    """``bench``'s outputs, checked before the model loads: ``--json`` a writable file that is absent
    or a bench report (resumed; anything else is refused and left as it is), ``--md`` a writable
    file, ``--plots`` a writable directory."""
    from ..bench.report import read_report
    from ..io import check_output_dir, check_output_file

    if a.json is not None:
        if check_output_file(a.json, "--json").exists():
            read_report(a.json, "--json")
    if a.md is not None:
        check_output_file(a.md, "--md")
    if a.plots is not None:
        check_output_dir(a.plots, "--plots")


def show_run(repeats: int):
    """A line per run once its first pass is timed."""
    def show(run: dict) -> None:
        print(f"{run['method']:12s} {json.dumps(run['config']):40s} step compression {run['step_compression']:.2f}  "
              f"accepted {run['mean_accepted_length']:.2f}  {run['images_per_s']:.3f} img/s  speedup {run['speedup']:.2f}x"
              + "".join(f"  {k} {v:.3f}" for k, v in run.get("quality", {}).items() if k in ("fid_proxy", "class_accuracy"))
              + (f"  (timed pass 1 of {repeats})" if len(run["wall_s_repeats"]) < repeats else ""),
              flush=True)
    return show


def run(a: argparse.Namespace) -> tuple[dict, list[str] | None]:
    """(the report, the model's class names): every method spec, metric and prompt file checked
    before the model loads; the report written to ``--json`` as it grows (``run_bench``)."""
    from ..bench.runner import Bench, run_bench

    specs = [s for s in a.methods.split(",") if s.strip()]
    if not specs:
        raise ValueError(f"--methods {a.methods!r} names no method: give comma-separated specs, e.g. ar,sjd:window=16")
    check_metrics(a.metrics)
    for spec in specs:  # a bad spec fails before the model loads
        method_from_spec(spec, a.accept)
    prompts = read_prompts(a.prompts) if a.prompts else None  # a bad file fails before the model loads
    names = [parse_method_spec(s)[0] for s in specs]
    pipe = load_pipeline(a, names)
    check_draft(pipe, names)
    sampling = sampling_of(a, pipe)
    plan_memory(pipe, min(a.batch_size, a.num), [method_from_spec(s, a.accept) for s in specs], sampling)
    metrics = None if a.metrics is None else tuple(m.strip() for m in a.metrics.split(",")
                                                   if m.strip() not in ("", "none"))
    job = Job(model=a.model, sampling=sampling, prompts=None if prompts is None else tuple(prompts),
              height=a.height, width=a.width, num=a.num, batch_size=a.batch_size, seed=a.seed, out=a.json)
    bench = Bench(specs=tuple(specs), repeats=a.repeats, acceptance=a.accept, warmup=a.warmup, shards=a.shards,
                  shard_index=a.shard_index, metrics=metrics, data_dir=a.data, cost_curve=not a.no_cost_curve,
                  continuous=a.continuous)
    return run_bench(pipe, job, bench, progress=wanted(a.progress, a.quiet), on_run=show_run(a.repeats)), pipe.class_names


def cmd_bench(a: argparse.Namespace) -> int:
    from ..bench.report import markdown_table, merge_reports
    from ..outputs import write_text

    check_outputs(a)  # every output path before any work: a report to resume, never another file
    if a.merge:
        if not a.json:
            raise ValueError("--merge needs --json OUT for the merged report")
        report, class_names = merge_reports(a.merge, a.json), None
    else:
        report, class_names = run(a)
    if a.md:
        from pathlib import Path

        Path(a.md).parent.mkdir(parents=True, exist_ok=True)
        write_text(a.md, markdown_table(report))
    if a.plots:
        from ..bench.plots import write_plots

        write_plots(report, a.plots, class_names)
    return 0
