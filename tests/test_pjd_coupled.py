"""PJD under keyed noise and ``sv.Coupled`` (``methods/pjd.py``, docs/guide/seeds.md).

Each round verifies every image row in flight against the point masses at the keyed choices
t_m = argmax_v p_m(v) / E(s, m, v) of the laws the round computed, at each position's stream index m:
the top row commits t_m (accepted drafts, then the residual or bonus, both t_m), lower rows the drafts
equal to their own t_m. What must hold: rows that never overlap (lag >= width, keep_threshold 1) give
AR's tokens for every seed, at any batch size and with continuous batching; the law there is AR's
(chi-square); with overlapping rows every committed token is the keyed choice of the law its round
computed, and the picture is a function of the seed (drafts race the same noise); methods that verify
outside the walks stay refused."""

import dataclasses

import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model

import specvis as sv
from specvis.accept import Coupled
from specvis.generate import keyed_method
from specvis.methods import pjd as pjd_module
from specvis.noise import exponentials
from specvis.registry import method_from_spec

P_MIN = 1e-3
KEYED = sv.Sampling(temperature=1.0, cfg_scale=2.5, noise="keyed")


def no_overlap(width: int, **kw) -> sv.PJD:
    """PJD in SJD's configuration: row r + 1 starts once row r is complete, always refine, Coupled."""
    return sv.PJD(lag=width, keep_threshold=1.0, acceptance=Coupled(), **kw)


@pytest.fixture(scope="module")
def models():
    """A 4x4 LlamaGen over 50 codes (no row end) and an Emu3-shaped prompt model (a forced row end)."""
    return {"llamagen": tiny_llamagen(0, vocab=50, grid=4),
            "row-end": tiny_prompt_model(0, vocab=7, height=4, width=4, row_end=1, janus=False)}


def _conditions(model, n: int):
    order = [k % 3 for k in range(n)]
    return torch.tensor(order) if model.num_conditions is not None else condition_rows(model, order)


# ---- rows that never overlap: AR's tokens ----
@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_pjd_without_overlap_gives_ar_tokens_for_every_seed(models, name):
    """Seeds 0..39 in one call, seeds 0..15 in calls of 4, seeds 0, 17 and 39 alone, seeds 0..12 by
    continuous batching (4 rows): AR's tokens, token for token, for windows below and above the width,
    both first-draft inits and both couplings (under Coupled every draft races the keyed noise)."""
    m = models[name]
    cond = _conditions(m, 40)
    ar = sv.generate(m, cond, sv.AR(), KEYED, seed=0).tokens
    assert len({tuple(t) for t in ar.tolist()}) > 35  # seeds name different pictures
    for method in (no_overlap(4, window=3), no_overlap(4, window=8, init="vertical-repeat", coupling="gumbel")):
        out = sv.generate(m, cond, method, KEYED, seed=0)
        assert out.method.acceptance == Coupled() and out.stats.seeds == list(range(40))
        assert torch.equal(out.tokens, ar), method
        fours = torch.cat([sv.generate(m, cond[j:j + 4], method, KEYED, seed=j).tokens for j in range(0, 16, 4)])
        assert torch.equal(fours, ar[:16]), method
        ones = torch.cat([sv.generate(m, cond[j:j + 1], method, KEYED, seed=j).tokens for j in (0, 17, 39)])
        assert torch.equal(ones, ar[[0, 17, 39]]), method
        assert torch.equal(sv.generate(m, cond[:13], method, KEYED, seed=0, batch_size=4).tokens, ar[:13]), method


def test_pjd_without_overlap_under_coupled_is_exact_by_the_harness(target):
    """2x2 harness (lag >= width: the top row only): the enumerated law."""
    sampling = sv.Sampling(temperature=0.9, cfg_scale=2.0, noise="keyed")
    assert check_method(target, no_overlap(2, window=2), sampling) > P_MIN


@pytest.mark.parametrize("bundle", ["emoji", "emoji-t2i"])
def test_embedded_models_give_ar_images_without_overlap(bundle):
    """The trained emoji targets in fp32 at temperature 1: two images (seeds 0 and 1) are AR's at batch 2,
    and image 1 alone (seed 1) too."""
    pipe = sv.load(bundle)
    call = {"classes": [0, 7]} if bundle == "emoji" else {"prompts": ["cat face", "red heart"]}
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
    method = no_overlap(pipe.target.layout.width)
    ar = pipe(method=sv.AR(), sampling=sampling, seed=0, decode=False, **call).tokens
    out = pipe(method=method, sampling=sampling, seed=0, decode=False, **call)
    assert out.method.acceptance == Coupled() and torch.equal(out.tokens, ar)
    one = {k: v[1:] for k, v in call.items()}
    assert torch.equal(pipe(method=method, sampling=sampling, seed=1, decode=False, **one).tokens[0], ar[1])


