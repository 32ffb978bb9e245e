"""``specvis generate``: one ``Job`` from the flags, run with one method (and plain AR beside it with
``--compare-ar``); the images, their grid and heatmap and ``stats.json`` written to ``--out``
(``specvis.outputs``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..io import clean_stale_temps
from ..job import Job
from ..outputs import write_generation
from ..progress import wanted
from ..registry import describe
from .flags import check_draft, check_method_and_out, device_line, load_pipeline, method_of, named_by_flags, \
    plan_memory, sampling_of


def check_before_loading(a: argparse.Namespace) -> None:
    """What the flags alone tell, one line each before the model loads: the method and ``--out``
    (``flags.check_method_and_out``), the prompts' text; then a killed run's temporaries in ``--out`` go."""
    from ..checks import text

    check_method_and_out(a)
    for flag, given in (("--prompt", a.prompts), ("--negative-prompt", a.negative_prompts)):
        for i, p in enumerate(given or []):  # empty or not UTF-8: before the model loads
            text(p, f"{flag} {i + 1}" if len(given) > 1 else flag, allow_empty=flag != "--prompt")
    if Path(a.out).is_dir():  # temporaries of a run killed while writing (io.atomic_write names)
        for p in clean_stale_temps(a.out):
            print(f"specvis: cannot remove stale {p}", file=sys.stderr)


def build_job(a: argparse.Namespace, pipe, method, sampling) -> Job:
    """The job of the flags, one condition per image (``Job.for_pipe``). The flags a model of this
    kind does not take are refused here; the values the pipeline takes it checks itself, once."""
    text = pipe.conditioning != "class"  # prompts (through the checkpoint's processor or text encoder)
    if text:
        if a.classes:
            raise ValueError(f"model {a.model} is text-to-image: give --prompt, not --class")
        if not a.prompts:
            raise ValueError(f"model {a.model} is text-to-image: give --prompt \"...\"")
    elif a.prompts or a.negative_prompts or a.height is not None or a.width is not None or not a.positive_suffix:
        raise ValueError(f"model {a.model} is class-conditional: --prompt/--negative-prompt/--height/--width/"
                         "--no-positive-suffix do not apply (give --class N)")
    job = Job(model=a.model, method=method, sampling=sampling,
              classes=tuple(a.classes) if a.classes else None,
              prompts=tuple(a.prompts) if text else None,
              negative_prompts=tuple(a.negative_prompts) if text and a.negative_prompts is not None else None,
              height=a.height, width=a.width, positive_suffix=a.positive_suffix, num=a.num,
              batch_size=a.batch_size, seed=a.seed, out=a.out)
    with named_by_flags():
        return job.for_pipe(pipe)


def run_job(a: argparse.Namespace, pipe, job: Job):
    """(the method's generation, AR's or None): with ``--compare-ar`` AR runs on the same conditions
    and seed, after an untimed one-image warm-up of each (one-time costs fall on neither side)."""
    from ..methods.ar import AR

    show = wanted(a.progress, a.quiet)  # a bar on stderr (specvis.progress)
    ar_job = dataclasses.replace(job, method=AR())
    with named_by_flags():
        ar = None
        if a.compare_ar and job.method.name != "ar":
            for j in (job, ar_job):
                j.run(pipe, 1, progress=show)  # warm-up (one image), untimed
            ar = ar_job.run(pipe, progress=show)
        return job.run(pipe, progress=show), ar


def compare_with_ar(out, ar_out, keyed: bool) -> dict[str, Any]:
    """``--compare-ar``'s record: AR's wall-clock and forwards, the speedup, and under keyed noise how
    many images are AR's token for token."""
    s, ar = out.stats, ar_out.stats
    compare = {"ar_wall_s": ar.wall_s, "ar_target_forwards": ar.target_forwards,
               "speedup": ar.wall_s / s.wall_s if s.wall_s > 0 else float("nan")}
    if keyed:  # one picture per seed: the method's images are AR's, token for token
        compare["images_equal_ar"] = sum(bool((x == y).all()) for x, y in zip(out.tokens, ar_out.tokens))
    return compare


