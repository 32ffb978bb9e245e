"""No probability floor at a real vocabulary (issue 47), through ``sv.generate`` for every method that samples.

The target: a 2x2-grid LlamaGen over V = 65,536 codes whose law at every position, whatever the prefix,
is one dominant code at logit 30 and logit 0 for the V - 1 others (its blocks write nothing, every
embedding is one vector, the head has one non-zero row): a code other than the dominant one has
probability (V - 1) e^-30 / (1 + (V - 1) e^-30) = 6.1e-9 per token.

The bug: draws from float32 uniforms, which are 0 with probability 2^-24. The exponential race
argmax(p / E), E = -log(1 - U), then let that code win whatever its probability: a floor of
(V - 1) 2^-24 = 0.0039 per draw (issue 47: 81 stray codes in 102,400 draws at 16,384 codes); an
acceptance test u < alpha with u = 0 accepts any alpha > 0 (a floor of 2^-24 per test, too rare to see
by sampling). Two kinds of test:

- With the real generator (``test_ar_draws_no_stray_code``, ``test_the_race_draws_no_stray_code``): AR
  makes 4 draws an image; over 1,024 images the float32 sampler's expected number of stray codes is
  4 x 1,024 x 0.0039 = 16.0, so it passes with probability e^-16 = 1.1e-7 (measured with the code before
  the fix: 10). The exact law expects 4 x 1,024 x 6.1e-9 = 2.5e-5; the float64 sampler's resolution
  (``specvis.sampling``) adds at most 4,096 draws x 65,535 codes x 3 2^-52 = 1.8e-7. The race of SJD's
  Gumbel coupling, drawn directly on 4,096 rows of the same law: the same numbers (measured before the
  fix: 13), its looser resolution bound adding at most 4,096 x 65,535 x (V + 3) 2^-53 = 2.0e-3.
- With the 2^-24 event made common (``test_no_method_draws_a_float32_uniform``, every method of
  ``METHODS``: AR, Speculative, SJD with each coupling, the trees, and SJD with GSD, a relaxed rule): every float32 uniform
  ``torch.rand`` returns is 0 with probability 1/2. A draw or acceptance test of any method that still
  used float32 uniforms then commits a stray code at about half of its draws (a race's winner is a
  random zero-U code unless the dominant one drew 0 too; a random draft is accepted), so over 32 images
  (at least 32 such draws) it passes with probability below 2^-32; float64 draws are untouched. The draft
  model is uniform and the EAGLE head ranks the dominant code last, so that drafts are stray codes that
  only a broken acceptance commits. Measured with the code before the fix: 61 to 94 stray codes per method.
"""

from __future__ import annotations

import pytest
import torch

import specvis as sv
from specvis.models.drafter import EagleDrafter
from specvis.sampling import Sampling, exponential, uniform

V = 65_536
DOMINANT = 12_345
LOGIT = 30.0
CHUNK = 128  # images per generate call: bounds memory at about CHUNK x block x V floats
SAMPLING = Sampling(temperature=1.0, noise="stream")  # the stream sampler's uniforms and races (keyed noise: tests/test_seeds.py)

METHODS = {
    "ar": sv.AR(),
    "speculative": sv.Speculative(gamma=2),
    "sjd_none": sv.SJD(window=3, coupling="none"),
    "sjd_maximal": sv.SJD(window=3, coupling="maximal"),
    "sjd_gumbel": sv.SJD(window=3, coupling="gumbel"),
    "sjd_vertical_gumbel": sv.SJD(window=3, init="vertical-sample", coupling="gumbel"),
    "eagle": sv.EagleTree(depth=2, top_k=2, total_tokens=4),
    "adt": sv.ADTTree(total_tokens=4, depth_range=(0, 3), topk_range=(0, 3)),
    "static_tree": sv.StaticTree(tree=[[0], [1], [0, 0]]),
    "sjd_gsd": sv.SJD(window=3, acceptance=sv.GSD()),  # a relaxed rule's path (no table needed)
}


def dominant_llamagen(seed: int, logit: float = LOGIT) -> sv.models.LlamaGen:
    """A 2x2 LlamaGen over V codes whose law at every position, whatever the prefix, is logit ``logit``
    for code DOMINANT and 0 for every other code (module docstring)."""
    torch.manual_seed(seed)
    cfg = sv.models.LlamaGenConfig(vocab_size=V, dim=8, n_layer=1, n_head=1, num_classes=1, block_size=4,
                                   multiple_of=8)
    model = sv.models.LlamaGen(cfg).eval()
    with torch.no_grad():
        for m in model.layers.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.zero_()  # the blocks add nothing: the stream is the input embedding
        e = torch.randn(cfg.dim)
        model.tok_embeddings.weight.copy_(e.expand_as(model.tok_embeddings.weight))
        model.cls_embedding.embedding_table.weight.copy_(e.expand_as(model.cls_embedding.embedding_table.weight))
        h = model.norm(e)
        model.output.weight.zero_()
        model.output.weight[DOMINANT] = logit * h / h.square().sum()
    return model


