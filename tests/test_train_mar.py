"""specvis.train.train_mar smoke test: a few steps of a tiny MAR on fake latents; the held-out loss
falls, a rerun resumes from the checkpoint, checkpoint-last.pth loads with load_mar_checkpoint (EMA
weights as model_ema), the presets share what CSpD needs, bad input is one line. Seconds on CPU."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from specvis.models.mar import load_mar_checkpoint
from specvis.train import train_mar as tm

TINY = json.dumps(dict(encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2, decoder_embed_dim=32,
                       decoder_depth=1, decoder_num_heads=2, diffloss_d=1, diffloss_w=32, buffer_size=2,
                       num_train_steps=50, num_sampling_steps=5))


def argv(tokens, out, steps, *extra):
    return ["--tokens", str(tokens), "--out", str(out), "--config", TINY, "--batch-size", "16", "--lr", "3e-3",
            "--warmup", "5", "--max-steps", str(steps), "--log-every", "5", "--minutes", "10", *extra]


def test_train_resume_and_official_checkpoint(tmp_path, capsys):
    tokens, out = tmp_path / "latents.npz", tmp_path / "run"
    tm.fake_latents(tokens, n_train=64, n_eval=16, grid=4, dim=4, num_classes=3)
    assert tm.main(argv(tokens, out, 40)) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 40
    assert report["final_eval_loss"] < 0.9 * report["initial_eval_loss"], report
    assert report["final_eval_loss_ema"] < 0.95 * report["initial_eval_loss"], report  # the EMA moved too
    ema = load_mar_checkpoint(out / "checkpoint-last.pth")  # model_ema
    raw = load_mar_checkpoint(out / "checkpoint-last.pth", ema=False)
    assert ema.config.clip_denoised == 2.0 and ema.seq_len == 16 and ema.token_embed_dim == 4
    assert any(not torch.equal(a, b) for a, b in zip(ema.state_dict().values(), raw.state_dict().values()))
    assert torch.isfinite(ema.sample(torch.tensor([0, 2]), num_iter=4, seed=0).tokens).all()
    capsys.readouterr()
    assert tm.main(argv(tokens, out, 50)) == 0  # resume: 10 more steps
    printed = capsys.readouterr().out
    assert "resuming from" in printed
    assert [int(line.split()[1]) for line in printed.splitlines() if line.startswith("step ") and " lr " in line] == [45, 50]
    assert json.loads((out / "report.json").read_text())["steps"] == 50
    with open(out / "losses.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps == list(range(5, 51, 5))


def test_presets_fit_cspd_and_errors_are_one_line(tmp_path, capsys):
    t = tm.build_config("mar-emoji", 8, 11, 256, {})
    d = tm.build_config("mar-emoji-draft", 8, 11, 256, {})
    assert (t.seq_len, t.token_embed_dim, t.class_num) == (d.seq_len, d.token_embed_dim, d.class_num) == (256, 8, 11)
    assert t.seq_h == 16 and t.clip_denoised == pytest.approx(8 ** 0.5)
    tokens = tmp_path / "latents.npz"
    tm.fake_latents(tokens, grid=3)
    assert tm.main(argv(tmp_path / "missing.npz", tmp_path / "a", 2)) == 2
    assert tm.main(["--tokens", str(tokens), "--out", str(tmp_path / "b"), "--config", '{"nope": 1}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("error:") for e in err), err