def generation_stats(a: argparse.Namespace, pipe, job: Job, out, compare: dict | None) -> dict[str, Any]:
    """``stats.json``: the model, the method that ran (``sv.Auto``: the one it chose, and why), the
    conditions as run, seed, sampling, the generation's stats and the acceptance map."""
    if job.text:
        layout = pipe.target.layout  # the grid of the call
        conditions = {"prompts": list(job.prompts),
                      "negative_prompts": None if job.negative_prompts is None else list(job.negative_prompts),
                      "height": layout.height, "width": layout.width,
                      "positive_suffix": pipe.with_positive_suffix([""], a.positive_suffix)[0],
                      **({"draft": pipe.extras["draft"]} if "draft" in pipe.extras else {})}
    else:
        conditions = {"classes": list(job.classes)}
    s, method = out.stats, job.method
    # what ran: the method as clamped to the stream (generate.fit_to_stream); sv.Auto records its choice below
    ran = out.method if out.method is not None else method  # a MAR pipeline's generation names none
    name, config, rule = describe(method if out.calibration is not None else ran)
    stats = {"model": a.model, "method": name, "config": config, "acceptance": rule, "lossless": bool(method.lossless),
             "default_method": not a.method, **conditions, "seed": a.seed,
             **({"batch_size": a.batch_size} if a.batch_size is not None else {}),
             "sampling": vars(job.sampling) if hasattr(job.sampling, "__dict__") else {},
             **s.to_dict(), **({"compare_ar": compare} if compare else {}), "accept_map": s.accept_map.tolist()}
    if out.calibration is not None:  # sv.Auto: the method it ran, and why
        stats["chosen"] = dict(zip(("method", "config", "acceptance"), describe(out.method)),
                               why=out.calibration.explain())
    return stats


def report(a: argparse.Namespace, pipe, job: Job, out, stats: dict[str, Any]) -> None:
    """What ran, on what, how fast (and against AR with ``--compare-ar``), and what was written."""
    s, num, compare = out.stats, job.num, stats.get("compare_ar")
    what = f"classes {sorted(set(job.classes))}" if not job.text else f"{len(set(job.prompts))} prompts"
    chosen = " (the model's default; --method ar for plain AR)" if not a.method else ""
    print(f"specvis {a.model} | method {stats['method']} {json.dumps(stats['config'])}{chosen} | accept "
          f"{stats['acceptance']} | {num} image{'s' if num != 1 else ''}, {what}")
    print(f"  device {device_line(pipe)}")
    if out.calibration is not None:
        print(f"  {out.calibration.explain()}")
    print(f"  tokens/image {s.tokens}  target forwards {s.target_forwards}  draft forwards {s.draft_forwards}")
    print(f"  step compression {s.step_compression:.2f}  mean accepted length {s.mean_accepted_length:.2f}  "
          f"wall {s.wall_s:.2f}s  ({num / s.wall_s:.2f} images/s)")
    if compare:
        print(f"  vs ar (same conditions and seed): wall {compare['ar_wall_s']:.2f}s -> {s.wall_s:.2f}s, "
              f"speedup {compare['speedup']:.2f}x  (target forwards {compare['ar_target_forwards']} -> {s.target_forwards})")
        if "images_equal_ar" in compare:
            same = compare["images_equal_ar"]
            print(f"  keyed noise: {same} of {num} images equal AR's for the same seeds, token for token"
                  + ("" if same == num else f" ({num - same} differ: not one picture per seed)"))
    print(f"  wrote {num} PNG{'s' if num != 1 else ''}, grid.png, heatmap.png, stats.json to {Path(a.out)}/")


def cmd_generate(a: argparse.Namespace) -> int:
    check_before_loading(a)
    pipe = load_pipeline(a)
    method = method_of(a, pipe)  # without --method: the model's default (flags.DEFAULT_METHODS)
    check_draft(pipe, [method.name])
    job = build_job(a, pipe, method, sampling_of(a, pipe))
    if a.verbose:  # the plan printed before any forward (each call plans its own, and refuses what does not fit)
        rows = min(job.num, a.batch_size or job.num)
        plan_memory(pipe, rows, [method], job.sampling, verbose=True, refill=rows < job.num)
    out, ar = run_job(a, pipe, job)
    compare = compare_with_ar(out, ar or out, job.sampling.keyed) if a.compare_ar else None
    stats = generation_stats(a, pipe, job, out, compare)
    cell = max(out.images[0].width // pipe.target.layout.width, 1)
    write_generation(a.out, out.images, out.stats.accept_map, cell, stats)
    report(a, pipe, job, out, stats)
    return 0
