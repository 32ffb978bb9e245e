"""The continuous-token path end to end: latent tokens from the VQ encoder, ContinuousAR training,
the continuous pipelines of the zoo, AR/CSpD through the CLI and the bench, and the two-sample test."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specvis import AR, CSpD, load
from specvis.bench.two_sample import energy_test
from specvis.cli import main as cli
from specvis.models.continuous import ContinuousAR
from specvis.models.vq import VQModel
from specvis.train import tokenize as tk
from specvis.train import train_ar
from specvis.train.emoji_data import load_split

from test_emoji_data import _synthetic_with_vq


@pytest.fixture()
def latents(tmp_path):
    _synthetic_with_vq(tmp_path)
    out = tmp_path / "latents.npz"
    assert tk.main(["--latents", "--vq", str(tmp_path / "vq"), "--data", str(tmp_path / "d"), "--out", str(out),
                    "--augment", "1"]) == 0
    return tmp_path, out


def test_latent_tokens_are_scaled_normalised_encoder_latents(latents):
    root, path = latents
    vq = VQModel.from_pretrained(root / "vq")
    tx, _, _ = load_split(root / "d", "train")
    with np.load(path) as z:
        assert z["train_latents"].shape == (27 * 3, 16, 4) and z["train_latents"].dtype == np.float16
        assert z["eval_latents"].shape == (3, 16, 4) and "train_codes" not in z
        lat = torch.from_numpy(z["train_latents"][:27].astype(np.float32))
    assert torch.allclose(lat.norm(dim=-1), torch.full((27, 16), 2.0), atol=2e-3)  # |token| = sqrt(d)
    x = torch.from_numpy(tx).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        ref = vq.decode_latents(F.normalize(vq.encode_latents(x), dim=1))
    # decode_continuous undoes the sqrt(d) scale: the same images as decoding the normalised latents
    assert torch.allclose(vq.decode_continuous(lat), ref, atol=2e-2)
    with pytest.raises(ValueError, match="continuous tokens must be"):
        vq.decode_continuous(lat[:, :15])


def test_continuous_training_learns_and_resumes(latents):
    root, path = latents
    tiny = ["--dim", "32", "--n-layer", "1", "--n-head", "2", "--multiple-of", "8", "--batch-size", "8",
            "--head-width", "32", "--head-depth", "1", "--lr", "3e-3", "--warmup", "5", "--threads", "1",
            "--log-every", "5", "--preset", "continuous-draft"]
    out = root / "run"
    assert train_ar.main(["--tokens", str(path), "--out", str(out), "--max-steps", "10", *tiny]) == 0
    first = json.loads((out / "report.json").read_text())
    assert train_ar.main(["--tokens", str(path), "--out", str(out), "--max-steps", "60", *tiny]) == 0
    second = json.loads((out / "report.json").read_text())
    assert first["steps"] == 10 and second["steps"] == 60 and "uniform_loss" not in second
    # the diffusion loss at init is ~1 (eps MSE) + the variance term; 50 more steps must lower it
    assert second["final_eval_loss"] < first["final_eval_loss"] - 0.05
    model = train_ar.load_model(out / "final")
    assert isinstance(model, ContinuousAR) and model.config.token_dim == 4 and model.layout.num_tokens == 16
    assert model.config.num_sampling_steps == train_ar.SAMPLING_STEPS
    # a discrete preset on a latents file names what is missing
    assert train_ar.main(["--tokens", str(path), "--out", str(root / "r2"), "--preset", "draft"]) == 2


def test_ar_on_a_continuous_model_is_target_only_cspd():
    pipe = load("random-tiny-continuous")
    a = pipe([0, 1, 2], AR(), seed=3)
    b = pipe([0, 1, 2], CSpD(prefill=1.0), seed=3)
    # equal up to float rounding: on CPU the linear weights' layout (models/weight_layout.py) makes a
    # matmul's rounding depend on its row count, and CSpD's target forwards take other row counts; the
    # random head's variance output |v| > 1 extrapolates the step noise (official formula), so relative
    # rounding reaches 2.3e-5 at seed 3 (a wrong draw would be off by O(1))
    torch.testing.assert_close(a.latents, b.latents, rtol=1e-4, atol=1e-4)
    assert a.stats.extra == {}
    assert a.stats.step_compression == 1.0 and len(a.images) == 3
    c = pipe([0, 1, 2], CSpD(gamma=4, prefill=0.0), seed=3)
    assert 0.0 < c.stats.extra["acceptance_rate"] < 1.0  # distinct random heads: some rejections
    assert c.stats.step_compression > 1.0


def test_cli_routes_cspd_to_continuous_models(tmp_path, capsys):
    assert cli(["generate", "--model", "random-tiny-continuous", "--method", "cspd", "--ratio", "coupled",
                "--no-align", "--gamma", "3", "--num", "2", "--out", str(tmp_path / "g")]) == 0
    stats = json.loads((tmp_path / "g" / "stats.json").read_text())
    assert stats["config"]["ratio"] == "coupled" and stats["config"]["align"] is False and stats["lossless"]
    assert (tmp_path / "g" / "grid.png").exists()
    assert cli(["bench", "--model", "random-tiny-continuous", "--methods", "ar,cspd:gamma=3,cspd:gamma=3:ratio=trajectory",
                "--num", "4", "--batch-size", "2", "--json", str(tmp_path / "b.json"), "--md", str(tmp_path / "b.md")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert [r["method"] for r in report["runs"]] == ["ar", "cspd", "cspd"]
    assert "acceptance_rate" in report["runs"][1] and "acceptance_rate" not in report["runs"][0]
    assert "| acceptance rate |" in (tmp_path / "b.md").read_text()
    capsys.readouterr()
    assert cli(["bench", "--model", "random-tiny", "--methods", "ar,cspd"]) == 2
    assert "continuous-token models" in capsys.readouterr().err
    assert cli(["bench", "--model", "random-tiny-continuous", "--methods", "ar,sjd"]) == 2
    err = capsys.readouterr().err
    assert "continuous tokens" in err and "sjd" in err and len(err.strip().splitlines()) == 1
    assert cli(["generate", "--model", "random-tiny-continuous", "--method", "cspd", "--ratio", "exact",
                "--out", str(tmp_path / "x")]) == 2
    assert "method option --ratio must be one of paper, coupled, trajectory, got 'exact'" in capsys.readouterr().err


def test_energy_test_calibration_and_power():
    """Same law (three classes with means 10 sigma apart): the p-value is not small. A 0.3-sigma mean
    shift in 4-D with 300 samples each is detected (p < 0.01) only because permutations stay within a
    class: pooled permutations mix the class spread into the null and lose it (p > 0.1)."""
    g = torch.Generator().manual_seed(0)
    strata = torch.arange(600) % 3
    means = torch.tensor([[0.0] * 4, [5.0] * 4, [-5.0] * 4])
    x = torch.randn(300, 4, generator=g) + means[strata[:300]]
    y = torch.randn(300, 4, generator=g) + means[strata[300:]]
    p_same, _ = energy_test(x, y, perms=300, strata=strata)
    p_shift, e = energy_test(x + 0.3, y, perms=300, strata=strata)
    p_pooled, e_pooled = energy_test(x + 0.3, y, perms=300)
    assert p_same > 0.01 and p_shift < 0.01 and e > 0 and e_pooled == pytest.approx(e)
    assert p_pooled > 0.1


def test_bundle_add_parts_and_zoo_loading(tmp_path):
    """``bundle --add`` puts fp16 continuous models into an existing bundle; the zoo's loader reads them
    back as a continuous-token pipeline whose target equals the trained one up to fp16 rounding."""
    from specvis.train.bundle import add_parts
    from specvis.zoo import _emoji_continuous, _random_tiny_continuous

    tiny = _random_tiny_continuous()
    runs, out = tmp_path / "runs", tmp_path / "bundle"
    tiny.target.save_pretrained(runs / "continuous_target" / "final")
    tiny.draft.save_pretrained(runs / "continuous_draft" / "final")
    out.mkdir()
    (out / "bundle.json").write_text(json.dumps({"components": ["vq"], "bytes": {}, "training": {},
                                                 "class_names": tiny.class_names}))
    with pytest.raises(ValueError, match="bundle parts"):
        add_parts(runs, out, ["bogus"])
    with pytest.raises(ValueError, match="is missing"):
        add_parts(runs, out, ["target"])
    (runs / "continuous_target" / "report.json").write_text('{"steps": 3}')
    meta = add_parts(runs, out, ["continuous_target", "continuous_draft"], {"cfg_scale": 2.0})
    assert meta["components"] == ["continuous_draft", "continuous_target", "vq"]
    tiny.target.save_pretrained(tmp_path / "distilled" / "final")  # replacing a part keeps its first record
    (tmp_path / "distilled" / "report.json").write_text('{"steps": 9}')
    meta = add_parts(runs, out, ["continuous_target"], {"cfg_scale": 2.0}, {"continuous_target": tmp_path / "distilled"})
    assert meta["training"]["continuous_target"] == {"steps": 9, "replaced": {"steps": 3}}
    pipe = _emoji_continuous(out, meta, tiny.tokenizer)
    assert pipe.default_sampling.cfg_scale == 2.0 and pipe.draft is not None
    for a, b in zip(pipe.target.parameters(), tiny.target.parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)
    assert _emoji_continuous(tmp_path, meta, tiny.tokenizer) is None  # no continuous parts: None


def test_sampler_clips_x0_and_extrapolates_the_variance_as_the_official_code():
    """At the noisiest step x0_hat = sqrt(1/abar) x_t - ... amplifies an epsilon error by ~1e4: with
    clip_x0 the posterior mean stays within the clip's scale; v outside [-1, 1] is not clamped (the
    official LEARNED_RANGE formula): v = 5 puts the log variance at 3 log beta_t - 2 log beta_tilde_t."""
    from specvis.diffusion import GaussianDiffusion, make_betas, respace

    betas, kept = respace(make_betas("cosine", 1000), 25)
    free, clipped = GaussianDiffusion(betas, kept), GaussianDiffusion(betas, kept, clip_x0=3.0)
    x_t = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    i = torch.full((64,), 24)
    out = torch.cat([x_t + 0.1, torch.full_like(x_t, 5.0)], -1)  # eps off by 0.1, v = 5
    m_free, lv_free = free.p_mean_logvar(out, x_t, i)
    m_clip, lv_clip = clipped.p_mean_logvar(out, x_t, i)
    assert m_free.abs().max() > 100 and m_clip.abs().max() < 3.0 + x_t.abs().max()
    want = 3 * free.log_betas[24] - 2 * free.posterior_log_variance[24]  # f = (5 + 1) / 2 = 3
    assert torch.allclose(lv_clip, want.expand_as(lv_clip)) and not torch.allclose(want, free.log_betas[24])
    assert torch.equal(lv_free, lv_clip)


def test_cspd_probe_reports_each_ratio(tmp_path, capsys):
    """The probe on the tiny pair (draft = target perturbed by 1e-4): the trajectory ratio accepts
    nearly every token, while the paper/coupled ratios, which compare the last step at two aligned runs
    that drifted apart, accept less; a copy of the target as its own draft accepts everything."""
    from specvis.bench.cspd_probe import main as probe_main, probe

    rng = np.random.default_rng(0)
    path = tmp_path / "lat.npz"
    np.savez(path, eval_latents=rng.standard_normal((16, 16, 3)).astype(np.float16),
             eval_labels=rng.integers(0, 4, 16))
    assert probe_main(["--model", "random-tiny-continuous", "--latents", str(path), "--positions", "1,8",
                       "--rows", "16", "--out", str(tmp_path / "p.json")]) == 0
    rep = json.loads((tmp_path / "p.json").read_text())["positions"]
    for pos in ("1", "8"):
        r = rep[pos]
        assert len(r["trajectory_step_log_ratio_mean"]) == 8  # one entry per sampling step
        assert r["trajectory_acceptance"] > 0.8 and r["trajectory_acceptance"] >= r["coupled_acceptance"]
    pipe = load("random-tiny-continuous")
    with np.load(path) as z:
        x, y = torch.from_numpy(z["eval_latents"].astype(np.float32)), torch.from_numpy(z["eval_labels"])
    same = probe(pipe.target, pipe.target, x, y, [5], 1.0, 1.0)["5"]
    assert same["trajectory_acceptance"] == 1.0 and same["paper_acceptance"] == 1.0 and same["aligned_gap_x0"] == 0.0
    assert probe_main(["--model", "random-tiny-continuous", "--latents", str(path), "--positions", "16"]) == 2
    assert "--positions" in capsys.readouterr().err


def test_two_sample_report_on_the_tiny_pair(tmp_path):
    """The command end to end on random-tiny-continuous: every set is reported against the first AR
    set, with the AR control, the draft-only control and one row per ratio."""
    from specvis.bench.two_sample import main as two_sample

    out = tmp_path / "t.json"
    assert two_sample(["--model", "random-tiny-continuous", "--num", "24", "--batch-size", "12", "--gamma", "2",
                       "--perms", "50", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert [r["set"] for r in rep["sets"]] == ["ar", "ar (control)", "draft only (control)", "cspd paper",
                                              "cspd coupled", "cspd trajectory"]
    for row in rep["sets"][1:]:
        assert 0 < row["image"]["p"] <= 1 and 0 < row["first_drafted_token"]["p"] <= 1
    assert "acceptance_rate" in rep["sets"][-1] and rep["first_drafted_position"] == 1


@pytest.mark.skipif(not __import__("specvis.zoo", fromlist=["installed"]).installed("emoji-continuous"),
                    reason="emoji bundle without continuous models")
def test_emoji_bundle_exposes_its_continuous_models():
    """The shipped continuous target/draft load with the bundle, match the latent format of the VQ
    (8 channels on its 16x16 grid, clipped at sqrt(8)) and render 64x64 images."""
    pipe = load("emoji")
    cont = pipe.continuous
    assert cont is not None and cont.name == "emoji-continuous" and cont.draft is not None
    cfg = cont.target.config
    assert (cfg.token_dim, cfg.height, cfg.width) == (pipe.tokenizer.config.codebook_embed_dim, 16, 16)
    assert cfg.clip_denoised == pytest.approx(8 ** 0.5) and cont.draft.config.token_dim == cfg.token_dim
    assert cont.num_classes == pipe.num_classes and cont.default_sampling.cfg_scale == 3.0
    out = cont([4], AR(), seed=0)
    assert out.latents.shape == (1, 256, 8) and out.images[0].size == (64, 64)
    assert out.latents.abs().max() <= 8 ** 0.5 + 0.1  # x0 clip plus the last step's small noise


def test_one_pipeline_class_whose_family_differs():
    """Discrete- and continuous-token bundles are the one ``sv.Pipeline``; their families say what
    differs (tokens, codebook, how images come out).
    Catches a family that hands the continuous model a codebook or decodes its latents as codes,
    and a sampler option of an ordered model (MAR's ``num_iter``) silently ignored by another."""
    from specvis import Pipeline
    from specvis.families.embedded import CODES, LATENTS
    codes, latents = load("random-tiny"), load("random-tiny-continuous")
    assert type(codes) is type(latents) is Pipeline and (codes.family, latents.family) == (CODES, LATENTS)
    assert (codes.tokens, latents.tokens, codes.conditioning, latents.conditioning) == ("discrete", "continuous", "class", "class")
    assert codes.codebook.shape == (64, 3) and latents.codebook is None and codes.kv_cache and latents.decodes
    out = latents(classes=[1], method=AR(), seed=0)
    assert out.tokens is None and out.latents.shape == (1, 16, 3) and out.images[0].size == (32, 32)
    with pytest.raises(ValueError, match=r"^num_iter= applies to MAR models only; model random-tiny decodes one token per step$"):
        codes(classes=[0], num_iter=4)
    with pytest.raises(ValueError, match=r"^model random-tiny is class-conditional: give classes=, not prompts=$"):
        codes(prompts=["a cat"])
