"""The command line as a user runs it: outputs on disk, one-line errors, bench JSON fields."""

import json
import subprocess
import sys

import pytest

from specvis.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "specvis.cli", *args], capture_output=True, text=True)


def test_generate_random_tiny_writes_pngs_and_stats(tmp_path):
    assert main(["generate", "--model", "random-tiny", "--num", "4", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["000.png", "001.png", "002.png", "003.png", "grid.png", "heatmap.png", "stats.json"]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["tokens"] == 64 and stats["target_forwards"] == 64 and stats["step_compression"] == 1.0
    assert len(stats["accept_map"]) == 4


def test_generate_speculative_counts_draft_forwards(tmp_path):
    assert main(["generate", "--model", "random-tiny", "--method", "speculative", "--gamma", "3",
                 "--class", "1", "2", "--out", str(tmp_path)]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["classes"] == [1, 2] and stats["draft_forwards"] > stats["target_forwards"]
    assert stats["target_forwards"] < 64


@pytest.mark.parametrize("args,needle", [
    (["generate", "--model", "nope"], "unknown model 'nope'"),
    (["generate", "--model", "random-tiny", "--class", "9"], "--class 9 is out of range"),
    (["generate", "--model", "random-tiny", "--temperature", "-1"], "temperature"),
    (["generate", "--model", "random-tiny", "--gamma", "x"], "--gamma"),
    (["generate", "--model", "random-tiny", "--method", "warp"], "unknown method 'warp'"),
    (["generate", "--model", "random-tiny", "--method", "speculative", "--gamma", "0"], "gamma"),
    (["bench", "--model", "random-tiny", "--num", "0"], "--num"),
])
def test_bad_input_is_one_line(args, needle, tmp_path):
    r = run(*args, *(["--out", str(tmp_path / "o")] if args[0] == "generate" else []))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr


def test_bench_json_has_api_fields(tmp_path):
    j, md = tmp_path / "b.json", tmp_path / "b.md"
    assert main(["bench", "--model", "random-tiny", "--methods", "speculative:gamma=2", "--num", "4",
                 "--batch-size", "2", "--json", str(j), "--md", str(md)]) == 0
    rep = json.loads(j.read_text())
    for key in ["specvis_version", "model", "device", "torch", "batch_size", "num_images", "seed", "runs"]:
        assert key in rep
    assert [r["method"] for r in rep["runs"]] == ["ar", "speculative"]  # AR always first
    for r in rep["runs"]:
        for key in ["method", "config", "acceptance", "lossless", "tokens", "target_forwards", "step_compression",
                    "mean_accepted_length", "wall_s", "images_per_s", "speedup", "quality"]:
            assert key in r
    assert rep["runs"][0]["speedup"] == 1.0 and rep["runs"][1]["config"] == {"gamma": 2}
    assert rep["runs"][0]["tokens"] == 4 * 64
    assert "| speculative | gamma=2 |" in md.read_text()


@pytest.mark.parametrize("args,message", [
    (["bench", "--methods", "speculative:gamma=4:bogus=1"],
     "method speculative has no option 'bogus'; options: gamma, accept, and the acceptance rule's "
     "(exact: none; lantern: k, delta, metric, budget"),  # + any later Lantern fields
    (["bench", "--methods", "ar,speculative:gama=4"], "method speculative has no option 'gama'; options: gamma, accept"),
    (["bench", "--methods", "speculative:gamma=4:delta=0.2"],
     "method speculative has no option 'delta' with acceptance rule exact; it is an option of rule lantern "
     "(set accept=lantern)"),
    (["bench", "--methods", "ar:accept=lantern"], "method ar has no option 'accept' (it takes no acceptance rule)"),
    (["generate", "--method", "ar", "--gamma", "4"], "method ar has no option '--gamma'; options: none"),
    (["generate", "--method", "speculative", "--lantern-delta", "0.2"],
     "method speculative has no option '--lantern-delta' with acceptance rule exact; it is an option of rule "
     "lantern (set --accept=lantern)"),
])
def test_method_option_not_of_the_method_exits_2_with_one_line(args, message, tmp_path, capsys):
    """Unknown, misspelt or foreign keys (another rule's, another method's flag) are errors, not ignored."""
    out = ["--out", str(tmp_path)] if args[0] == "generate" else ["--num", "1", "--json", str(tmp_path / "b.json")]
    assert main([*args, "--model", "random-tiny", *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specvis: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing ran
