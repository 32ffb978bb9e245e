"""Captured rounds need state that stays put: every method must update the cache lengths and its
buffers in place (a CUDA graph replays on the tensors it captured). Checked on CPU here by tensor
identity and storage; tests/test_cuda.py checks graph replay against eager on a GPU."""

import pytest
import torch
from exactness import tiny_llamagen
from test_oracle import METHODS

import specvis as sv
from specvis.methods import rounds
from specvis.models.drafter import EagleDrafter


@pytest.fixture(scope="module")
def models():
    target = tiny_llamagen(0, vocab=8, grid=4)
    return target, tiny_llamagen(1, vocab=8, grid=4, dim=16, n_layer=1), EagleDrafter.from_target(target, seed=1).eval()


@pytest.mark.parametrize("name", ["ar", "speculative_g3", "jacobi_w4", "sjd_vertical-sample", "eagle", "adt_horizontal",
                                  "static_tree"])
def test_cache_state_is_updated_in_place(models, name, monkeypatch):
    """The committed length tensors of the target, draft and drafter caches are the ones set up
    before decoding (by ``setup_cache``, or by the prefill that sizes the cache to the prompt): same
    object, same storage, when decoding ends."""
    target, draft, drafter = models
    method, sampling = METHODS[name]
    seen = {}
    for m in (target, draft, drafter):
        for hook in ("setup_cache", "prefill"):
            if not hasattr(type(m), hook):
                continue
            original = getattr(type(m), hook)

            def wrapped(self, *a, _original=original, **k):
                out = _original(self, *a, **k)
                if self.cache is not None:
                    seen.setdefault(id(self), []).append((self, self.cache.length, self.cache.length.data_ptr()))
                return out

            monkeypatch.setattr(type(m), hook, wrapped)
    sv.generate(target, torch.arange(4) % 3, method, sampling, seed=0, draft=draft, drafter=drafter)
    assert seen
    for entries in seen.values():
        model, length, ptr = entries[-1]
        assert model.cache.length is length and length.data_ptr() == ptr


def test_round_runner_counts_rounds_on_cpu():
    """``rounds=`` runs exactly that many rounds with no done-check; otherwise until done."""
    calls = []

    class Ctx:
        device = torch.device("cpu")
        counted = []
        max_rounds = 10

        def live_caches(self):
            return []

        def done(self):
            return len(calls) >= 3

        def report_progress(self):
            pass

    rounds.run_rounds(Ctx(), lambda: calls.append(1), graphs=True, rounds=5)
    assert len(calls) == 5
    calls.clear()
    rounds.run_rounds(Ctx(), lambda: calls.append(1), graphs=True)
    assert len(calls) == 3


@pytest.mark.parametrize("name", ["ar", "sjd_random", "speculative_g1"])
def test_progress_reports_every_round(models, name):
    """generate(progress=) hears the committed fraction after every round: nondecreasing, ending at 1,
    one call per round (AR: one per token), and the tokens are those of a run without it."""
    target, draft, drafter = models
    method = METHODS[name][0]
    kw = dict(draft=draft, drafter=drafter) if name != "ar" else {}
    seen = []
    cond, sampling = torch.arange(4) % 3, sv.Sampling(cfg_scale=2.0, noise="stream")
    out = sv.generate(target, cond, method, sampling, seed=2, progress=seen.append, **kw)
    ref = sv.generate(target, cond, method, sampling, seed=2, **kw)
    assert torch.equal(out.tokens, ref.tokens)
    assert seen == sorted(seen) and seen[-1] == 1.0 and seen[0] < 1.0
    if name == "ar":
        assert len(seen) == target.layout.stream_len  # L - 1 rounds (the prefill gives the first token): before each, after the last


@pytest.mark.parametrize("name", ["ar", "static_tree"])
def test_what_generate_returns_is_an_ordinary_tensor(models, name):
    """The decode runs under ``torch.inference_mode``; the tokens and stats it returns must be ordinary
    tensors, which a user can edit in place and train on (an inference tensor raises on both)."""
    target, draft, drafter = models
    method, sampling = METHODS[name]
    out = sv.generate(target, torch.arange(4) % 3, method, sampling, seed=0, draft=draft, drafter=drafter)
    for t in (out.tokens, out.stats.accept_map):
        assert not t.is_inference()
        t += 0
