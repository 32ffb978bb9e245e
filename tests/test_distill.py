"""Distillation of the draft / EAGLE head on the target's guided law (specvis.train.distill)."""

import json

import pytest
import torch

import specvis
from specvis.models.drafter import EagleDrafter
from specvis.models.llamagen import LlamaGen, LlamaGenConfig
from specvis.sampling import Sampling
from specvis.train import distill
from specvis.train.report import next_token_laws

S = Sampling(temperature=1.0, cfg_scale=3.0)


def tiny(seed: int, dim: int = 32, scale: float = 3.0) -> LlamaGen:
    torch.manual_seed(seed)
    m = LlamaGen(LlamaGenConfig(vocab_size=8, dim=dim, n_layer=1, n_head=2, multiple_of=8, num_classes=3,
                                block_size=9)).eval()
    with torch.no_grad():
        m.output.weight.mul_(scale)  # laws far from uniform
    return m


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    target, draft = tiny(0), tiny(1, dim=16)
    target.save_pretrained(d / "target")
    draft.save_pretrained(d / "draft")
    head = EagleDrafter.from_target(target, seed=2)
    head.save_pretrained(d / "drafter")
    return d, target, draft


def data(target, n=8, seed=0):
    labels = torch.arange(n) % 3
    return labels, specvis.generate(target, labels, specvis.AR(), S, seed=seed).tokens


def test_guided_law_is_the_samplers(pair):
    _, target, _ = pair
    labels, codes = data(target)
    logp, _, _ = distill.teacher_log_law(target, labels, codes, S)
    # the sampler's law on the same logits, and report.next_token_laws (null class for the uncond branch)
    c = target.logits(labels, codes[:, :-1])
    u = target.logits(torch.full_like(labels, target.null_condition), codes[:, :-1])
    torch.testing.assert_close(logp.exp(), S.probs(c, u), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logp.exp(), next_token_laws(target, labels, codes, S), atol=1e-6, rtol=1e-5)
    # a wrong formula (c + s (c - u), or guiding probabilities) would not match
    assert not torch.allclose(logp.exp(), torch.softmax(c + 3 * (c - u), -1), atol=1e-3)
    # the head's guided law is the one EagleTree drafting ranks with (trees.log_draft)
    from types import SimpleNamespace
    from specvis.methods.trees import log_draft
    z = torch.randn(2 * 4, 5, 8)
    ctx = SimpleNamespace(target=SimpleNamespace(sampling=S, cfg=True), layout=SimpleNamespace(row_end=0))
    torch.testing.assert_close(log_draft(z, ctx, None), distill.guided_log_law(S, *z.chunk(2)))


def test_kl_zero_for_identical_student_positive_otherwise(pair):
    _, target, draft = pair
    labels, codes = data(target)
    same = distill.distill_losses(tiny(0), target, labels, codes, S)
    assert float(same["kl"].detach()) == pytest.approx(0.0, abs=1e-6)
    assert float(same["overlap"]) == pytest.approx(1.0, abs=1e-5) and float(same["top1"]) == 1.0
    other = distill.distill_losses(draft, target, labels, codes, S)
    assert float(other["kl"].detach()) > 0.05 and float(other["overlap"]) < 0.99
    assert float(other["tv"].detach()) == pytest.approx(1.0 - float(other["overlap"]), abs=1e-6) and other["tv"].requires_grad


def test_tv_divergence_trains_the_acceptance_probability(pair, tmp_path, monkeypatch):
    """--divergence tv minimises 1 - sum min(p, q) and nothing else: the training step reads the
    "tv" term, never "kl" (a flag that is ignored fails here), and the held-out acceptance
    probability rises (a tv without gradient leaves it where it was)."""
    d, _, _ = pair
    used, real = set(), distill.distill_losses

    class Spy(dict):
        def __getitem__(self, key):
            used.add(key)
            return super().__getitem__(key)

    monkeypatch.setattr(distill, "distill_losses", lambda *a, **k: Spy(real(*a, **k)))
    rep = run(d, tmp_path / "tv", "draft", "--max-steps", "40", "--divergence", "tv")
    assert "tv" in used and "kl" not in used and rep["hparams"]["divergence"] == "tv"
    assert rep["after"]["overlap"] > rep["before"]["overlap"] + 0.05
    assert rep["after"]["tv"] == pytest.approx(1.0 - rep["after"]["overlap"], abs=1e-6)


def run(d, out, student, *extra):
    argv = ["--student", student, "--target", str(d / "target"), "--init", str(d / student), "--out", str(out),
            "--samples", "32", "--sample-batch", "8", "--lr", "3e-3", "--warmup", "1", "--batch-size", "8",
            "--log-every", "5", *extra]
    assert distill.main(argv) == 0
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("student", ["draft", "drafter"])
def test_distillation_improves_held_out(pair, tmp_path, student):
    d, target, _ = pair
    rep = run(d, tmp_path / student, student, "--max-steps", "40", "--v-weight", "0")
    assert rep["after"]["kl"] < 0.8 * rep["before"]["kl"]
    assert rep["after"]["overlap"] > rep["before"]["overlap"]
    final = (LlamaGen.from_pretrained(tmp_path / student / "final") if student == "draft"
             else EagleDrafter.from_pretrained(tmp_path / student / "final", target))
    s = torch.load(tmp_path / student / "samples.pt", weights_only=False)
    ev = distill.evaluate(final, target, s["labels"][-4:], s["codes"][-4:], S)
    assert ev["kl"] == pytest.approx(rep["after"]["kl"], rel=1e-4)


def test_resume_continues(pair, tmp_path, capsys):
    d, _, _ = pair
    out = tmp_path / "run"
    first = run(d, out, "draft", "--max-steps", "4")
    assert first["steps"] == 4
    capsys.readouterr()
    second = run(d, out, "draft", "--max-steps", "7")
    log = capsys.readouterr().out
    assert "resuming from" in log and "at step 4" in log and "reusing 32 samples" in log
    assert second["steps"] == 7 and second["before"] == first["before"]
    assert (out / "final" / "config.json").exists()
    steps = [int(r.split(",")[0]) for r in (out / "losses.csv").read_text().splitlines()[1:]]
    assert steps == sorted(steps) and steps[-1] == 5
