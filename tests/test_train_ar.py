"""AR training script (specvis.train.train_ar) and the realism report (specvis.train.report)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specvis.models.llamagen import LlamaGen, LlamaGenConfig
from specvis.models.vq import VQConfig, VQModel
from specvis.train import report, train_ar

TINY = ["--dim", "32", "--n-layer", "1", "--n-head", "2", "--multiple-of", "8", "--batch-size", "8",
        "--lr", "3e-3", "--warmup", "5", "--minutes", "30", "--threads", "1", "--log-every", "5"]


@pytest.fixture()
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.npz"
    train_ar.fake_tokens(path, n_train=64, n_eval=16, vocab=32, grid=4, num_classes=3)
    return path


def run(tokens: Path, out: Path, steps: int, *extra: str) -> dict:
    assert train_ar.main(["--tokens", str(tokens), "--out", str(out), "--max-steps", str(steps), *TINY, *extra]) == 0
    return json.loads((out / "report.json").read_text())


def test_training_reduces_loss(tokens: Path, tmp_path: Path) -> None:
    data = train_ar.load_tokens(tokens)
    torch.manual_seed(0)  # the script's init seed: the same untrained model
    cfg = LlamaGenConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=8, num_classes=3, block_size=16)
    before = train_ar.mean_loss(LlamaGen(cfg), data["eval_codes"], data["eval_labels"])
    rep = run(tokens, tmp_path / "run", 60)
    assert rep["steps"] == 60 and rep["batch_size"] == 8 and rep["config"]["num_classes"] == 3
    assert before > 3.0  # ~ln 32 at init
    assert rep["final_eval_loss"] < before - 1.0
    assert rep["final_train_loss"] < before - 1.0
    assert {"platform", "cpu_count"} <= set(rep["machine"])
    with open(tmp_path / "run" / "losses.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(5, 61, 5))


def test_resume_continues_from_checkpoint(tokens: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run(tokens, out, 10)
    state = torch.load(out / "ckpt.pt", weights_only=False)
    assert state["step"] == 10 and first["steps"] == 10
    second = run(tokens, out, 25, "--lr", "1.0")  # hyper-parameters come from the checkpoint, not the CLI
    assert second["steps"] == 25 and second["lr"] == pytest.approx(3e-3)
    with open(out / "losses.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps == [5, 10, 15, 20, 25]  # no duplicated rows after resuming
    assert second["final_eval_loss"] < first["final_eval_loss"]
    assert second["train_minutes"] >= first["train_minutes"]


def test_saved_model_reloads_with_identical_logits(tokens: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(tokens, out, 5)
    state = torch.load(out / "ckpt.pt", weights_only=False)
    trained = LlamaGen(LlamaGenConfig(**state["config"]))
    trained.load_state_dict(state["model"])
    trained.eval()
    loaded = train_ar.load_model(out / "final")
    assert (out / "final" / "model.safetensors").exists() and (out / "final" / "config.json").exists()
    cond = torch.tensor([0, 2, 3])  # 3 = null condition
    toks = torch.randint(0, 32, (3, 15), generator=torch.Generator().manual_seed(0))
    assert torch.equal(trained.logits(cond, toks), loaded.logits(cond, toks))
    assert loaded.null_condition == 3


def test_presets_sizes() -> None:
    for preset, lo, hi in (("target", 3e6, 8e6), ("draft", 3e5, 1e6)):
        args = train_ar.parse_args(["--preset", preset, "--out", "x"])
        n = sum(p.numel() for p in LlamaGen(train_ar.build_config(args, 1024, 11, 256)).parameters())
        assert lo <= n <= hi, (preset, n)


def test_bad_inputs(tmp_path: Path, capsys) -> None:
    assert train_ar.main(["--tokens", str(tmp_path / "none.npz"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_ar.parse_args(["--out", "x", "--class-dropout", "0"])


def test_report_on_tiny_models(tokens: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    for name, dim in (("target", 32), ("draft", 16)):
        torch.manual_seed(dim)
        model = LlamaGen(LlamaGenConfig(vocab_size=32, dim=dim, n_layer=1, n_head=2, multiple_of=8,
                                        num_classes=3, block_size=16))
        model.save_pretrained(runs / name / "final")
        (runs / name / "losses.csv").write_text("step,elapsed_s,lr,loss,grad_norm,tokens_per_s\n10,1,1e-3,3.4,1,9\n"
                                                "20,2,1e-3,3.1,1,9\n")
        (runs / name / "eval.csv").write_text("step,elapsed_s,train_loss,eval_loss\n20,2,3.1,3.2\n")
    (runs / "target" / "report.json").write_text(json.dumps({"params": 1000, "steps": 20, "batch_size": 8, "lr": 1e-3,
                                                             "final_eval_loss": 3.2, "final_train_loss": 3.1}))
    torch.manual_seed(0)
    VQModel(VQConfig(codebook_size=32, codebook_embed_dim=4, encoder_ch_mult=[1, 2, 2], decoder_ch_mult=[1, 2, 2],
                     z_channels=16, ch=8, num_res_blocks=1, norm_groups=4)).save_pretrained(runs / "vq" / "final")
    md = tmp_path / "training.md"
    md.write_text("# T\n<!-- report:recipe -->\nold\n<!-- /report:recipe -->\nkeep\n"
                  "<!-- report:realism -->\n<!-- /report:realism -->\n")
    out = tmp_path / "docs"
    assert report.main(["--vq", str(runs / "vq" / "final"), "--target", str(runs / "target" / "final"),
                        "--draft", str(runs / "draft" / "final"), "--tokens", str(tokens), "--out", str(out),
                        "--per-class", "2", "--threads", "1", "--md", str(md)]) == 0
    rep = json.loads((out / "training_report.json").read_text())
    own = rep["target_samples"]
    assert own["sequences"] == 6 and len(own["target_top1_per_position"]) == 16
    assert 0.0 < own["target_top1_mean"] <= 1.0 and own["target_entropy_mean"] > 0
    assert 0.0 <= own["draft_top1_agreement"] <= own["draft_top3_agreement"] <= 1.0
    assert 0.0 < own["draft_acceptance_prob"] <= 1.0
    assert rep["eval_data"]["sequences"] == 16
    for name in ("loss_target", "loss_draft", "top1_heatmap", "target_samples"):
        assert (out / rep["images"][name]).stat().st_size > 0
    assert rep["images"]["loss_vq"] is None  # no VQ logs in this fixture
    text = md.read_text()
    assert "old" not in text and "keep" in text and "pending" in text  # VQ/draft report.json missing
    assert "target mean top-1" in text
    assert "| target mean top-1 prob" in capsys.readouterr().out


def test_law_stats_identical_draft_agrees() -> None:
    torch.manual_seed(0)
    model = LlamaGen(LlamaGenConfig(vocab_size=16, dim=16, n_layer=1, n_head=2, multiple_of=8, num_classes=2,
                                    block_size=4)).eval()
    toks = torch.randint(0, 16, (3, 4))
    import specvis

    stats = report.law_stats(model, model, torch.tensor([0, 1, 0]), toks, specvis.Sampling(cfg_scale=3.0))
    assert stats["draft_top1_agreement"] == 1.0 and stats["draft_top3_agreement"] == 1.0
    assert stats["draft_acceptance_prob"] == pytest.approx(1.0, abs=1e-5)
    assert np.isfinite(stats["target_entropy_mean"])


def test_sigterm_checkpoints_and_stops(tokens: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "specvis.train.train_ar", "--tokens", str(tokens), "--out", str(out), *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # wait for the first loss row (step 5), however slow the machine; the deadline only stops a hang
    deadline = time.monotonic() + 900
    while not (out / "losses.csv").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert (out / "losses.csv").exists(), f"no loss row after 900 s (exit {proc.poll()})"
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    assert "stopped by signal" in log
    assert not (out / "report.json").exists()
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] >= 5
