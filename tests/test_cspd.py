"""CSpD (specvis.methods.cspd), the continuous-token models (specvis.models.continuous) and the DDPM
math (specvis.diffusion).

Closed forms: Gaussian transition log-densities against torch.distributions; the cosine schedule,
respacing, learned-variance interpolation and posterior mean against their formulas; the residual
sampler against normalise(max(0, p - q)) computed by quadrature (1-D: KS test, 2-D: binned
chi-square; plain draws from p must fail both, so a wrong alpha_s is caught).

Exactness: the exact variants (ratio="trajectory", and ratio="coupled" = Eq. 5 without Sigma, exact
conditionally on the shared noise) must match target-only sampling on a 2x2 grid, C=1, T=16 -> K=8,
CFG 2, temperature 0.9, in a two-sample energy-distance test with a permutation p-value (2,000
samples each, 200 permutations, fixed seeds); the same test must reject two deliberately wrong
ratios (q/p for p/q; the last step's ratio alone) and the draft's own law (its power is stated there). The heads there are a test double: the exact epsilon
predictor of a Gaussian mixture whose means are linear in z (``MixtureHead``), because random MLP
heads are not denoisers (their runs blow up to |x| ~ 1e4 through the 1/sqrt(abar_T) step of the
cosine schedule) and an untrained-but-realistic head is what the statistics need; the MLP head runs
everywhere else.

Recorded acceptance (alpha = accepted / (accepted + rejected) draft tokens, printed by the tests):
- test_exact_variants_reproduce_target_law (2x2, C=1, T=16 -> K=8, CFG 2, tau 0.9, gamma 3, draft =
  an independent random model, 2,000 rows): trajectory 0.32, coupled 0.13, paper 0.10; energy p-values
  0.28 / 0.23 / 0.31; the paper ratio's residual sampler hit its 1,000-try fallback 59 times in 5,387
  resamples (Sigma << 1 starves it), the exact ones never.
- test_acceptance_paper_vs_trajectory_close_draft (2x2, C=2, perturbed-copy draft, no CFG, 300 rows):
  T=16 -> K=8: paper 0.19, coupled 0.20, trajectory 0.59; T=100 -> K=8 (last-step std 0.025): paper
  0.009, coupled 0.009, trajectory 0.41. The paper and coupled ratios compare the last step at two
  diverged points x_1^p != x_1^q, so a sharp last step kills them; the trajectory ratio compares the
  two models at the same points. The paper ratio was not detectably biased at 2,000 samples here, but
  it is not exact (Sigma != 1 tilts acceptance: Sigma -> infinity accepts every draft token).
"""

from __future__ import annotations

import importlib

import copy
import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

import specvis as sv
from specvis.diffusion import (
    GaussianDiffusion,
    cosine_betas,
    gaussian_log_density,
    make_betas,
    residual_sample,
    respace,
    transition_log_density,
)
from specvis.methods import cspd as cspd_mod
from specvis.methods import laws
from specvis.methods.cspd import CSpD
from specvis.methods.views import GuidedContinuous

from specvis.bench.two_sample import energy_test
from specvis.models.continuous import ContinuousAR, ContinuousARConfig, DiffusionHead
from specvis.models.llamagen import rope_2d_table
from specvis.registry import build_method

generate_latents = importlib.import_module("specvis.generate").generate_latents  # the module, not sv.generate

# ---------------------------------------------------------------- tiny models


def tiny_config(grid=(2, 2), C=1, T=16, K=8, dim=32, **kw) -> ContinuousARConfig:
    return ContinuousARConfig(token_dim=C, height=grid[0], width=grid[1], dim=dim, n_layer=2, n_head=2,
                              multiple_of=16, num_classes=3, head_width=32, head_depth=2, num_train_steps=T,
                              num_sampling_steps=K, **kw)


def sharpen(model: ContinuousAR) -> ContinuousAR:
    """Random transformers barely depend on their inputs at init scale; scale the inputs up."""
    with torch.no_grad():
        model.cls_embedding.embedding_table.weight.mul_(20)
        model.tok_proj.weight.mul_(20)
    return model


def mlp_model(seed: int, **kw) -> ContinuousAR:
    """A random model with its real MLP head (MAR's zero init replaced by a random one)."""
    torch.manual_seed(seed)
    model = ContinuousAR(tiny_config(**kw)).eval()
    model.head.net.init_weights(zero_init=False)
    return sharpen(model)


