"""The command line as a user runs it: outputs on disk, one-line errors, bench JSON fields."""

import json
import subprocess
import sys

import pytest

import specvis as sv
from specvis.cli import DEFAULT_METHODS, build_parser, default_method_spec, main
from specvis.registry import method_from_spec


def run(*args):
    return subprocess.run([sys.executable, "-m", "specvis.cli", *args], capture_output=True, text=True)


def test_generate_random_tiny_writes_pngs_and_stats(tmp_path):
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "4", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["000.png", "001.png", "002.png", "003.png", "grid.png", "heatmap.png", "stats.json"]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["tokens"] == 64 and stats["target_forwards"] == 64 and stats["step_compression"] == 1.0
    assert len(stats["accept_map"]) == 4


def test_generate_batch_size_runs_the_images_through_fewer_rows(tmp_path, capsys):
    """--batch-size 2 with 5 images: continuous batching, the images of a one-call run (AR: 3 waves of
    the 64-token stream), recorded in stats.json; a method that cannot restart rows exits 2 in one line."""
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "5", "--batch-size", "2",
                 "--out", str(tmp_path / "a")]) == 0
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert stats["batch_size"] == 2 and len(stats["accept_map"]) == 5 and stats["target_forwards"] == 3 * 64
    assert len(list((tmp_path / "a").glob("00*.png"))) == 5
    capsys.readouterr()
    assert main(["generate", "--model", "random-tiny", "--method", "speculative", "--num", "5", "--batch-size", "2",
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "method speculative does not support" in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists()


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
    (["generate", "--model", "random-tiny", "--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
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
    (["generate", "--method", "speculative:gamma=4:bogus=1"],  # a spec in --method: errors in its keys
     "method speculative has no option 'bogus'; options: gamma, accept, and the acceptance rule's"),
    (["generate", "--method", "speculative:gamma=4", "--lantern-delta", "0.2"],
     "method speculative has no option '--lantern-delta' with acceptance rule exact"),
    (["generate", "--method", "sjd:window=8", "--window", "16"], "--window 16 contradicts window=8 in --method sjd:window=8"),
])
def test_method_option_not_of_the_method_exits_2_with_one_line(args, message, tmp_path, capsys):
    """Unknown, misspelt or foreign keys (another rule's, another method's flag) are errors, not ignored."""
    out = ["--out", str(tmp_path)] if args[0] == "generate" else ["--num", "1", "--json", str(tmp_path / "b.json")]
    assert main([*args, "--model", "random-tiny", *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specvis: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_generate_defaults_to_the_best_lossless_method(tmp_path, capsys):
    """No --method: the model's entry of DEFAULT_METHODS (SJD, vertical-sample init, Gumbel coupling for
    discrete-token models), named in the summary with its step compression; --method ar is plain AR."""
    best = sv.SJD(window=16, init="vertical-sample", coupling="gumbel")
    assert method_from_spec(DEFAULT_METHODS["emoji"]) == best and method_from_spec(DEFAULT_METHODS["discrete"]) == best
    assert main(["generate", "--model", "random-tiny", "--num", "2", "--out", str(tmp_path)]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["method"] == "sjd" and stats["default_method"] and stats["lossless"]
    assert stats["config"] == {"window": 16, "init": "vertical-sample", "refine": True, "coupling": "gumbel"}
    assert stats["step_compression"] > 1.0
    out = capsys.readouterr().out
    assert "method sjd" in out and "the model's default" in out and "step compression" in out
    # method flags without --method adjust the default
    assert main(["generate", "--model", "random-tiny", "--num", "1", "--window", "4", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "stats.json").read_text())["config"]["window"] == 4


def test_method_takes_a_bench_spec_and_flags_on_top(tmp_path):
    """--method accepts bench's spec syntax (the form the help prints for the default); a flag that
    agrees with the spec or sets another key adds to it."""
    assert main(["generate", "--model", "random-tiny", "--num", "1", "--out", str(tmp_path),
                 "--method", "sjd:window=4:init=horizontal-sample", "--window", "4", "--coupling", "gumbel"]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["method"] == "sjd" and not stats["default_method"]
    assert stats["config"] == {"window": 4, "init": "horizontal-sample", "refine": True, "coupling": "gumbel"}


def test_continuous_models_keep_ar_as_default(tmp_path):
    pipe = sv.load("random-tiny-continuous")
    assert default_method_spec(pipe) == "ar"
    assert main(["generate", "--model", "random-tiny-continuous", "--num", "1", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "stats.json").read_text())["method"] == "ar"


def test_compare_ar_prints_the_speedup_and_keeps_the_method_images(tmp_path, capsys):
    assert main(["generate", "--model", "random-tiny", "--num", "2", "--compare-ar", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs ar (same conditions and seed)" in out and "speedup" in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    cmp = stats["compare_ar"]
    assert cmp["ar_target_forwards"] == 64 and cmp["speedup"] == pytest.approx(cmp["ar_wall_s"] / stats["wall_s"])
    assert stats["method"] == "sjd" and sorted(p.name for p in tmp_path.iterdir()) == [
        "000.png", "001.png", "grid.png", "heatmap.png", "stats.json"]
    # the images are the method's: the same as without --compare-ar
    again = tmp_path / "again"
    assert main(["generate", "--model", "random-tiny", "--num", "2", "--out", str(again)]) == 0
    assert (again / "000.png").read_bytes() == (tmp_path / "000.png").read_bytes()


def test_every_option_of_every_subcommand_has_help():
    import argparse

    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subs) == 1
    checked = 0
    for name, sub in subs[0].choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            assert action.help and action.help.strip(), f"specvis {name} {'/'.join(action.option_strings)} has no help"
            checked += 1
    assert {"generate", "sample", "bench", "models"} <= set(subs[0].choices) and checked > 50


def test_a_warning_is_one_line_on_stderr(tmp_path, capsys):
    """A library warning reaches the CLI user as one "specvis: warning: ..." line (not Python's file,
    line number and source line), and the header counts "1 image". Catches: the hook lost or
    left installed after main returns."""
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "1", "--compile", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    warned = [ln for ln in out.err.splitlines() if "compile skipped" in ln]
    assert warned and all(ln.startswith("specvis: warning: torch.compile skipped on CPU") for ln in warned), out.err
    assert "zoo.py" not in out.err and "| 1 image, classes" in out.out
    import warnings

    assert warnings.showwarning is not sv.cli._show_warning
