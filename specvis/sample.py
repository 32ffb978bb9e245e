"""``specvis sample``: many images, one process or ``torchrun --nproc_per_node N`` ranks, for FID.

The work list and its split are ``specvis.shards`` (the same as ``specvis bench --shards``): image i
has condition i mod len(conditions), batch j holds images j*batch_size .. and runs with seed + j
(under keyed noise with seed + j*batch_size: image i has seed + i, so its picture is the same whatever the
batch size and the lossless method), and rank r takes the batches j with j % N == r. So image i gets the same condition, batch and
seed whatever N is, and the images are identical for every N (same device, dtype and threads).

Layout of ``out``:
- ``images/000123.png``: image 123, written atomically (temp name, then ``os.replace``);
- ``stats/rank000.json``: per-batch stats of the batches rank 0 owns, rewritten atomically after
  every batch (and carried over from earlier runs for batches that are skipped);
- ``stats/rank000.lock``: held with an OS lock (``fcntl.flock``) while rank 0 works here, so a second
  ``specvis sample`` on the same directory is refused with one line; the OS releases it when the
  process ends, killed or not;
- ``config.json``: what the images depend on (model, method, sampling, seed, batch size, number,
  conditions); a rerun with other values into the same directory is an error;
- ``samples.npz`` (key ``arr_0``, uint8 N x H x W x 3: the ADM / LlamaGen FID evaluator layout)
  and ``stats.json`` (merged), written by rank 0 after a barrier, atomically.

A rerun (after a crash or kill) skips every batch whose PNGs all exist and end with PNG's IEND chunk
and regenerates the others (the whole batch, since a batch's images depend on each other's
randomness), writing only the missing or incomplete PNGs. A ``config.json`` that exists but does
not read is an error (it is never taken for missing), and temporaries of killed runs (dead PIDs)
are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from .checks import SEED_LIMIT
from .generate import keyed_method
from .pipeline import call_sampling
from .io import clean_stale_temps, read_text
from .job import Job
from .outputs import write_json, write_npz, write_png, write_text
from .registry import describe, method_argument
from .shards import batches, shard_work

__all__ = ["Dist", "init_distributed", "sample", "image_path", "write_npz"]


@dataclasses.dataclass
class Dist:
    """This process's place: rank, world size, local rank, and a barrier (no-op for one process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if self.backend == "nccl":
                dist.barrier(device_ids=[self.local_rank])
            else:
                dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def init_distributed(device: str) -> tuple[Dist, str]:
    """(Dist, device of this rank). Under torchrun (``WORLD_SIZE`` set): joins the process group,
    gloo on CPU, nccl on CUDA, and ``--device cuda`` becomes ``cuda:LOCAL_RANK``. Otherwise one
    process, no process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda")
    if cuda:
        if device == "cuda":
            device = f"cuda:{local}"
        torch.cuda.set_device(torch.device(device))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(hours=2))  # a slow last batch must not time out
    return Dist(rank, world, local, backend), device


def image_path(out: Path, i: int) -> Path:
    return out / "images" / f"{i:06d}.png"


def _asdict(x) -> dict[str, Any]:
    return dataclasses.asdict(x) if dataclasses.is_dataclass(x) else dict(vars(x))


def _rank_file(out: Path, rank: int) -> Path:
    return out / "stats" / f"rank{rank:03d}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path, "sample file"))
    except (OSError, ValueError):
        return None


def _write_rank(out: Path, dist: Dist, record: dict[int, dict]) -> None:
    write_text(_rank_file(out, dist.rank), json.dumps({"rank": dist.rank, "world": dist.world,
                                                       "batches": {str(k): record[k] for k in sorted(record)}}))


def _check_config(out: Path, config: dict[str, Any], dist: Dist) -> None:
    """``config.json`` of the directory must match ``config`` (rank 0 writes it when absent). One that
    exists but does not read is an error: it records what the images there were made with, so it is
    never taken for missing (a seed-1 run would take the seed-0 images as its own)."""
    path = out / "config.json"
    if not path.exists():
        if dist.rank == 0:
            write_json(path, config)
        return
    old = _read_json(path)
    if not isinstance(old, dict):
        raise ValueError(f"--out {out}: {path.name} is damaged (not a JSON object); it records what the images "
                         "there were made with: restore it, or use another --out")
    changed = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k)]
    if changed:
        raise ValueError(f"--out {out} holds samples made with other {', '.join(changed)}; "
                         "use another --out, or the same settings to resume")


PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk every complete PNG ends with


def _complete(path: Path) -> bool:
    """Whether ``path`` is a whole PNG as far as its last 12 bytes tell (a truncated file is not):
    a cheap check made for every image a rerun would skip."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < 8 + len(PNG_END):
                return False
            f.seek(-len(PNG_END), os.SEEK_END)
            return f.read() == PNG_END
    except OSError:
        return False


