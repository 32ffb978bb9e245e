"""One picture per seed from the command line: ``--noise keyed`` in ``generate`` (seeds recorded, ``--compare-ar``
checks AR's images) and ``sample`` (image i has seed + i: the same PNGs whatever the ranks, batch size and method)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specvis import shards
from specvis.cli import main

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--model", "random-tiny", "--num", "5", "--seed", "3", "--noise", "keyed"]


def test_generate_records_seeds_and_compare_ar_checks_the_images(tmp_path, capsys):
    assert main(["generate", "--model", "random-tiny", "--num", "3", "--seed", "11", "--noise", "keyed",
                 "--compare-ar", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "keyed noise: 3 of 3 images equal AR's for the same seeds, token for token" in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["seeds"] == [11, 12, 13] and stats["acceptance"] == "coupled"
    assert stats["sampling"]["noise"] == "keyed" and stats["compare_ar"]["images_equal_ar"] == 3
    ar = tmp_path / "ar"
    assert main(["generate", "--model", "random-tiny", "--num", "3", "--seed", "11", "--noise", "keyed",
                 "--method", "ar", "--out", str(ar)]) == 0
    for name in ("000.png", "001.png", "002.png"):
        assert (ar / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_generate_under_stream_noise_records_no_seeds(tmp_path):
    assert main(["generate", "--model", "random-tiny", "--num", "1", "--noise", "stream", "--out", str(tmp_path)]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["seeds"] == [] and stats["sampling"]["noise"] == "stream" and stats["acceptance"] == "exact"


def test_generate_defaults_to_keyed_noise_and_records_it_resolved(tmp_path):
    assert main(["generate", "--model", "random-tiny", "--num", "2", "--seed", "4", "--out", str(tmp_path)]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["seeds"] == [4, 5] and stats["sampling"]["noise"] == "keyed" and stats["acceptance"] == "coupled"


@pytest.mark.parametrize("args,needle", [
    (["--noise", "per-image"], "noise must be one of stream, keyed"),
    (["--noise", "stream", "--accept", "coupled"], "needs keyed noise"),
])
def test_bad_noise_is_one_line_exit_2(args, needle, tmp_path, capsys):
    assert main(["generate", "--model", "random-tiny", "--num", "1", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


def test_keyed_batches_give_image_i_seed_plus_i():
    assert shards.batches(5, 2, 4, 3, keyed=True) == [([0, 1], 3), ([2, 3], 5), ([0], 7)]


def _pngs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "images").iterdir())}


def test_sample_gives_the_same_pictures_for_any_ranks_batch_size_and_method(tmp_path):
    one = tmp_path / "one"
    assert main(["sample", *ARGS, "--batch-size", "2", "--out", str(one)]) == 0
    stats = json.loads((one / "stats.json").read_text())
    assert [b["seed"] for b in stats["batches"]] == [3, 5, 7] and stats["acceptance"] == "coupled"
    ar = tmp_path / "ar"
    assert main(["sample", *ARGS, "--batch-size", "3", "--method", "ar", "--out", str(ar)]) == 0
    assert _pngs(ar) == _pngs(one)
    ranks = tmp_path / "ranks"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "--nproc_per_node", "2", "--monitor-interval", "0.2",
           "-m", "specvis.cli", "--", "sample", *ARGS, "--batch-size", "1", "--out", str(ranks)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "5 images on 2 rank(s)" in r.stdout
    assert _pngs(ranks) == _pngs(one)
    assert np.array_equal(np.load(ranks / "samples.npz")["arr_0"], np.load(one / "samples.npz")["arr_0"])


def test_bench_under_keyed_noise_runs_coupled_with_image_seeds(tmp_path):
    report = tmp_path / "b.json"
    assert main(["bench", "--model", "random-tiny", "--methods", "ar,sjd:window=4", "--num", "4", "--batch-size", "2",
                 "--noise", "keyed", "--no-cost-curve", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["sampling"]["noise"] == "keyed"
    assert [(r["method"], r["acceptance"]) for r in data["runs"]] == [("ar", "none"), ("sjd", "coupled")]
