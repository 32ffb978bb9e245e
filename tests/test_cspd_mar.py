"""CSpD on MAR (specvis.methods.cspd_mar, as MarkXCloud/CSpD runs it, through specvis.generate with MAR's
ordered sampler declared by its family): the authors' step split, the law it samples (two-sample tests
against MAR's own sampler on the CSpD schedule, with null and positive controls, every ratio),
acceptance 1 for a draft equal to the target at gamma 1, temperature 0, stats, MAR's own sampler
through generate (draw for draw), the MAR pipeline / CLI wiring and one-line errors. Tiny random MARs on a
2x2 grid, seconds on CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_cspd import MixtureHead, perturbed  # the exact-epsilon mixture head, a close draft (tests/test_cspd.py)

import specvis as sv
from specvis.bench.two_sample import energy_test
from specvis.cli import main as cli
from specvis.families import mar as mar_family
from specvis.pipeline import Pipeline
from specvis.methods import cspd_mar as cm
from specvis.methods import laws
from specvis.methods.cspd import CSpD
from specvis.models.kl_vae import KLVAE, KLVAEConfig
from specvis.models.mar import MAR, MARConfig, mask_schedule

TINY = dict(img_size=8, vae_stride=4, patch_size=1, encoder_embed_dim=16, encoder_depth=1, encoder_num_heads=2,
            decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2, vae_embed_dim=2, class_num=3, buffer_size=2,
            diffloss_d=1, diffloss_w=16, num_sampling_steps=4, num_train_steps=16, diffusion_batch_mul=1)


def mar_pipeline(*args, **kwargs) -> Pipeline:
    """The ``Pipeline`` of a MAR directory, as ``sv.load`` builds it from the family's fields."""
    return Pipeline(**mar_family.pipeline_fields(*args, **kwargs))