@contextlib.contextmanager
def _rank_lock(out: Path, rank: int):
    """Hold ``stats/rankNNN.lock`` (an OS lock, ``fcntl.flock``) while this rank works in ``out``: a
    second ``specvis sample`` on the same directory and rank is refused instead of both rewriting the
    same rank file. The OS drops the lock when the process ends, killed or not: never a stale block."""
    path = out / "stats" / f"rank{rank:03d}.lock"
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise ValueError(f"--out {out} is in use by another specvis sample (process {holder or '?'}, rank {rank}): "
                         "wait for it to finish, or use another --out") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()  # releases the lock


def _batch_stats(out, ids: list[int], seed: int) -> dict[str, Any]:
    s = out.stats
    return {"images": ids, "seed": seed, "tokens": s.tokens, "target_forwards": s.target_forwards,
            "draft_forwards": s.draft_forwards, "step_compression": s.step_compression,
            "mean_accepted_length": s.mean_accepted_length, "wall_s": s.wall_s}


def _conditions(pipe, job: Job) -> tuple[list, tuple[int, int] | None]:
    """The conditions image i takes entry i mod len of (``job.prompts``, or ``job.classes``: every
    class when none) and the grid of a text-to-image job (None for class ids)."""
    if pipe.num_classes == 0:
        if job.classes:
            raise ValueError(f"model {pipe.name} is text-to-image: give --prompts FILE, not --class")
        if not job.prompts:
            raise ValueError(f"model {pipe.name} is text-to-image: give --prompts FILE (one prompt a line)")
        return list(job.prompts), pipe.set_grid(job.height, job.width)
    if job.prompts:
        raise ValueError(f"model {pipe.name} is class-conditional: give --class N ..., not --prompts")
    if job.height is not None or job.width is not None:
        raise ValueError(f"model {pipe.name} is class-conditional: --height/--width do not apply")
    conditions = list(range(pipe.num_classes)) if not job.classes else list(job.classes)
    bad = [c for c in conditions if not 0 <= c < pipe.num_classes]
    if bad:
        raise ValueError(f"--class {bad[0]} is out of range; model {pipe.name} has classes 0..{pipe.num_classes - 1}")
    return conditions, None


def _check_seeds(seed: int, num: int, n_batches: int, keyed: bool) -> None:
    """Every seed the run uses is a seed: image i's (seed + i) under keyed noise, batch j's (seed + j)."""
    if keyed and seed + num - 1 >= SEED_LIMIT:
        raise ValueError(f"--seed {seed}: under keyed noise image i has seed + i, and image {num - 1} would pass "
                         f"2**64-1; give a seed <= {SEED_LIMIT - num}")
    if seed + n_batches - 1 >= SEED_LIMIT:
        raise ValueError(f"--seed {seed}: batch j runs with seed + j, and the last of {n_batches} batches would "
                         f"pass 2**64-1; give a seed <= {SEED_LIMIT - n_batches}")


@dataclasses.dataclass(frozen=True)
class _Run:
    """One rank's part of a ``sample`` run: the job as run (method and sampling resolved), its
    conditions and grid, the work list and this rank's batches of it."""

    pipe: Any
    job: Job
    out: Path
    config: dict[str, Any]
    conditions: list
    grid: tuple[int, int] | None
    work: list
    mine: list[int]
    my_work: list
    dist: Dist


