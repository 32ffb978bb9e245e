"""``specvis bench``: AR first, then each method on the same classes and seeds; warm-up excluded;
each configuration repeated and the median wall-clock reported (API.md JSON)."""

from __future__ import annotations

import platform
import statistics
from typing import Any, Callable

import torch
from tqdm import tqdm

from .. import __version__
from ..registry import build_method, describe, parse_method_spec
from ..sampling import Sampling


def batches(num: int, batch_size: int, num_classes: int, seed: int) -> list[tuple[list[int], int]]:
    """Deterministic work list: image i has class i % num_classes; batch j uses seed + j."""
    out = []
    for j, start in enumerate(range(0, num, batch_size)):
        out.append(([i % num_classes for i in range(start, min(start + batch_size, num))], seed + j))
    return out


def measure(pipe, method, work: list[tuple[list[int], int]], sampling: Sampling, repeats: int,
            progress: bool = False) -> dict[str, Any]:
    """Run ``method`` over ``work`` ``repeats`` times after one warm-up batch; token/forward counts
    come from the first repeat (they are identical across repeats), wall-clock is the median."""
    pipe(work[0][0], method, sampling, seed=work[0][1], decode=False)  # warm-up, not timed
    walls, first = [], None
    for _ in range(repeats):
        wall, per_batch = 0.0, []
        for classes, seed in tqdm(work, disable=not progress, leave=False, desc=method.name):
            out = pipe(classes, method, sampling, seed=seed, decode=False)
            wall += out.stats.wall_s
            per_batch.append((len(classes), out))
        walls.append(wall)
        first = first or per_batch
    n_images = sum(n for n, _ in first)
    tokens = sum(n * o.stats.tokens for n, o in first)
    name, config, rule = describe(method)
    wall = statistics.median(walls)
    return {
        "method": name,
        "config": config,
        "acceptance": rule,
        "lossless": bool(method.lossless),
        "tokens": tokens,
        "target_forwards": sum(o.stats.target_forwards for _, o in first),
        "draft_forwards": sum(o.stats.draft_forwards for _, o in first),
        "step_compression": sum(n * o.stats.step_compression for n, o in first) / n_images,
        "mean_accepted_length": sum(n * o.stats.mean_accepted_length for n, o in first) / n_images,
        "wall_s": wall,
        "wall_s_repeats": walls,
        "images_per_s": n_images / wall,
        "quality": {},
        "_outputs": first,
    }


def run_bench(pipe, specs: list[str], num: int, batch_size: int, seed: int = 0, sampling: Sampling | None = None,
              repeats: int = 1, acceptance: str = "exact", progress: bool = True,
              on_run: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Benchmark ``specs`` (method specs such as ``"sjd:window=16"``) on ``pipe``; ``ar`` always runs first.

    ``step_compression`` and ``mean_accepted_length`` are per-image averages (tokens of an image over
    the batched target forwards it took); ``target_forwards`` counts batched calls.
    """
    if num < 1 or batch_size < 1 or repeats < 1:
        raise ValueError("--num, --batch-size and --repeats must be >= 1")
    sampling = sampling or pipe.default_sampling
    parsed = [parse_method_spec(s) for s in specs]
    if not parsed or parsed[0][0] != "ar":
        parsed = [("ar", {})] + [p for p in parsed if p != ("ar", {})]
    methods = [build_method(name, opts, opts.pop("accept", acceptance)) for name, opts in parsed]
    work = batches(num, batch_size, pipe.num_classes, seed)
    report = {
        "specvis_version": __version__, "model": pipe.name, "device": str(pipe.device.type),
        "device_name": torch.cuda.get_device_name(pipe.device) if pipe.device.type == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__, "batch_size": batch_size, "num_images": num, "seed": seed,
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "cfg_scale": sampling.cfg_scale},
        "repeats": repeats, "runs": [],
    }
    for method in methods:
        run = measure(pipe, method, work, sampling, repeats, progress)
        run.pop("_outputs")
        ar = report["runs"][0] if report["runs"] else run
        run["speedup"] = run["images_per_s"] / ar["images_per_s"]
        report["runs"].append(run)
        if on_run is not None:
            on_run(run)
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """The runs of a report as a markdown table."""
    head = (f"model `{report['model']}` on {report['device']} ({report.get('device_name', '')}), "
            f"batch {report['batch_size']}, {report['num_images']} images, seed {report['seed']}, "
            f"torch {report['torch']}, median of {report.get('repeats', 1)}\n\n")
    rows = ["| method | config | acceptance | lossless | step compression | mean accepted length | images/s | speedup |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in report["runs"]:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items()) or "-"
        rows.append(f"| {r['method']} | {cfg} | {r['acceptance']} | {'yes' if r['lossless'] else 'no'} | "
                    f"{r['step_compression']:.2f} | {r['mean_accepted_length']:.2f} | {r['images_per_s']:.3f} | "
                    f"{r['speedup']:.2f}x |")
    return head + "\n".join(rows) + "\n"