# ---- overlapping rows: the keyed choices of the laws PJD computes ----
def _recorded_commits(monkeypatch):
    """Wrap ``JacobiRows.settle``: per round, each row's committed image tokens with the keyed choice of
    the law the round computed at each of them, recomputed here from ``specvis.noise`` and the row's seed."""
    seen = {"tokens": [], "choices": [], "top": 0, "lower": 0}
    settle = pjd_module.JacobiRows.settle

    def recording(self, ctx, rows, block, law):
        c0, top, seeds = rows.c.clone(), rows.top.clone(), ctx.keyed.seeds.clone()
        P = rows.chain_laws(block, law.probs)  # (B, H, K, V): column c + k
        settle(self, ctx, rows, block, law)
        n = rows.c - c0
        for b, r in (n > 0).nonzero().tolist():
            cols = torch.arange(int(c0[b, r]), int(rows.c[b, r]))
            at = r * rows.stride + cols
            e = exponentials(seeds[b:b + 1], at[None], P.shape[-1])[0]
            choice = torch.argmax(P[b, r, : len(cols)].double() / e, dim=-1)
            seen["tokens"].append(ctx.tokens[b, at])
            seen["choices"].append(choice)
            seen["top" if top[b, r] else "lower"] += len(cols)
        return None

    monkeypatch.setattr(pjd_module.JacobiRows, "settle", recording)
    return seen


@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_overlapping_rows_commit_the_keyed_choices_of_their_laws(models, name, monkeypatch):
    """Default-shaped PJD (rows overlapping: lag 1 and 2, keep threshold, RCM), 9 images in a batch and by
    continuous batching (2 rows): every token any row commits, top or lower, is the keyed choice of the
    law its round computed at its stream position for its image's seed."""
    m = models[name]
    cond = _conditions(m, 9)
    seen = _recorded_commits(monkeypatch)
    for method in (sv.PJD(window=4, lag=1, acceptance=Coupled()),
                   sv.PJD(window=3, lag=2, init="vertical-repeat", coupling="gumbel", acceptance=Coupled())):
        for batch_size in (None, 2):
            out = sv.generate(m, cond, method, KEYED, seed=5, batch_size=batch_size)
            assert out.stats.seeds == list(range(5, 14))
    assert seen["top"] > 300 and seen["lower"] > 30  # rows really overlapped
    assert torch.equal(torch.cat(seen["tokens"]), torch.cat(seen["choices"]))


@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_overlapping_rows_give_one_picture_per_seed(models, name):
    """With drafts raced against the keyed noise and verification by equality, PJD's image is a function of
    its seed (not AR's image: lower rows see partial rows): image k of a batch of 9 is the image of seed
    5 + k alone and under continuous batching (3 rows), and differs from AR's somewhere."""
    m = models[name]
    cond = _conditions(m, 9)
    method = sv.PJD(window=4, lag=1, acceptance=Coupled())
    batch = sv.generate(m, cond, method, KEYED, seed=5).tokens
    assert torch.equal(sv.generate(m, cond, method, KEYED, seed=5, batch_size=3).tokens, batch)
    for k in (0, 4, 8):
        assert torch.equal(sv.generate(m, cond[k:k + 1], method, KEYED, seed=5 + k).tokens[0], batch[k])
    assert not torch.equal(batch, sv.generate(m, cond, sv.AR(), KEYED, seed=5).tokens)


def test_keyed_drafts_are_accepted_more_often(monkeypatch):
    """Drafts raced against the keyed noise of their positions equal the target's choice whenever their law
    is the target's: on the trained ``emoji`` target (fp32, T = 1, default PJD, two images) they commit
    far more tokens per forward than drafts drawn independently of the noise (measured over 16 images:
    2.52 against 1.50; docs/guide/seeds.md)."""
    from specvis.sampling import sample

    pipe = sv.load("emoji")
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
    run = lambda: pipe(classes=[0, 7], method=sv.PJD(acceptance=Coupled()), sampling=sampling, seed=0,
                       decode=False).stats.mean_accepted_length
    keyed = run()
    monkeypatch.setattr(pjd_module.JacobiRows, "draw", lambda self, ctx, q, race, at, live: sample(q, ctx.generator))
    assert keyed > 1.3 * run()


# ---- the configuration ----
def test_pjd_keeps_exact_as_its_default_rule_and_takes_coupled_when_asked(models):
    m, cond = models["llamagen"], torch.tensor([0, 1])
    assert sv.generate(m, cond, sv.PJD(), KEYED).method.acceptance == sv.Exact()
    assert method_from_spec("pjd:accept=coupled").acceptance == Coupled()
    assert sv.generate(m, cond, method_from_spec("pjd:accept=coupled"), KEYED).method.acceptance == Coupled()
    with pytest.raises(ValueError, match="needs keyed noise"):
        sv.generate(m, cond, sv.PJD(acceptance=Coupled()), sv.Sampling(noise="stream"))


def test_methods_without_a_coupled_walk_are_refused_in_one_line():
    """ZipAR has no acceptance rule; a lossy rule method that does not declare ``coupled_walk`` is refused."""
    with pytest.raises(ValueError) as err:
        method_from_spec("zipar:accept=coupled")
    assert "zipar" in str(err.value) and "\n" not in str(err.value)

    @dataclasses.dataclass(frozen=True)
    class OwnRows(sv.PJD):
        coupled_walk = False
        name = "own-rows"

    with pytest.raises(ValueError) as err:
        keyed_method(OwnRows(acceptance=Coupled()), KEYED)
    assert "method own-rows runs its own walk" in str(err.value) and "\n" not in str(err.value)
    assert keyed_method(OwnRows(), KEYED).acceptance == sv.Exact()