def sample(pipe, job: Job, *, dist: Dist | None = None, progress: bool = False,
           log: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Generate ``job.num`` images into the directory ``job.out`` (module docstring); this rank's
    share only. Returns the merged stats on rank 0, None on the other ranks. ``job.classes``
    (class-conditional; default every class) or ``job.prompts`` (text-to-image): image i gets entry
    i mod len; batches of ``job.batch_size``, batch j seeded from ``job.seed`` (module docstring)."""
    dist = dist or Dist()
    log = log or (lambda line: print(line, flush=True))
    num, batch_size, seed = job.num, job.batch_size, job.seed
    if num is None or num < 1:
        raise ValueError(f"--num must be >= 1, got {num}")
    if batch_size is None or batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if job.out is None:
        raise ValueError("--out: give the output directory (Job.out)")
    conditions, grid = _conditions(pipe, job)
    out = Path(job.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    sampling = call_sampling(pipe, job.sampling)  # the noise resolved: keyed by default for discrete-token models
    # None: AR; with the rule it runs with (Coupled by default under keyed noise)
    method = keyed_method(method_argument(job.method), sampling)
    name, method_config, rule = describe(method)
    config = {"model": job.model or pipe.name, "method": name, "config": method_config, "acceptance": rule,
              "lossless": bool(method.lossless), "sampling": _asdict(sampling), "seed": seed,
              "batch_size": batch_size, "num": num, "dtype": str(pipe.dtype).removeprefix("torch."),
              **({"prompts": conditions, "height": grid[0], "width": grid[1]} if grid else {"classes": conditions})}
    _check_seeds(seed, num, -(-num // batch_size), sampling.keyed)
    work = batches(num, batch_size, len(conditions), seed, keyed=sampling.keyed)
    mine, my_work = shard_work(work, dist.world, dist.rank, allow_empty=True)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "stats").mkdir(parents=True, exist_ok=True)
    run = _Run(pipe, dataclasses.replace(job, method=method, sampling=sampling), out, config, conditions, grid, work,
               mine, my_work, dist)
    with _rank_lock(out, dist.rank):
        return _sample_locked(run, progress, log)


def _generate_batch(run: _Run, conds: list[int], seed: int):
    """One batch of the work list: its conditions (indices into ``run.conditions``) at ``seed``."""
    picked = [run.conditions[c] for c in conds]
    batch = dataclasses.replace(run.job, num=None, batch_size=None, seed=seed, classes=None if run.grid else picked,
                                prompts=picked if run.grid else None,
                                height=run.grid[0] if run.grid else None, width=run.grid[1] if run.grid else None)
    return batch.run(run.pipe)


def _sample_locked(run: _Run, progress: bool, log: Callable[[str], None]) -> dict[str, Any] | None:
    """``sample``'s work once this rank holds its lock on ``out``."""
    out, dist, batch_size = run.out, run.dist, run.job.batch_size
    _clean_temps(out)  # a killed run's temporaries
    _check_config(out, run.config, dist)

    # stats of my batches from earlier runs (any number of ranks), for the batches skipped now
    old: dict[int, dict] = {}
    for f in sorted((out / "stats").glob("rank*.json")):
        for j, st in ((_read_json(f) or {}).get("batches") or {}).items():
            old.setdefault(int(j), st)
    mine_set = set(run.mine)
    record = {j: st for j, st in old.items() if j in mine_set}
    generated = skipped = 0
    from .progress import ImageBar

    bar = ImageBar(sum(len(c) for c, _ in run.my_work), run.pipe.target.layout.stream_len, f"sample rank {dist.rank}",
                   enabled=progress and dist.rank == 0)
    for j, (conds, s) in zip(run.mine, run.my_work):
        first = j * batch_size
        ids = list(range(first, first + len(conds)))
        missing = [i for i in ids if not _complete(image_path(out, i))]
        if not missing:
            skipped += len(ids)
            bar.update(len(ids), tokens=0)  # already there: done, nothing decoded
            continue
        for i in missing:
            if image_path(out, i).exists():
                log(f"specvis: {image_path(out, i)} is damaged (an incomplete PNG): regenerating its batch")
        gen = _generate_batch(run, conds, s)
        for i in missing:
            write_png(gen.images[i - first], image_path(out, i))
        generated += len(missing)
        record[j] = _batch_stats(gen, ids, s)
        _write_rank(out, dist, record)
        bar.update(len(ids))
    bar.close()
    # always leave this rank's file (carried-over stats too) for the merge, even with nothing to do
    _write_rank(out, dist, record)
    dist.barrier()
    if dist.rank != 0:
        return None
    merged = _merge(out, run.config, len(run.work), dist.world, generated_here=generated, skipped_here=skipped)
    merged["npz_shape"] = list(write_npz(out / "samples.npz", [image_path(out, i) for i in range(run.job.num)]))
    write_json(out / "stats.json", merged)
    _clean_temps(out)
    return merged


def _merge(out: Path, config: dict[str, Any], n_batches: int, world: int, **counts) -> dict[str, Any]:
    """Stats of every batch, from the rank files of this run (which carry earlier runs' stats)."""
    per_batch: dict[int, dict] = {}
    per_rank = {}
    for r in range(world):
        data = _read_json(_rank_file(out, r)) or {}
        got = {int(j): st for j, st in (data.get("batches") or {}).items()}
        per_batch.update(got)
        per_rank[str(r)] = {"batches": len(got), "images": sum(len(st["images"]) for st in got.values()),
                            "wall_s": sum(st["wall_s"] for st in got.values())}
    sts = [per_batch[j] for j in sorted(per_batch)]
    n = sum(len(st["images"]) for st in sts)

    def mean(key: str) -> float:
        return sum(len(st["images"]) * st[key] for st in sts) / n if n else float("nan")

    wall = sum(st["wall_s"] for st in sts)
    return {**config, "world_size": world, "n_images": config["num"], "n_batches": n_batches,
            "batches_with_stats": len(sts), "tokens": sts[0]["tokens"] if sts else None,
            "target_forwards": sum(st["target_forwards"] for st in sts),
            "draft_forwards": sum(st["draft_forwards"] for st in sts),
            "step_compression": mean("step_compression"), "mean_accepted_length": mean("mean_accepted_length"),
            "wall_s": wall, "images_per_s": n / wall if wall > 0 else float("nan"),
            "per_rank": per_rank, **{f"rank0_{k}": v for k, v in counts.items()}, "batches": sts}


def _clean_temps(out: Path) -> None:
    """Temp files left by a killed run (``io.atomic_write`` names: ``.NAME.PID.HEX.tmp``, PID not running)."""
    for d in (out, out / "images", out / "stats"):
        for p in clean_stale_temps(d):
            print(f"specvis: cannot remove stale {p}", file=sys.stderr)
