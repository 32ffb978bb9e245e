"""``specvis sample``: one ``Job`` from the flags; this rank's share of its images (``specvis.sample``),
rank 0 merging them into ``samples.npz`` and ``stats.json``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..job import Job
from ..progress import wanted
from .flags import check_draft, check_method_and_out, load_pipeline, method_of, plan_memory, read_prompts, sampling_of


def cmd_sample(a: argparse.Namespace) -> int:
    from ..sample import init_distributed, sample

    check_method_and_out(a)  # (--num and --batch-size: cli.check_common, before anything)
    prompts = read_prompts(a.prompts) if a.prompts else None
    dist, a.device = init_distributed(a.device)
    try:
        pipe = load_pipeline(a)
        method = method_of(a, pipe)
        check_draft(pipe, [method.name])
        sampling = sampling_of(a, pipe)
        plan_memory(pipe, min(a.batch_size, a.num), [method], sampling)  # before any forward
        job = Job(model=a.model, method=method, sampling=sampling, classes=a.classes,
                  prompts=None if prompts is None else tuple(prompts), height=a.height, width=a.width,
                  num=a.num, batch_size=a.batch_size, seed=a.seed, out=a.out)
        stats = sample(pipe, job, dist=dist, progress=wanted(a.progress, a.quiet))
    finally:
        dist.close()
    if stats is not None:
        chosen = " (the model's default)" if not a.method else ""
        fresh, reused = stats["rank0_generated_here"], stats["rank0_skipped_here"]
        print(f"specvis {a.model} | method {stats['method']} {json.dumps(stats['config'])}{chosen} | accept "
              f"{stats['acceptance']} | {a.num} images on {dist.world} rank(s), batch size {a.batch_size}")
        print(f"  step compression {stats['step_compression']:.2f}  mean accepted length "
              f"{stats['mean_accepted_length']:.2f}  decoding {stats['wall_s']:.2f}s over all ranks"
              f"  (rank 0: {fresh} generated, {reused} already there)")
        print(f"  wrote {Path(a.out)}/samples.npz (arr_0 uint8 {'x'.join(map(str, stats['npz_shape']))}), stats.json, images/")
    return 0
