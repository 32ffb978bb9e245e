"""``specvis sample``: one process and torchrun ranks give the same bytes, reruns resume, npz layout."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specvis import shards
from specvis.bench import runner
from specvis.cli import main

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--model", "random-tiny", "--num", "5", "--batch-size", "2", "--seed", "3"]


def pngs(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "images").iterdir())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """N = 1, in this process: 5 images in batches of 2 (the last batch holds one)."""
    out = tmp_path_factory.mktemp("single") / "s"
    assert main(["sample", *ARGS, "--out", str(out)]) == 0
    return out


def test_single_process_writes_pngs_npz_and_stats(single):
    assert pngs(single) == [f"{i:06d}.png" for i in range(5)]
    arr = np.load(single / "samples.npz")
    assert arr.files == ["arr_0"]
    a = arr["arr_0"]
    assert a.dtype == np.uint8 and a.shape == (5, 64, 64, 3)
    from PIL import Image

    for i in range(5):
        assert np.array_equal(a[i], np.asarray(Image.open(single / "images" / f"{i:06d}.png").convert("RGB")))
    stats = json.loads((single / "stats.json").read_text())
    assert stats["method"] == "sjd" and stats["config"]["init"] == "vertical-sample"  # the model's default
    assert stats["n_images"] == 5 and stats["n_batches"] == 3 and stats["batches_with_stats"] == 3
    assert stats["npz_shape"] == [5, 64, 64, 3]  # what the summary line prints
    assert [b["seed"] for b in stats["batches"]] == [3, 5, 7]  # keyed noise, the default: image i has seed + i
    assert stats["sampling"]["noise"] == "keyed"  # recorded resolved
    assert [b["images"] for b in stats["batches"]] == [[0, 1], [2, 3], [4]]
    assert stats["step_compression"] > 1 and stats["target_forwards"] < 5 * 64
    assert not list(single.rglob(".*.tmp"))


def test_sample_and_bench_split_work_the_same_way():
    assert runner.shard_work is shards.shard_work and runner.batches is shards.batches
    work = shards.batches(5, 2, 4, 3)
    assert work == [([0, 1], 3), ([2, 3], 4), ([0], 5)]
    assert shards.shard_work(work, 2, 1) == ([1], [([2, 3], 4)])
    assert shards.shard_work(work[:1], 2, 1, allow_empty=True) == ([], [])  # an idle rank
    with pytest.raises(ValueError, match="has no batches"):
        shards.shard_work(work[:1], 2, 1)  # bench keeps refusing an empty shard


def test_torchrun_two_ranks_give_the_same_bytes(single, tmp_path):
    out = tmp_path / "t"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "--nproc_per_node", "2", "--monitor-interval", "0.2",
           "-m", "specvis.cli", "--", "sample", *ARGS, "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "5 images on 2 rank(s)" in r.stdout
    assert pngs(out) == pngs(single)
    for name in pngs(single):
        assert (out / "images" / name).read_bytes() == (single / "images" / name).read_bytes(), name
    assert np.array_equal(np.load(out / "samples.npz")["arr_0"], np.load(single / "samples.npz")["arr_0"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["world_size"] == 2 and stats["per_rank"]["0"]["images"] == 3 and stats["per_rank"]["1"]["images"] == 2
    one = json.loads((single / "stats.json").read_text())
    assert stats["target_forwards"] == one["target_forwards"] and stats["batches_with_stats"] == 3


def test_rerun_after_a_kill_generates_only_what_is_missing(single, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(single, out)
    # a run killed mid-way: two PNGs (batches 0 and 2) and the npz never written, a temp file left over
    for i in (1, 4):
        (out / "images" / f"{i:06d}.png").unlink()
    (out / "samples.npz").unlink()
    (out / "stats.json").unlink()
    stale = out / "images" / ".000001.png.12345.deadbeef.tmp"
    stale.write_bytes(b"half a png")
    kept = {i: (out / "images" / f"{i:06d}.png").stat().st_mtime_ns for i in (0, 2, 3)}
    assert main(["sample", *ARGS, "--out", str(out)]) == 0
    assert {i: (out / "images" / f"{i:06d}.png").stat().st_mtime_ns for i in (0, 2, 3)} == kept  # not rewritten
    for name in pngs(single):  # the regenerated images are the same images
        assert (out / "images" / name).read_bytes() == (single / "images" / name).read_bytes(), name
    assert not stale.exists() and not list(out.rglob(".*.tmp"))
    assert np.array_equal(np.load(out / "samples.npz")["arr_0"], np.load(single / "samples.npz")["arr_0"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rank0_generated_here"] == 2 and stats["rank0_skipped_here"] == 2  # batch 1 skipped whole
    assert stats["batches_with_stats"] == 3  # batch 1's stats carried over from the first run

    # everything there: nothing is generated
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "images").iterdir()}
    assert main(["sample", *ARGS, "--out", str(out)]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "images").iterdir()} == mtimes
    assert json.loads((out / "stats.json").read_text())["rank0_generated_here"] == 0


@pytest.mark.parametrize("args,needle", [
    (["--model", "random-tiny", "--num", "0"], "--num must be an integer in 1..1000000, got 0"),
    (["--model", "random-tiny", "--num", "2", "--batch-size", "0"], "--batch-size must be an integer in 1.."),
    (["--model", "random-tiny", "--num", "2", "--method", "warp"], "unknown method 'warp'"),
    (["--model", "random-tiny", "--num", "2", "--class", "9"], "--class 9 is out of range"),
    (["--model", "random-tiny", "--num", "2", "--method", "ar", "--window", "4"], "method ar has no option '--window'"),
    (["--model", "random-tiny"], "required: -n/--num"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path, capsys):
    assert main(["sample", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specvis: error: ") and needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o" / "images").exists() or not list((tmp_path / "o" / "images").iterdir())


def test_rerun_with_other_settings_is_refused(single, tmp_path, capsys):
    out = tmp_path / "c"
    shutil.copytree(single, out)
    assert main(["sample", *ARGS[:-1], "4", "--out", str(out)]) == 2  # another seed
    err = capsys.readouterr().err
    assert "holds samples made with other seed" in err and err.count("\n") == 1
