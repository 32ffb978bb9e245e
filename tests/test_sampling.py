"""The probability pipeline of docs/design/api.md, step by step, and seeded reproducibility."""

import pytest
import torch

import specvis as sv
from specvis.sampling import exponential, make_generator, sample


def test_cfg_temperature_topk_topp_order():
    c = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    u = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    s = sv.Sampling(temperature=0.5, top_k=3, top_p=0.9, cfg_scale=2.0)
    guided = u + 2.0 * (c - u)  # [4, 1, 0, -3]
    logits = guided / 0.5  # [8, 2, 0, -6]; top-3 drops the last
    p3 = torch.softmax(logits[:, :3], -1)  # [0.9973, 0.0025, 0.0003]: top-p 0.9 keeps only the first
    assert p3[0, 0] > 0.9
    assert torch.allclose(s.probs(c, u), torch.tensor([[1.0, 0, 0, 0]]))
    s2 = sv.Sampling(temperature=2.0, top_k=2, cfg_scale=2.0)
    expected = torch.softmax(torch.tensor([[4.0, 1.0]]) / 2.0, -1)
    assert torch.allclose(s2.probs(c, u)[:, :2], expected) and s2.probs(c, u)[0, 2:].sum() == 0


def test_top_p_keeps_smallest_set_reaching_mass():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = p.log()
    assert (sv.Sampling(top_p=0.8).probs(logits) > 0).sum() == 2  # 0.5 + 0.3 >= 0.8
    assert (sv.Sampling(top_p=0.81).probs(logits) > 0).sum() == 3
    assert (sv.Sampling(top_p=0.1).probs(logits) > 0).sum() == 1


def test_greedy_is_a_point_mass_at_the_argmax():
    logits = torch.randn(5, 7)
    p = sv.Sampling(temperature=0).probs(logits)
    assert torch.equal(p.argmax(-1), logits.argmax(-1)) and torch.all(p.sum(-1) == 1) and torch.all(p.max(-1).values == 1)


def test_sampler_matches_the_law_and_is_seeded():
    """``sample`` draws from p: 200k draws of a 4-way law within 0.005 of each probability."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(200_000, 4)
    x = sample(p, make_generator(0, "cpu"))
    freq = torch.bincount(x, minlength=4).float() / x.numel()
    assert torch.allclose(freq, p[0], atol=0.005)
    assert torch.equal(x, sample(p, make_generator(0, "cpu")))
    assert not torch.equal(x, sample(p, make_generator(1, "cpu")))


@pytest.mark.parametrize("field,kw", [("temperature", {"temperature": -1}), ("top_k", {"top_k": 0}),
                                      ("top_p", {"top_p": 1.5}), ("cfg_scale", {"cfg_scale": -2})])
def test_invalid_values_name_the_field(field, kw):
    with pytest.raises(ValueError, match=field):
        sv.Sampling(**kw)


def test_methods_validate_their_fields():
    with pytest.raises(ValueError, match="gamma"):
        sv.Speculative(gamma=0)


@pytest.mark.parametrize("u", [0.0, 1 - 2**-53])  # the ends of torch.rand's float64 range
def test_draws_keep_a_point_mass_at_the_ends_of_u(monkeypatch, u):
    """At U = 0 and at the largest U both draws return a point mass's token: the inverse CDF of
    ``sample``, and the race argmax(p / E) with E = -log(1 - U) clamped (at U = 0, E would be 0 and
    0/0 = NaN would win; the largest U gives E = 36.7). Catches E = -log U, which is +inf at U = 0,
    zeroes the point mass and returns token 0 (seen once in the exactness tests)."""
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.full(shape, u, dtype=kw.get("dtype")))
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    assert sample(p).tolist() == [2, 1]
    e = exponential(p)
    assert torch.isfinite(e).all() and (e > 0).all() and torch.argmax(p / e, -1).tolist() == [2, 1]


def test_sample_never_draws_a_zero_probability_code(monkeypatch):
    """Codes with p = 0 (top-k, top-p, a residual's zeros) are never drawn, whatever U: their intervals
    of the integer CDF are empty. Every row below at 4,099 values of U, 0 and the largest included; at
    U < 1/2 the first row draws code 1, from 1/2 on code 3."""
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5], [1e-30, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    us = torch.cat([torch.linspace(0, 1 - 2**-53, 4096, dtype=torch.float64),
                    torch.tensor([2**-53, 0.5 - 2**-53, 0.5], dtype=torch.float64)])
    rows = p[None].expand(len(us), -1, -1).reshape(-1, 4)
    u = us[:, None].expand(-1, 4).reshape(-1, 1)
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: u.clone())
    x = sample(rows)
    assert bool((rows.gather(1, x[:, None]) > 0).all())
    first = x.view(len(us), 4)[:, 0]
    assert torch.equal(first, torch.where(us < 0.5, 1, 3))
