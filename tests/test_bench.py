"""Bench harness: resume, shards + merge, pluggable quality metrics, fid_proxy, reports and plots."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import specvis.bench.runner as runner
from specvis.bench.runner import Bench
from specvis.job import Job
from specvis.bench import quality
from specvis.bench.quality import (ClassifierConfig, EmojiClassifier, FrechetMetric, QualitySource, build_metrics,
                                   frechet_distance)
from specvis.bench.report import TIMING_FIELDS, merge_reports, run_labels
from specvis.cli import main
from specvis.zoo import load

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pipe():
    return load("random-tiny")


class FakeExtractor:
    """Mean colour and brightness spread per image: a stand-in for Inception/CLIP features."""

    name = "fake"

    def features(self, images: np.ndarray) -> np.ndarray:
        x = images.astype(np.float64) / 255.0
        return np.concatenate([x.mean((1, 2)), x.std((1, 2, 3))[:, None]], 1)


def fake_metric(src: QualitySource) -> FrechetMetric:
    rng = np.random.default_rng(0)
    return FrechetMetric("fake_fid", FakeExtractor(), rng.integers(0, 256, (16, 8, 8, 3), dtype=np.uint8))


def strip_timings(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in ("runs", "merged_from", "n_images", "repeats")}
    out["runs"] = [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in report["runs"]]
    return out


def assert_close(a, b, path="report"):
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-6, abs=2e-4), path
    else:
        assert a == b, path


def test_resume_skips_completed_runs(pipe, tmp_path, monkeypatch):
    """An interrupted benchmark keeps its completed rounds and a rerun runs only what is missing; an
    equal rerun runs nothing, another seed everything. Catches a resume that redoes or drops passes."""
    calls, stop = [], [4]  # a round of one batch: two warm-ups, two timed batches
    real = runner._run

    def counting(*a, **k):
        if stop[0] and len(calls) >= stop[0]:
            raise KeyboardInterrupt
        calls.append(a[2].name)
        return real(*a, **k)

    monkeypatch.setattr(runner, "_run", counting)
    path = tmp_path / "b.json"
    specs = ["speculative:gamma=2"]
    with pytest.raises(KeyboardInterrupt):  # interrupted in round 2, round 1 written
        runner.run_bench(pipe, Job(num=2, batch_size=2, out=path), Bench(specs=specs, repeats=2), progress=False)
    first = json.loads(path.read_text())
    assert [(r["method"], len(r["wall_s_repeats"])) for r in first["runs"]] == [("ar", 1), ("speculative", 1)]

    stop[0] = 0
    calls.clear()
    report = runner.run_bench(pipe, Job(num=2, batch_size=2, out=path), Bench(specs=specs, repeats=2), progress=False)
    assert calls == ["ar", "speculative"] * 2  # round 2 only
    assert [r["wall_s_repeats"][0] for r in report["runs"]] == [r["wall_s_repeats"][0] for r in first["runs"]]
    assert [len(r["wall_s_repeats"]) for r in json.loads(path.read_text())["runs"]] == [2, 2]

    calls.clear()
    runner.run_bench(pipe, Job(num=2, batch_size=2, out=path), Bench(specs=specs, repeats=2), progress=False)
    assert calls == []  # everything reused
    runner.run_bench(pipe, Job(num=2, batch_size=2, seed=1, out=path), Bench(specs=specs), progress=False)
    assert len(calls) == 4  # another seed is another configuration


def test_two_shards_merge_to_the_unsharded_report(pipe, tmp_path, monkeypatch):
    monkeypatch.setitem(quality.METRICS, "fake", fake_metric)
    specs = ["speculative:gamma=2"]
    runner.run_bench(pipe, Job(num=8, batch_size=2, out=tmp_path / "all.json"), Bench(specs=specs, metrics=["fake"]),
                     progress=False)
    parts = [tmp_path / f"s{i}.json" for i in range(2)]
    for i, p in enumerate(parts):
        shard = runner.run_bench(pipe, Job(num=8, batch_size=2, out=p),
                                 Bench(specs=specs, metrics=["fake"], shards=2, shard_index=i), progress=False)
        assert shard["n_images"] == 4 and shard["runs"][0]["n_images"] == 4
    assert main(["bench", "--merge", *map(str, parts), "--json", str(tmp_path / "m.json")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["runs"][0]["speedup"] == 1.0 and merged["runs"][0]["n_images"] == 8
    assert merged["runs"][1]["wall_s"] == pytest.approx(sum(json.loads(p.read_text())["runs"][1]["wall_s"] for p in parts))
    assert "fake_fid" in merged["runs"][1]["quality"] and "fake_fid_std" in merged["runs"][1]["quality"]
    assert_close(strip_timings(json.loads((tmp_path / "all.json").read_text())), strip_timings(merged))

    with pytest.raises(ValueError, match="shards 0..1"):
        merge_reports([parts[0], parts[0]])


def test_fake_extractor_metrics_and_no_quality_without_extractor(pipe, tmp_path, monkeypatch):
    warnings = []
    src = QualitySource(pipe)
    assert build_metrics(None, src, warnings.append) == []  # random-tiny ships no classifier: quiet, no quality
    assert build_metrics(["proxy", "nope"], src, warnings.append) == [] and len(warnings) == 2
    report = runner.run_bench(pipe, Job(num=4, batch_size=1), Bench(specs=[]), progress=False)
    assert report["runs"][0]["quality"] == {}

    monkeypatch.setitem(quality.METRICS, "fake", fake_metric)
    report = runner.run_bench(pipe, Job(num=8, batch_size=2), Bench(specs=[], metrics=["fake", "fid"]), progress=False)
    q = report["runs"][0]["quality"]
    assert q["n_images"] == 8 and q["fake_fid"] > 0 and q["n_reference_fake_fid"] == 16
    assert len(q["fake_fid_groups"]) == 4 and q["fake_fid_std"] >= 0 and report["quality_groups"] == 4
    # 8 images in 2 batches of 4: 2 seed groups (one a batch), and the report says so
    report = runner.run_bench(pipe, Job(num=8, batch_size=4), Bench(specs=[], metrics=["fake", "fid"]), progress=False)
    assert len(report["runs"][0]["quality"]["fake_fid_groups"]) == report["quality_groups"] == 2


def test_classifier_proxy_from_bundle_dir(pipe, tmp_path):
    torch.manual_seed(0)
    model = EmojiClassifier(ClassifierConfig(num_classes=4, channels=(8, 16), feature_dim=6))
    model.set_reference(torch.randn(20, 6).abs(), torch.arange(20) % 4)
    model.save_pretrained(tmp_path / "bundle" / "classifier", dtype=torch.float16)
    loaded = EmojiClassifier.from_pretrained(tmp_path / "bundle" / "classifier")
    assert loaded.ref_features.shape == (20, 6) and loaded.ref_features.dtype == torch.float32
    fake_pipe = type("P", (), {"name": "fake", "tokenizer": pipe.tokenizer, "decodes": True,
                               "extras": {"root": tmp_path / "bundle"}})()
    (metric,) = build_metrics(None, QualitySource(fake_pipe))
    obs = metric.observe(np.random.default_rng(0).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8), np.arange(5) % 4)
    assert obs["fid_proxy"].shape == (5, 6) and set(np.unique(obs["class_accuracy"])) <= {0.0, 1.0}


def test_fid_proxy_zero_on_itself_positive_when_shifted():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(400, 8)) @ rng.normal(size=(8, 8))
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)
    assert frechet_distance(a, a + 1.0) == pytest.approx(8.0, rel=1e-6)  # mean shift of 1 in 8 dims
    assert frechet_distance(a, 2 * a) > 1.0
    scipy_linalg = pytest.importorskip("scipy.linalg")
    b = rng.normal(size=(300, 8))
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    ref = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca + cb - 2 * scipy_linalg.sqrtm(ca @ cb).real)
    assert frechet_distance(a, b) == pytest.approx(ref, rel=1e-6)


def test_markdown_plots_and_readme_table(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    j, md, plots = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "plots"
    assert main(["bench", "--model", "random-tiny", "--methods", "sjd:window=4,sjd:window=2", "--num", "2",
                 "--batch-size", "2", "--json", str(j), "--md", str(md), "--plots", str(plots)]) == 0
    assert "| sjd | window=2" in md.read_text()
    for name in ("speedup.png", "step_compression.png", "acceptance.png"):
        assert (plots / name).read_bytes()[:4] == b"\x89PNG"
    report = json.loads(j.read_text())
    # keyed noise, the default: the lossless runs verify by Coupled, and their labels say so
    assert run_labels(report["runs"]) == ["ar", "sjd+coupled(window=4)", "sjd+coupled(window=2)"]
    assert set(report["runs"][1]["accept_map_per_class"]) == {"0", "1"}

    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- bench-table:start -->\nold\n<!-- bench-table:end -->\ntail\n")
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "scripts" / "readme_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(j), str(readme)]) == 0
    text = readme.read_text()
    assert "old" not in text and "| sjd | window=4" in text and text.endswith("<!-- bench-table:end -->\ntail\n")
    readme.write_text("no markers\n")
    assert script.main([str(j), str(readme)]) == 1
    assert "bench-table" in capsys.readouterr().err and readme.read_text() == "no markers\n"


def test_train_classifier_smoke(tmp_path):
    from specvis.train.emoji_data import synthetic_dataset
    from specvis.train.train_classifier import main as train_main

    x, y = synthetic_dataset(6, 3, size=32)
    for split, sl in (("train", slice(None)), ("eval", slice(None, None, 2))):
        np.savez(tmp_path / f"{split}.npz", images=x[sl], labels=y[sl])
    assert train_main(["--data", str(tmp_path), "--out", str(tmp_path / "clf"), "--minutes", "0.002",
                       "--batch-size", "8"]) == 0
    rep = json.loads((tmp_path / "clf" / "report.json").read_text())
    assert 0 <= rep["heldout_accuracy"] <= 1 and rep["n_heldout"] == 9
    assert EmojiClassifier.from_pretrained(tmp_path / "clf" / "final").ref_features.shape[0] == 9


def test_tree_runs_report_mean_tree_depth(pipe):
    """Method-specific Stats.extra figures (ADT-Tree's d-bar) reach the bench JSON."""
    report = runner.run_bench(pipe, Job(num=2, batch_size=2),
                              Bench(specs=["adt:total_tokens=8"], metrics=[]), progress=False)
    depth = report["runs"][1]["mean_tree_depth"]
    assert 1.0 <= depth <= 10.0


def test_repeats_interleave_across_methods_and_resume_adds_missing_passes(pipe, tmp_path, monkeypatch):
    """A round of timed passes runs every method's warm-up, then batch 1 of AR and the method, batch 2
    of both, ... (a machine slowing down mid-benchmark then slows both alike); a rerun asking for more
    repeats adds only the missing passes to the stored runs. Catches per-method passes, consecutive
    repeats, a median over the wrong list, or a resume that redoes reused runs."""
    calls = []
    real = runner._run
    monkeypatch.setattr(runner, "_run", lambda *a, **k: calls.append((a[2].name, a[4])) or real(*a, **k))
    path = tmp_path / "b.json"
    report = runner.run_bench(pipe, Job(num=4, batch_size=2, out=path),
                              Bench(specs=["speculative:gamma=2"], repeats=3), progress=False)
    # (method, the batch's seed): under keyed noise, the default, batch j starts at image seed + j * batch size
    one_round = [("ar", 0), ("speculative", 0), ("ar", 0), ("speculative", 0), ("ar", 2), ("speculative", 2)]
    assert calls == one_round * 3
    for run in report["runs"]:
        assert len(run["wall_s_repeats"]) == 3 and run["wall_s"] == sorted(run["wall_s_repeats"])[1]
        assert run["images_per_s"] == pytest.approx(4 / run["wall_s"])
    stored = json.loads(path.read_text())["runs"]
    assert [r["wall_s_repeats"] for r in stored] == [r["wall_s_repeats"] for r in report["runs"]]

    calls.clear()
    again = runner.run_bench(pipe, Job(num=4, batch_size=2, out=path),
                             Bench(specs=["speculative:gamma=2"], repeats=4), progress=False)
    assert calls == one_round
    for old, new in zip(stored, again["runs"]):
        assert new["wall_s_repeats"][:3] == old["wall_s_repeats"] and len(new["wall_s_repeats"]) == 4
        assert new["target_forwards"] == old["target_forwards"]


def test_continuous_runs_every_image_in_one_call_and_keeps_the_seed_groups(pipe, tmp_path, monkeypatch):
    """``continuous``: the 9 images run through 2 rows in one call per method (AR: 5 waves of the
    stream's forwards, the last with one row idle), the images' classes as the batches give them, quality
    cut into the batches' seed groups, and a report key of its own (resume never mixes the two)."""
    monkeypatch.setitem(quality.METRICS, "fake", fake_metric)
    path = tmp_path / "c.json"
    report = runner.run_bench(pipe, Job(num=9, batch_size=2, out=path),
                              Bench(specs=["zipar:window=2"], metrics=["fake"], continuous=True), progress=False)
    L = pipe.target.layout.stream_len
    ar, zipar = report["runs"]
    assert report["continuous"] is True and ar["n_images"] == 9
    assert ar["target_forwards"] == 5 * L and ar["step_compression"] == pytest.approx(L * 9 / 2 / (5 * L))
    assert sum(ar["images_per_class"].values()) == 9
    assert zipar["step_compression"] > 1
    plain = runner.run_bench(pipe, Job(num=9, batch_size=2, out=path),
                             Bench(specs=["zipar:window=2"], metrics=["fake"]), progress=False)
    assert "continuous" not in plain and plain["runs"][0]["target_forwards"] == 5 * L  # run afresh, per batch
    assert report["quality_groups"] == plain["quality_groups"] == 4
    groups = [len(r["quality"]["fake_fid_groups"]) for r in (ar, plain["runs"][0])]
    assert groups[0] == groups[1] == 3  # the last group's one image has no Frechet distance
    with pytest.raises(ValueError, match="takes no --shards"):
        runner.run_bench(pipe, Job(num=9, batch_size=2), Bench(specs=[], continuous=True, shards=2), progress=False)