def random_mar(seed: int, mixture: bool = True, **overrides) -> MAR:
    """A tiny MAR (2x2 grid of 2-dim tokens) with random weights; ``mixture``: its DiffLoss replaced by
    the exact epsilon predictor of a z-dependent Gaussian mixture (a random MLP head predicts epsilons
    that blow x_0 up to ~1e3 at the noisiest step; the mixture keeps tokens O(1))."""
    torch.manual_seed(seed)
    model = MAR(MARConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    if mixture:
        cfg = model.config
        model.diffloss = MixtureHead(cfg.token_embed_dim, cfg.decoder_embed_dim, cfg.num_train_steps,
                                     cfg.num_sampling_steps, seed)
    return model


@pytest.fixture(scope="module")
def models():
    t = random_mar(0)
    return t, perturbed(t, 0.3, 1, head="diffloss"), random_mar(1)  # target, close draft, a different model


N, NUM_ITER, SAMPLING = 2000, 4, sv.Sampling(cfg_scale=2.0, temperature=0.9)
LABELS = torch.arange(N) % 3


def run(method, target, draft, labels=LABELS, sampling=SAMPLING, seed=3, num_iter=NUM_ITER):
    """CSpD on MAR through generate: the tokens, stats and the schedule it ran."""
    out = sv.generate(target, labels, method, sampling, seed, draft=draft, ordered=mar_family.MARReveal(num_iter))
    sched = cm.cspd_schedule(target.seq_len, num_iter, method.gamma, method.prefill, sampling.cfg_scale, "linear")
    assert out.tokens is None
    return SimpleNamespace(tokens=out.latents, stats=out.stats, schedule=sched)


def law(model: MAR, sched: cm.CSpDSchedule, seed: int, labels=LABELS, sampling=SAMPLING) -> torch.Tensor:
    """MAR's own sampler on the schedule CSpD samples (one step per pre-fill step and per verified block)."""
    return model.sample(labels, cfg=sampling.cfg_scale, temperature=sampling.temperature, seed=seed,
                        reveals=sched.target_reveals, scales=sched.target_scales, last_step_noise=True).tokens


def pvalue(x: torch.Tensor, y: torch.Tensor) -> float:
    return energy_test(x, y, perms=200)[0]


# ---------------------------------------------------------------- the authors' schedule

def test_schedule_follows_the_authors_split():
    """runner lines 113-155: steps <= prefill * num_iter by the target, then draft steps verified after
    every step s with s % gamma == 0 and at the last step; empty steps drop out."""
    s = cm.cspd_schedule(16, 8, gamma=3, prefill=0.15, cfg=3.0, cfg_schedule="linear")
    assert s.rounds == [("prefill", [0]), ("prefill", [1]), ("verify", [2, 3]), ("verify", [4, 5, 6]), ("verify", [7])]
    _, reveals = mask_schedule(16, 8)
    assert s.reveals == reveals and s.target_reveals == [reveals[0], reveals[1], sum(reveals[2:4]), sum(reveals[4:7]),
                                                         reveals[7]]
    assert s.target_scales == [s.scales[0], s.scales[1], s.scales[3], s.scales[6], s.scales[7]]
    one = cm.cspd_schedule(16, 8, gamma=1, prefill=0.0, cfg=3.0, cfg_schedule="linear")
    assert one.target_reveals == reveals and one.target_scales == one.scales  # gamma 1: MAR's own schedule
    assert all(kind == "prefill" for kind, _ in cm.cspd_schedule(16, 8, 4, 1.0, 1.0, "linear").rounds)
    many = cm.cspd_schedule(4, 10, gamma=2, prefill=0.0, cfg=1.0, cfg_schedule="linear")
    assert sum(many.target_reveals) == 4 and all(many.target_reveals) and many.mar_steps == 4


# ---------------------------------------------------------------- the law

def test_every_ratio_against_mars_own_sampler_on_the_cspd_schedule(models, monkeypatch):
    """Energy two-sample tests (2,000 samples of 2x2x2 tokens, 200 permutations), gamma 2 (a block of
    two draft steps: the draft's second token sees its first, the target's does not), CFG 2, T 0.9.
    Null control: two target runs of MAR's sampler (other seeds) are indistinguishable; positive
    control: a different model is distinguishable. trajectory and coupled must match the target; the
    paper ratio (not exact) is measured and printed. Power: the negated trajectory ratio must fail."""
    t, d, other = models
    results = {}
    for ratio in ("trajectory", "coupled", "paper"):
        r = run(CSpD(gamma=2, prefill=0.0, ratio=ratio, max_resample_tries=1000), t, d)
        ref = law(t, r.schedule, seed=10_000)
        results[ratio] = {"p": round(pvalue(r.tokens, ref), 3), "acceptance": round(r.stats.extra["acceptance_rate"], 3),
                          "fallbacks": r.stats.extra["resample_fallbacks"]}
    print("\nCSpD on tiny MAR:", results)
    for ratio in ("trajectory", "coupled"):
        assert results[ratio]["p"] > 0.01 and results[ratio]["fallbacks"] == 0
        assert 0.02 < results[ratio]["acceptance"] < 0.98  # both branches (accept, residual) are exercised
    sched = r.schedule
    ref = law(t, sched, seed=10_000)
    assert pvalue(law(t, sched, seed=20_000), ref) > 0.01  # null control
    assert pvalue(law(other, sched, seed=20_000), ref) < 0.01  # positive control
    exact = laws.trajectory_log_ratio
    monkeypatch.setattr(cm, "trajectory_log_ratio", lambda *a: -exact(*a))
    wrong = run(CSpD(gamma=2, prefill=0.0, ratio="trajectory", max_resample_tries=1000), t, d)
    assert pvalue(wrong.tokens, ref) < 0.01


def test_each_forward_uses_its_steps_cfg_scale(models, monkeypatch):
    """Draft step s runs at MAR's scale[s]; the target's pre-fill steps at theirs and each verification
    at the scale of its block's last draft step (runner: ``draft_aux['mask_len']``). A wrong scale is
    below the law test's power on this model (1.5 vs 1.75), so it is checked here directly."""
    t, d, _ = models
    seen = {"target": [], "draft": []}
    init = laws.GuidedHead.__init__

    def record(self, head, scale, temperature, *a, **k):
        if not torch.is_tensor(scale):  # the trajectory residual's per-row draft view aside
            seen["target" if head is t.diffloss else "draft"].append(float(scale))
        init(self, head, scale, temperature, *a, **k)

    monkeypatch.setattr(laws.GuidedHead, "__init__", record)
    r = run(CSpD(gamma=2, prefill=0.0, ratio="coupled"), t, d, labels=torch.arange(3), num_iter=6)
    sched = r.schedule
    assert seen["target"] == pytest.approx(sched.target_scales)
    assert seen["draft"] == pytest.approx([sched.scales[s] for kind, steps in sched.rounds if kind == "verify"
                                           for s in steps])
    assert any(sched.scales[st[0]] != sched.scales[st[-1]] for kind, st in sched.rounds if kind == "verify")


def test_draft_equal_to_target_accepts_everything_at_gamma_one(models):
    """gamma 1 verifies one MAR step at a time: the draft's proposal and the target's law condition on
    the same tokens, so an identical draft gives ratio 1 for every ratio. (At gamma > 1 it does not:
    the target verifies a block given the committed tokens only, the draft drew its later steps given
    its earlier drafts; measured, not asserted.)"""
    t, _, _ = models
    labels = torch.arange(60) % 3
    for ratio in ("trajectory", "coupled", "paper"):
        r = run(CSpD(gamma=1, prefill=0.0, ratio=ratio), t, t, labels=labels)
        assert r.stats.extra["acceptance_rate"] == 1.0 and r.stats.extra["resamples"] == 0
    r2 = run(CSpD(gamma=2, prefill=0.0, ratio="trajectory"), t, t, labels=labels)
    print("\nidentical draft, gamma 2, acceptance:", r2.stats.extra["acceptance_rate"])


def test_gamma_one_is_mars_schedule_and_stats(models):
    """gamma 1: one target forward per MAR step (no saving, the stated behaviour), a draft forward per
    non-pre-filled step; gamma 2: fewer target forwards than MAR's steps; accept_map and counts add up."""
    t, d, _ = models
    labels = torch.arange(4) % 3
    r = run(CSpD(gamma=1, prefill=0.0), t, d, labels=labels)
    st = r.stats
    assert st.target_forwards == st.extra["mar_steps"] == NUM_ITER and st.draft_forwards == NUM_ITER - 1
    assert r.schedule.target_reveals == mask_schedule(t.seq_len, NUM_ITER)[1]
    r = run(CSpD(gamma=2, prefill=0.0), t, d, labels=labels)
    st = r.stats
    assert st.target_forwards == st.extra["prefill_steps"] + st.extra["verify_rounds"] == 3 < st.extra["mar_steps"]
    assert st.mean_accepted_length == pytest.approx(t.seq_len / 3) and st.draft_forwards == 3
    assert st.accept_map.shape == (4, 2, 2)
    assert st.accept_map.flatten(1).sum(1).tolist() == [sum(n * n for n in r.schedule.target_reveals)] * 4
    assert run(CSpD(gamma=2, prefill=1.0), t, None, labels=labels).stats.draft_forwards == 0  # target only


@pytest.mark.parametrize("num_iter, sampling, schedule", [(4, SAMPLING, "linear"), (3, sv.Sampling(cfg_scale=3.0), "constant"),
                                                          (6, sv.Sampling(temperature=0.0), "linear")])
def test_ar_through_generate_is_mars_own_sampler_draw_for_draw(models, num_iter, sampling, schedule):
    """AR on MAR through generate (the family's MARReveal in the ordinary decode context: continuous
    tokens committed at the positions each step reveals, not a stream prefix) is MAR.sample with the
    same one generator, draw for draw: the order, each step's positions, x_K and step noises (sample
    after sample, none on the last denoising step), each step's CFG scale; one target forward per
    non-empty step, and each token's accept_map entry the size of its step. Catches a draw order, a
    step's positions or scale that differ from MAR's own sampler, or a commit at the wrong positions."""
    t, _, _ = models
    labels = torch.tensor([0, 2, 1])
    out = sv.generate(t, labels, sv.AR(), sampling, seed=7, ordered=mar_family.MARReveal(num_iter, schedule))
    ref = t.sample(labels, num_iter=num_iter, cfg=sampling.cfg_scale, cfg_schedule=schedule,
                   temperature=sampling.temperature, generator=torch.Generator().manual_seed(7))
    assert out.tokens is None and torch.equal(out.latents, ref.tokens)
    assert out.stats.target_forwards == sum(1 for n in ref.reveals if n) and out.stats.draft_forwards == 0
    counts = torch.tensor(ref.reveals)[ref.step_of]
    assert torch.equal(out.stats.accept_map.flatten(1), counts)
    with pytest.raises(ValueError, match="AR or CSpD"):
        sv.generate(t, labels, sv.SJD(), sampling, ordered=mar_family.MARReveal(num_iter))


def test_temperature_zero_commits_the_targets_outputs(models):
    """MAR's temperature 0 keeps x_K random and drops the step noise; CSpD denoises the draft's x_K
    with the target: the result does not depend on the draft (same seed, same order and x_K)."""
    t, d, other = models
    labels = torch.arange(12) % 3
    s = sv.Sampling(cfg_scale=2.0, temperature=0.0)
    a = run(CSpD(gamma=2, prefill=0.0), t, d, labels=labels, sampling=s)
    b = run(CSpD(gamma=2, prefill=0.0), t, other, labels=labels, sampling=s)
    c = run(CSpD(gamma=2, prefill=0.0), t, t, labels=labels, sampling=s)
    assert torch.allclose(a.tokens, b.tokens, atol=1e-5) and torch.allclose(a.tokens, c.tokens, atol=1e-5)
    assert c.stats.extra["acceptance_rate"] > a.stats.extra["acceptance_rate"]


def test_real_diffloss_head_runs_every_ratio():
    """The real DiffLoss MLP (not the mixture double), batch 3, CFG: shapes, finite tokens."""
    t, d = random_mar(0, mixture=False), random_mar(1, mixture=False)
    for ratio in ("paper", "coupled", "trajectory"):
        r = run(CSpD(gamma=2, prefill=0.0, ratio=ratio), t, d, labels=torch.tensor([0, 1, 2]))
        assert r.tokens.shape == (3, 4, 2) and torch.isfinite(r.tokens).all()


# ---------------------------------------------------------------- pipeline, CLI, errors

def tiny_vae() -> KLVAE:
    torch.manual_seed(0)
    cfg = KLVAEConfig(embed_dim=2, ch=32, ch_mult=[1, 1, 2], num_res_blocks=1, resolution=8,
                      encoder_attn_resolutions=[], decoder_attn_resolutions=[])
    return KLVAE(cfg).eval()


@pytest.fixture(scope="module")
def mar_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mar")
    target, draft = root / "mar_tiny", root / "mar_draft"
    for d, seed in ((target, 0), (draft, 1)):
        d.mkdir()
        random_mar(seed, mixture=False).save_checkpoint(d / "checkpoint-last.pth")
        tiny_vae().save_checkpoint(d / "kl16.ckpt")
    return target, draft


def test_pipeline_takes_a_draft_and_cspd(mar_dirs):
    target, draft = mar_dirs
    pipe = mar_pipeline("mar_tiny", target, draft=draft)
    out = pipe(classes=[0, 2], method=CSpD(gamma=2, prefill=0.0, ratio="coupled"), sampling=sv.Sampling(cfg_scale=2.0),
               seed=1, num_iter=4)
    assert out.latents.shape == (2, 4, 2) and len(out.images) == 2 and out.images[0].size == (8, 8)
    assert out.stats.target_forwards == 3 and 0 <= out.stats.extra["acceptance_rate"] <= 1
    assert pipe(classes=[1], method=sv.AR(), seed=0, num_iter=4).stats.target_forwards == 4
    mar_pipe = mar_pipeline("mar_tiny", target, draft=draft)
    mar_pipe.draft = random_mar(2, mixture=False)  # a MAR object works as draft too
    assert mar_pipe(classes=[0], method=CSpD(gamma=2), seed=0, num_iter=4).latents.shape == (1, 4, 2)


def one_line_error(fn, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_bad_input_gives_one_line_errors(mar_dirs, tmp_path):
    target, draft = mar_dirs
    pipe = mar_pipeline("mar_tiny", target, draft=draft)
    one_line_error(lambda: pipe(classes=[0], method=sv.SJD()), "discrete-token method")
    one_line_error(lambda: CSpD(gamma=0), "gamma")
    one_line_error(lambda: mar_pipeline("mar_tiny", target)(classes=[0], method=CSpD(gamma=2), num_iter=4),
                   "needs a draft")
    one_line_error(lambda: pipe(classes=[0], method=CSpD(), sampling=sv.Sampling(top_k=3)), "top_k")
    wide = tmp_path / "wide"
    wide.mkdir()
    random_mar(0, mixture=False, vae_embed_dim=3).save_checkpoint(wide / "checkpoint-last.pth")
    one_line_error(lambda: mar_pipeline("mar_tiny", target, draft=wide), "token_embed_dim")
    one_line_error(lambda: mar_pipeline("mar_tiny", target, draft=tmp_path), "not a MAR directory")
    bad = tmp_path / "badvae"
    bad.mkdir()
    (bad / "checkpoint-last.pth").write_bytes((target / "checkpoint-last.pth").read_bytes())
    (bad / "kl16.ckpt").write_bytes(b"not a checkpoint")
    one_line_error(lambda: mar_pipeline("bad", bad), "kl16.ckpt")


def test_cli_generate_on_a_mar_directory(mar_dirs, tmp_path, capsys):
    target, draft = mar_dirs
    assert cli(["generate", "--model", str(target), "--class", "1", "--num", "2", "--out", str(tmp_path / "ar")]) == 0
    assert cli(["generate", "--model", str(target), "--draft", str(draft), "--method", "cspd", "--gamma", "2",
                "--ratio", "trajectory", "--class", "0", "--num", "2", "--out", str(tmp_path / "cspd")]) == 0
    assert (tmp_path / "cspd" / "stats.json").is_file() and (tmp_path / "cspd" / "001.png").is_file()
    capsys.readouterr()
    for argv in (["--method", "sjd"], ["--method", "cspd", "--gamma", "0", "--draft", str(draft)],
                 ["--method", "cspd"], ["--class", "7"], ["--draft", str(tmp_path), "--method", "cspd"]):
        assert cli(["generate", "--model", str(target), "--out", str(tmp_path / "x"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specvis: error:") and "\n" not in err, err


def test_a_mar_model_runs_only_the_methods_that_declare_its_order():
    """``generate`` asks the method (``model_order``: AR and CSpD) and refuses any other on a model that
    reveals its tokens in its own order, naming it, before a view is built."""
    model = random_mar(0, mixture=False)
    for method in (sv.SJD(), sv.Speculative(2), sv.PJD(), sv.Jacobi()):
        with pytest.raises(ValueError, match=f"method must be AR or CSpD, got {type(method).__name__}$"):
            sv.generate(model, torch.tensor([0, 1]), method, sv.Sampling(temperature=1.0), ordered=mar_family.MARReveal(2))