def contrary_drafter(target: sv.models.LlamaGen) -> EagleDrafter:
    """An EAGLE head whose feature is minus the dominant code's head row: it ranks that code last, so
    its candidates are stray codes (logit 0, the others' ties)."""
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    with torch.no_grad():
        for m in drafter.layers.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.zero_()
        w = target.output.weight[DOMINANT]
        drafter.fc.weight.zero_()
        drafter.fc.bias.copy_(-w / w.norm())
    return drafter


@pytest.fixture(scope="module")
def models():
    target = dominant_llamagen(0)
    return target, dominant_llamagen(1, logit=0.0), contrary_drafter(target)


def test_the_models_are_what_the_tests_assume(models):
    target, flat, drafter = models
    logits = target.logits(torch.zeros(3, dtype=torch.long), torch.randint(V, (3, 3)))
    assert torch.allclose(logits[..., DOMINANT], torch.full((3, 4), LOGIT), atol=1e-4)
    assert torch.cat([logits[..., :DOMINANT], logits[..., DOMINANT + 1:]], -1).abs().max() == 0
    assert flat.logits(torch.zeros(1, dtype=torch.long), torch.randint(V, (1, 3))).abs().max() == 0
    ranked = drafter.logits(drafter.fc.bias[None])[0]
    assert ranked[DOMINANT] < 0 and ranked.argmin() == DOMINANT


def strays(method, models, images: int) -> int:
    """Image tokens other than the dominant code over ``images`` images (seed = chunk index)."""
    target, draft, drafter = models
    count = 0
    for seed, start in enumerate(range(0, images, CHUNK)):
        cond = torch.zeros(min(CHUNK, images - start), dtype=torch.long)
        out = sv.generate(target, cond, method, SAMPLING, seed=seed, draft=draft, drafter=drafter)
        count += int((out.tokens != DOMINANT).sum())
    return count


def test_ar_draws_no_stray_code(models):
    """1,024 images of 4 tokens: 0 stray codes (exact law: 2.5e-5 expected; float32 sampler: 16)."""
    n = strays(METHODS["ar"], models, images=1_024)
    assert n == 0, f"{n} stray codes"


def test_the_race_draws_no_stray_code(models):
    """SJD's Gumbel coupling draws argmax(q / E) with E from ``exponential``: 4,096 draws of the target's
    law at position 0, 0 stray codes (exact law: 2.5e-5 expected; float32 uniforms: 16)."""
    target = models[0]
    p = SAMPLING.probs(target.logits(torch.zeros(1, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long))[:, 0])
    g = torch.Generator().manual_seed(0)
    rows = p.expand(256, V)
    n = sum(int((torch.argmax(rows / exponential(rows, g), -1) != DOMINANT).sum()) for _ in range(16))
    assert n == 0, f"{n} stray codes"


def _float32_uniforms_half_zero(monkeypatch) -> None:
    """``torch.rand`` as before, except that each float32 uniform is 0 with probability 1/2 (drawn from
    the same generator: reproducible); float64 uniforms are untouched."""
    real = torch.rand

    def rand(*args, **kw):
        u = real(*args, **kw)
        if u.dtype == torch.float64:
            return u
        return u.masked_fill(real(*args, **kw) < 0.5, 0.0)

    monkeypatch.setattr(torch, "rand", rand)


@pytest.mark.parametrize("name", list(METHODS))
def test_no_method_draws_a_float32_uniform(models, monkeypatch, name):
    """Every float32 uniform 0 with probability 1/2: 0 stray codes in 32 images (module docstring)."""
    _float32_uniforms_half_zero(monkeypatch)
    n = strays(METHODS[name], models, images=32)
    assert n == 0, f"{n} stray codes"


def test_uniforms_resolve_below_float32():
    """Acceptance uniforms are float64 with 53-bit resolution (a float32 u is on the 2^-24 grid)."""
    u = uniform((4096,), torch.zeros(1), torch.Generator().manual_seed(0))
    assert u.dtype == torch.float64 and bool(((u * 2**24) % 1 != 0).any())
    assert bool(((u * 2**53) % 1 == 0).all()) and 0 <= float(u.min()) and float(u.max()) < 1