class MixtureHead(DiffusionHead):
    """Test double: the exact epsilon predictor for data ~ 1/2 N(A_0 z, s^2) + 1/2 N(A_1 z, s^2), and a
    learned-variance output v = tanh(z w); everything else (schedule, CFG on eps, runs) is DiffusionHead's."""

    def __init__(self, token_dim: int, cond_dim: int, T: int, K: int, seed: int, s: float = 0.3) -> None:
        super().__init__(token_dim, cond_dim, 8, 1, T, K)
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("A", torch.randn(2, token_dim, cond_dim, generator=g) / cond_dim ** 0.5)
        self.register_buffer("w", torch.randn(cond_dim, token_dim, generator=g) / cond_dim ** 0.5)
        self.s = s

    def _eps(self, x: torch.Tensor, abar: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        m = torch.einsum("kcd,nd->nkc", self.A, z)
        ra, var = abar.sqrt(), abar * self.s ** 2 + 1 - abar
        w = torch.softmax(-0.5 * ((x[:, None] - ra[:, None] * m) ** 2).sum(-1) / var, dim=1)
        post = m + (ra * self.s ** 2 / var)[:, None] * (x[:, None] - ra[:, None] * m)
        return (x - ra * (w[..., None] * post).sum(1)) / (1 - abar).sqrt()

    def predict(self, x, step, z, z_uncond=None, cfg_scale=1.0):
        abar = self.sampler.alphas_cumprod[step][:, None]
        eps = self._eps(x, abar, z)
        if z_uncond is not None:
            eps_u = self._eps(x, abar, z_uncond)
            eps = eps_u + cfg_scale * (eps - eps_u)
        out = torch.cat([eps, torch.tanh(z @ self.w)], dim=-1)
        return self.sampler.p_mean_logvar(out, x, step)


def mixture_model(seed: int, grid=(2, 2), C=1, T=16, K=8) -> ContinuousAR:
    torch.manual_seed(seed)
    model = sharpen(ContinuousAR(tiny_config(grid, C, T, K)).eval())
    model.head = MixtureHead(C, model.config.dim, T, K, seed)
    return model


def perturbed(model, eps: float, seed: int, head: str = "head"):
    """A close draft: a copy with every weight (and the mixture head's A, w: attribute ``head``) moved by
    eps times its spread."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        mixture = getattr(draft, head)
        for t in list(draft.parameters()) + [mixture.A, mixture.w]:
            t.add_(eps * t.std().clamp_min(1e-3) * torch.randn(t.shape, generator=g))
    return draft


@torch.no_grad()
def reference(model: ContinuousAR, conditions: torch.Tensor, sampling: sv.Sampling, seed: int) -> torch.Tensor:
    """Target-only sampling without the cache: teacher-forced z, then the head, token by token."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(conditions.shape[0], 0, model.token_dim)
    null = torch.full_like(conditions, model.null_condition)
    for _ in range(model.layout.num_tokens):
        zc = model.features(conditions, tokens)[:, -1]
        zu = model.features(null, tokens)[:, -1] if sampling.uses_cfg else None
        x = model.head.sample(zc, zu, sampling.cfg_scale, sampling.temperature, g)
        tokens = torch.cat([tokens, x[:, None]], 1)
    return tokens


def energy_pvalue(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(p-value, energy distance) with 200 permutations (``specvis.bench.two_sample.energy_test``)."""
    return energy_test(x, y, perms=200)


# ---------------------------------------------------------------- config and DDPM closed forms


@pytest.mark.parametrize("field,value", [("token_dim", 0), ("height", 0), ("num_sampling_steps", 0),
                                         ("head_depth", 0), ("noise_schedule", "sqrt"), ("class_dropout_prob", 1.0)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ContinuousARConfig(**{field: value})
    with pytest.raises(ValueError, match="num_sampling_steps"):
        tiny_config(T=8, K=9)


def test_schedule_respacing_and_posterior():
    T = 50
    betas = cosine_betas(T)
    f = lambda t: math.cos((t / T + 0.008) / 1.008 * math.pi / 2) ** 2
    assert torch.allclose(betas[:-1], torch.tensor([1 - f(i + 1) / f(i) for i in range(T - 1)], dtype=torch.float64))
    new, kept = respace(betas, 7)
    assert kept[0] == 0 and kept[-1] == T - 1 and len(kept) == 7
    assert torch.allclose(torch.cumprod(1 - new, 0), torch.cumprod(1 - betas, 0)[kept])
    same, all_kept = respace(betas, T)
    assert torch.allclose(same, betas) and torch.equal(all_kept, torch.arange(T))
    assert make_betas("linear", 1000)[-1].item() == pytest.approx(0.02)

    d = GaussianDiffusion(new, kept, learn_sigma=True)
    gen = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(6, 3, generator=gen), torch.randn(6, 3, generator=gen)
    i = torch.tensor([0, 1, 2, 3, 5, 6])
    x_t = d.q_sample(x0, i, eps)
    for v, table in ((1.0, d.log_betas), (-1.0, d.posterior_log_variance)):
        mean, logvar = d.p_mean_logvar(torch.cat([eps, torch.full_like(eps, v)], -1), x_t, i)
        assert torch.allclose(logvar, table[i][:, None].expand(-1, 3))
        # with the true noise, x0_hat = x0 and the mean is the true posterior mean (DDPM Eq. 7)
        assert torch.allclose(mean, d.q_posterior(x0, x_t, i)[0], atol=1e-4)
    ab = torch.cumprod(1 - new, 0)
    beta_tilde = new[1:] * (1 - ab[:-1]) / (1 - ab[1:])
    assert torch.allclose(d.posterior_log_variance[1:].double(), beta_tilde.log(), atol=1e-5)


def test_gaussian_log_densities_match_torch_distributions():
    g = torch.Generator().manual_seed(0)
    x, mean, logvar = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    want = torch.distributions.Normal(mean, (0.5 * logvar).exp()).log_prob(x).sum(-1)
    assert torch.allclose(gaussian_log_density(x, mean, logvar), want, atol=1e-5)
    mvn = torch.distributions.MultivariateNormal(mean, torch.diag_embed(logvar.exp()))
    assert torch.allclose(gaussian_log_density(x, mean, logvar), mvn.log_prob(x), atol=1e-4)
    tau = 0.7
    want = torch.distributions.Normal(mean, (0.5 * logvar).exp() * tau).log_prob(x).sum(-1)
    assert torch.allclose(transition_log_density(x, mean, logvar, tau), want, atol=1e-5)


def test_head_runs_cfg_and_parallel_evaluation():
    model = mlp_model(0, C=2, K=5)
    head, g = model.head, torch.Generator().manual_seed(0)
    z, zu = torch.randn(7, 32, generator=g), torch.randn(7, 32, generator=g)
    with torch.no_grad():
        run = head.sample_trajectory(z, zu, cfg_scale=2.5, temperature=0.6, generator=g)
        # states[k+1] = mean + sigma * temperature * noise, and the recorded densities are the steps'
        step = run.means + (0.5 * run.logvars).exp() * 0.6 * run.noise
        assert torch.allclose(run.states[:, 1:], step)
        want = torch.distributions.Normal(run.means, (0.5 * run.logvars).exp() * 0.6).log_prob(run.states[:, 1:]).sum(-1)
        assert torch.allclose(run.step_log_densities(0.6), want, atol=1e-4)
        # all K steps in one batched call reproduce the sequential run
        means, logvars = head.evaluate(run.states, z, zu, 2.5)
        assert torch.allclose(means, run.means, atol=1e-5) and torch.allclose(logvars, run.logvars, atol=1e-5)
        # CFG acts on epsilon; the variance comes from the conditional half
        x, step_i = run.states[:, 2], torch.full((7,), 2)
        t = head.sampler.timesteps[step_i]
        oc, ou = head.net(x, t, z), head.net(x, t, zu)
        out = torch.cat([ou[:, :2] + 2.5 * (oc[:, :2] - ou[:, :2]), oc[:, 2:]], -1)
        mean, logvar = head.sampler.p_mean_logvar(out, x, step_i)
        got = head.predict(x, step_i, z, zu, 2.5)
        assert torch.allclose(got[0], mean, atol=1e-5) and torch.allclose(got[1], logvar, atol=1e-5)
        # temperature 0: x_K = 0 and no noise, whatever the generator
        a = head.sample(z, zu, 2.5, 0.0, torch.Generator().manual_seed(1))
        b = head.sample(z, zu, 2.5, 0.0, torch.Generator().manual_seed(2))
        assert torch.equal(a, b)


# ---------------------------------------------------------------- the model


def test_cached_protocol_matches_teacher_forced():
    for grid in ((2, 2), (1, 3)):
        model = mlp_model(1, grid=grid, C=2)
        L = model.layout.num_tokens
        g = torch.Generator().manual_seed(0)
        cond = torch.tensor([0, 1, 2, 1])
        toks = torch.randn(4, L, 2, generator=g)
        with torch.no_grad():
            want = model.features(cond, toks[:, :-1])
            model.setup_cache(4, 3)
            z0, _ = model.prefill(cond)
            assert torch.allclose(z0, want[:, 0], atol=1e-5)
            # feed garbage for rows 0/1, roll back per row, then feed the real tokens
            model.forward_tokens(torch.randn(4, 2, 2, generator=g), torch.zeros(4, 2, dtype=torch.long))
            model.set_committed(torch.zeros(4, dtype=torch.long))
            z, _ = model.forward_tokens(toks[:, :1], torch.zeros(4, 1, dtype=torch.long))
            model.set_committed(torch.ones(4, dtype=torch.long))
            rest, _ = model.forward_tokens(toks[:, 1:L - 1], torch.arange(1, L - 1).expand(4, -1))
        assert torch.allclose(z[:, 0], want[:, 1], atol=1e-5)
        assert torch.allclose(rest, want[:, 2:], atol=1e-5)
    square = mlp_model(0, grid=(2, 2))
    assert torch.equal(square.rope, rope_2d_table(2, 16, 10000.0, 1))


def test_training_loss_decreases_and_files_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = ContinuousAR(tiny_config(C=2, T=100, K=10))  # MAR's zero-initialised head
    g = torch.Generator().manual_seed(0)
    cond = torch.randint(0, 3, (32,), generator=g)
    toks = 0.5 * torch.randn(32, 4, 2, generator=g) + cond[:, None, None].float()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model.loss(cond, toks, batch_mul=2, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    model.eval().save_pretrained(tmp_path / "m")
    again = ContinuousAR.from_pretrained(tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(again.features(cond, toks), model.features(cond, toks))
    half = again.to(torch.bfloat16)  # the DDPM schedule stays float32; the head casts around its net
    assert half.head.sampler.alphas_cumprod.dtype == torch.float32
    lat, _ = generate_latents(half, cond[:4], CSpD(gamma=2, ratio="trajectory"), sv.Sampling(cfg_scale=2.0, noise="stream"),
                              draft=copy.deepcopy(half))
    assert lat.dtype == torch.float32 and torch.isfinite(lat).all()


# ---------------------------------------------------------------- residual sampler (Eq. 6-11)


def _residual_samples(sample_p, log_p, log_q, n, seed, max_tries=200):
    g = torch.Generator().manual_seed(seed)

    def propose():
        x = sample_p(n, g)
        return x, log_p(x)

    draw = residual_sample(propose, log_q, torch.ones(n, dtype=torch.bool), max_tries, g)
    assert not draw.fallback.any()
    return draw.samples


def _mixture(weights, means, stds):
    weights, means, stds = (torch.tensor(v, dtype=torch.float64) for v in (weights, means, stds))
    dim = means.shape[1]

    def sample(n, g):
        k = torch.multinomial(weights, n, replacement=True, generator=g)
        return means[k] + stds[k][:, None] * torch.randn(n, dim, generator=g, dtype=torch.float64)

    def log_density(x):
        comp = torch.stack([gaussian_log_density(x, means[k], 2 * stds[k].log().expand(dim)) for k in range(len(weights))], -1)
        return torch.logsumexp(comp + weights.log(), -1)

    return sample, log_density


def test_residual_sampler_1d_matches_normalised_positive_part():
    """KS test against the CDF of max(0, p - q) / Z by quadrature (p a two-Gaussian mixture, q a
    Gaussian). Catches alpha = p/q or 1 - p/q, a missing clamp, or keeping the first proposal: the
    plain draws from p must fail the same test."""
    sample_p, log_p = _mixture([0.6, 0.4], [[-1.0], [1.0]], [0.5, 1.0])
    _, log_q = _mixture([1.0], [[0.0]], [1.0])
    grid = torch.linspace(-8, 8, 160_001, dtype=torch.float64)[:, None]
    resid = (log_p(grid).exp() - log_q(grid).exp()).clamp_min(0)
    cdf = torch.cumsum(resid, 0)
    cdf = (cdf / cdf[-1]).numpy()
    xs = grid[:, 0].numpy()
    F = lambda v: np.interp(v, xs, cdf)
    samples = _residual_samples(sample_p, log_p, log_q, 20_000, seed=0)
    assert sps.kstest(samples[:, 0].numpy(), F).pvalue > 1e-3
    plain = sample_p(20_000, torch.Generator().manual_seed(1))
    assert sps.kstest(plain[:, 0].numpy(), F).pvalue < 1e-6


def test_residual_sampler_2d_matches_normalised_positive_part():
    """Binned chi-square (8x8 bins on [-3, 3]^2 plus the outside) against max(0, p - q) / Z integrated
    on a fine grid; p a 2-D mixture, q a Gaussian. Plain draws from p must fail."""
    sample_p, log_p = _mixture([0.5, 0.5], [[-1.0, 0.0], [1.2, 0.5]], [0.6, 0.8])
    _, log_q = _mixture([1.0], [[0.3, 0.0]], [1.0])
    h = 0.025  # cell edges fall on the bin edges: every quadrature cell lies inside one bin
    axis = torch.arange(-7, 7, h, dtype=torch.float64) + h / 2
    pts = torch.cartesian_prod(axis, axis)
    mass = (log_p(pts).exp() - log_q(pts).exp()).clamp_min(0)
    edges = np.linspace(-3, 3, 9)

    def bin_index(x):
        x = np.asarray(x)
        ij = np.stack([np.digitize(x[:, d], edges) - 1 for d in range(2)], -1)
        inside = ((ij >= 0) & (ij < 8)).all(-1)
        return np.where(inside, ij[:, 0] * 8 + ij[:, 1], 64)

    expected = np.bincount(bin_index(pts.numpy()), weights=mass.numpy(), minlength=65)
    expected = expected / expected.sum()
    n = 30_000
    keep = expected * n >= 5

    def pvalue(samples):
        counts = np.bincount(bin_index(samples.numpy()), minlength=65).astype(float)
        obs = np.append(counts[keep], counts[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum()) * n
        return sps.chisquare(obs, exp).pvalue

    assert pvalue(_residual_samples(sample_p, log_p, log_q, n, seed=2)) > 1e-3
    assert pvalue(sample_p(n, torch.Generator().manual_seed(3))) < 1e-6


def test_residual_sampler_fallback_and_bonus_rows():
    g = torch.Generator().manual_seed(0)
    proposals = []

    def propose():
        x = torch.randn(4, 2, generator=g)
        proposals.append(x)
        return x, torch.zeros(4)

    # q >= p everywhere: alpha_s = 0, pending rows exhaust their tries and keep the last proposal
    draw = residual_sample(propose, lambda x: torch.ones(4), torch.tensor([True, True, False, False]), 5, g)
    assert draw.tries.tolist() == [5, 5, 0, 0] and draw.fallback.tolist() == [True, True, False, False]
    assert torch.equal(draw.samples[:2], proposals[-1][:2])
    assert torch.equal(draw.samples[2:], proposals[0][2:])  # rows not pending keep their first proposal
    with pytest.raises(ValueError, match="max_tries"):
        residual_sample(propose, lambda x: x[:, 0], torch.ones(4, dtype=torch.bool), 0, g)


def test_paper_sigma_is_eq4():
    """Aligned, the Eq. 1 factors of the first K-1 steps reduce to log Sigma = sum 1/2 log(var_q / var_p) (Eq. 4)."""
    t, d = mixture_model(0, C=2), mixture_model(1, C=2)
    cond = torch.tensor([0, 1, 2])
    s = sv.Sampling(temperature=0.8, noise="stream")
    target = GuidedContinuous(t, cond, s, 2)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        zp, zq = t.features(cond, torch.zeros(3, 0, 2))[:, 0], d.features(cond, torch.zeros(3, 0, 2))[:, 0]
        q_runs = d.head.sample_trajectory(zq, None, 1.0, 0.8, g)
        log_ratio, aux = laws.paper_log_ratio(laws.ContinuousLaw(zp, None, target.head), q_runs, g, align=True,
                                              coupled=False)
        p_runs = t.head.sample_trajectory(zp, None, 1.0, 0.8, None, q_runs.states[:, 0], q_runs.noise)
    sigma = 0.5 * (q_runs.logvars[:, :-1] - p_runs.logvars[:, :-1]).sum((1, 2))
    assert torch.allclose(aux["log_sigma"], sigma, atol=1e-3)
    last = transition_log_density(q_runs.x0, p_runs.means[:, -1], p_runs.logvars[:, -1], 0.8) \
        - transition_log_density(q_runs.x0, q_runs.means[:, -1], q_runs.logvars[:, -1], 0.8)
    assert torch.allclose(log_ratio, sigma + last, atol=1e-3)


# ---------------------------------------------------------------- the method


def test_method_config_registry_and_errors():
    for kw, field in [({"gamma": 0}, "gamma"), ({"prefill": 1.5}, "prefill"), ({"ratio": "exact"}, "ratio"),
                      ({"max_resample_tries": 0}, "max_resample_tries"), ({"align": 1}, "align"),
                      ({"ratio": "trajectory", "align": False}, "align")]:
        with pytest.raises(ValueError, match=field):
            CSpD(**kw)
    assert not CSpD().lossless and CSpD(ratio="trajectory").lossless and CSpD(ratio="coupled").lossless
    m = build_method("cspd", {"gamma": 3, "prefill": 0.1, "ratio": "trajectory"})
    assert m == CSpD(gamma=3, prefill=0.1, ratio="trajectory") and m.pad == 5
    assert CSpD(prefill=0.3).prefill_tokens(16) == 5 and CSpD(prefill=0.0).prefill_tokens(16) == 1

    t, d = mlp_model(0, C=2, K=4), mlp_model(1, C=2, K=4)
    cond = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="top_k"):
        generate_latents(t, cond, CSpD(gamma=2), sv.Sampling(top_k=3, noise="stream"), draft=d)
    with pytest.raises(ValueError, match="draft"):
        generate_latents(t, cond, CSpD(gamma=2, prefill=0.25))
    llama = sv.models.LlamaGen(sv.models.LlamaGenConfig(vocab_size=4, dim=32, n_layer=1, n_head=2, num_classes=3,
                                                        block_size=4, multiple_of=16))
    with pytest.raises(ValueError, match="continuous"):
        sv.generate(llama, cond, method=CSpD(gamma=2), seed=0)


def test_generate_runs_every_variant_on_mlp_heads():
    t, d = mlp_model(0, C=2, K=4), mlp_model(1, C=2, K=4)
    cond = torch.tensor([0, 1, 2, 0])
    for ratio, align in (("paper", True), ("paper", False), ("coupled", False), ("trajectory", True)):
        out = sv.generate(t, cond, method=CSpD(gamma=2, ratio=ratio, align=align, prefill=0.0),
                          sampling=sv.Sampling(cfg_scale=2.0, noise="stream"), seed=0, draft=d)
        st = out.stats
        assert st.tokens == 4 and 2 <= st.target_forwards <= 4 and st.draft_forwards >= 3
        assert out.tokens is None and out.latents.shape == (4, 4, 2) and st.accept_map.shape == (4, 2, 2)
        assert st.extra["prefill_tokens"] == 1.0 and 0.0 <= st.extra["acceptance_rate"] <= 1.0
    lat, _ = generate_latents(t, cond, CSpD(gamma=2, ratio="trajectory"), sv.Sampling(cfg_scale=2.0, noise="stream"), draft=d)
    assert lat.shape == (4, 4, 2) and torch.isfinite(lat).all()
    assert not lat.is_inference()  # made under the decode's inference mode: returned as an ordinary tensor


def test_target_only_path_equals_uncached_reference_draw_for_draw():
    t = mixture_model(0, grid=(2, 3), C=2)
    cond = torch.tensor([0, 1, 2, 2])
    s = sv.Sampling(cfg_scale=1.5, temperature=0.8, noise="stream")
    lat, st = generate_latents(t, cond, CSpD(prefill=1.0), s, seed=5)
    assert torch.allclose(lat, reference(t, cond, s, seed=5), atol=1e-4)
    assert st.target_forwards == 6 and st.draft_forwards == 0 and st.extra["prefill_tokens"] == 6


def test_greedy_is_deterministic_and_equals_target_greedy_per_row():
    """Temperature 0: the output is the target's greedy output whatever the draft and seed. The draft
    equals the target on class 0 and differs on class 1, so rows accept different lengths in the same
    batch: per-row rollback of both caches is what keeps every row equal to the reference."""
    t = mixture_model(0, grid=(3, 3), C=2)
    d = copy.deepcopy(t)
    with torch.no_grad():
        d.cls_embedding.embedding_table.weight[1].add_(5.0)
    cond = torch.tensor([0, 1, 0, 1, 2])
    s = sv.Sampling(temperature=0.0, noise="stream")
    want = reference(t, cond, s, seed=0)
    for ratio in ("paper", "trajectory"):
        a, st = generate_latents(t, cond, CSpD(gamma=3, ratio=ratio, prefill=0.0), s, seed=0, draft=d)
        b, _ = generate_latents(t, cond, CSpD(gamma=3, ratio=ratio, prefill=0.0), s, seed=1, draft=d)
        assert torch.equal(a, b)
        assert torch.allclose(a, want, atol=1e-3)
        amap = st.accept_map.reshape(5, -1)
        assert (amap[0, 1:] == 4).sum() >= 6 and (amap[1, 1:] == 1).sum() >= 6  # class 0 accepts, class 1 rejects
    same, st = generate_latents(t, cond, CSpD(gamma=3, prefill=0.0), s, seed=0, draft=copy.deepcopy(t))
    assert torch.allclose(same, want, atol=1e-3) and st.extra["acceptance_rate"] == 1.0


def _forced(patterns: list[list[float]]):
    """A stand-in for the log-ratio computation: row b gets log ratios patterns[b] every round."""
    table = torch.tensor(patterns)

    def log_ratio(p, q_runs):
        return table.reshape(-1).to(p.z)

    return log_ratio


def test_rows_accept_independently_and_stop_at_first_rejection(monkeypatch):
    """Row 0 accepts everything, row 1 rejects everything, row 2 rejects its second token but would
    accept the third: stop-at-first-rejection commits exactly 2 tokens per round for it (the official
    code's independent acceptance would keep the third, drawn after the rejected one)."""
    inf = float("inf")
    monkeypatch.setattr(cspd_mod, "trajectory_log_ratio", _forced([[0, 0, 0], [-inf, -inf, -inf], [0, -inf, 0]]))
    t, d = mixture_model(0, grid=(4, 4)), mixture_model(1, grid=(4, 4))
    lat, st = generate_latents(t, torch.tensor([0, 1, 2]), CSpD(gamma=3, ratio="trajectory", prefill=0.0),
                               sv.Sampling(noise="stream"), seed=0, draft=d)
    amap = st.accept_map.reshape(3, 16).tolist()
    assert amap[0] == [1] + [4] * 12 + [3] * 3
    assert amap[1] == [1] * 16
    assert amap[2] == [1] + [2] * 14 + [1]
    assert st.target_forwards == 16 and torch.isfinite(lat).all() and (lat != 0).all()
    assert st.extra["acceptance_rate"] == pytest.approx(20 / 42)


def test_prefill_fraction_and_fallback_counting(monkeypatch):
    t, d = mixture_model(0, grid=(4, 4)), mixture_model(1, grid=(4, 4))
    cond = torch.tensor([0, 1])
    _, st = generate_latents(t, cond, CSpD(gamma=3, prefill=0.3), sv.Sampling(noise="stream"), seed=0, draft=d)
    amap = st.accept_map.reshape(2, 16)
    assert st.extra["prefill_tokens"] == 5 and (amap[:, :5] == 1).all()
    assert st.target_forwards >= 5 + math.ceil(11 / 4)

    inner = laws.residual_sample

    def never(propose, log_q, pending, max_tries, gen):  # q >= p: the residual never accepts
        return inner(propose, lambda x: torch.full(x.shape[:1], float("inf")), pending, max_tries, gen)

    monkeypatch.setattr(laws, "residual_sample", never)
    for ratio in ("paper", "trajectory"):
        lat, st = generate_latents(t, cond, CSpD(gamma=3, ratio=ratio, prefill=0.0, max_resample_tries=3),
                                   sv.Sampling(noise="stream"), seed=0, draft=d)
        assert st.extra["resamples"] > 0 and st.extra["resample_fallbacks"] == st.extra["resamples"]
        assert st.extra["resample_tries"] == 3 and torch.isfinite(lat).all()


def _last_step_only(p, q_runs):
    """A plausible wrong ratio: only the final Gaussian step's p/q on the draft's path."""
    means, logvars = p.head.head.evaluate(q_runs.states, p.z, p.z_uncond, p.head.scale)
    log_p = transition_log_density(q_runs.x0, means[:, -1], logvars[:, -1], p.temperature)
    return log_p - q_runs.step_log_densities(p.temperature)[:, -1]


def test_exact_variants_reproduce_target_law(monkeypatch):
    """Energy-distance two-sample tests (2,000 samples, 200 permutations) against target-only draws:
    trajectory and coupled pass; the draft's own law and two wrong ratios fail: q/p instead of p/q, and
    the last step's ratio alone. Power, measured on this model: the energy statistic's null spread is
    ~0.003; the wrong ratios give 0.69 and 0.020. Subtler bugs are below this test's power at 2,000
    samples (ratio x 4.5: 0.0026; residual replaced by plain target draws: 0.0039; half the log ratio:
    0.0026). The paper ratio is measured and printed, not asserted."""
    t, d = mixture_model(0), mixture_model(1)
    n = 2000
    cond = torch.arange(n) % 3
    s = sv.Sampling(cfg_scale=2.0, temperature=0.9, noise="stream")
    ref = reference(t, cond, s, seed=1)

    def run(ratio):
        return generate_latents(t, cond, CSpD(gamma=3, ratio=ratio, prefill=0.0, max_resample_tries=1000), s,
                                seed=3, draft=d)

    results = {}
    for ratio in ("trajectory", "coupled", "paper"):
        lat, st = run(ratio)
        results[ratio] = {"p": round(energy_pvalue(lat, ref)[0], 3), "acceptance": round(st.extra["acceptance_rate"], 3),
                              "fallbacks": st.extra["resample_fallbacks"], "resamples": st.extra["resamples"]}
    print("\nCSpD on the tiny mixture model:", results)
    assert results["trajectory"]["p"] > 0.01 and results["coupled"]["p"] > 0.01
    assert results["trajectory"]["fallbacks"] == 0 and results["coupled"]["fallbacks"] == 0

    draft_only, _ = generate_latents(d, cond, None, s, seed=4)
    assert energy_pvalue(draft_only, ref)[0] < 0.01
    exact = laws.trajectory_log_ratio
    for wrong in (lambda *a: -exact(*a), _last_step_only):
        monkeypatch.setattr(cspd_mod, "trajectory_log_ratio", wrong)
        lat, _ = run("trajectory")
        assert energy_pvalue(lat, ref)[0] < 0.01


def test_acceptance_paper_vs_trajectory_close_draft():
    """Recorded comparison with a close draft (perturbed copy, eps 0.1), 300 rows, gamma 3, no CFG.
    The paper ratio compares the last step at two diverged points x_1^p != x_1^q, so it collapses when
    the last step is sharp (T=100 -> K=8: std 0.025); the trajectory ratio compares both models at the
    same points and does not."""
    cond = torch.arange(300) % 3
    rates = {}
    for T in (16, 100):
        t = mixture_model(0, grid=(2, 2), C=2, T=T, K=8)
        d = perturbed(t, 0.1, 1)
        for ratio in ("paper", "coupled", "trajectory"):
            _, st = generate_latents(t, cond, CSpD(gamma=3, ratio=ratio, prefill=0.25), sv.Sampling(noise="stream"), seed=0, draft=d)
            rates[(T, ratio)] = round(st.extra["acceptance_rate"], 3)
    print("\nacceptance (T, ratio):", rates)
    assert rates[(100, "trajectory")] > 4 * max(rates[(100, "paper")], 0.01)
