"""The text-conditioned core: prompts of their own length per row, the family's unconditional rows,
forced structural tokens (Emu3's row ends) and sampling over the image vocabulary, on tiny random
decoders of both families' shapes (tests/exactness.py ``tiny_prompt_model``; no transformers).

What each test would catch is said in it."""

from __future__ import annotations

import pytest
import torch

import specvis as sv
from exactness import check_method, condition_rows, dependence_on_prompt, tiny_prompt_model
from specvis.models.base import Layout, Prompts

P_MIN = 1e-3
SHAPES = {"janus": dict(janus=True), "emu3": dict(janus=False, row_end=1)}


def test_layout_stream_with_row_ends() -> None:
    lay = Layout(2, 3, 5, row_end=1)
    assert (lay.stride, lay.stream_len, lay.law_size, lay.num_tokens) == (4, 8, 6, 6)
    assert lay.forced().tolist() == [-1, -1, -1, 5, -1, -1, -1, 5]
    assert lay.image_index().tolist() == [0, 1, 2, 4, 5, 6]
    assert Layout(2, 2, 7).forced().tolist() == [-1] * 4


@pytest.mark.parametrize("shape", SHAPES)
def test_cached_path_equals_teacher_forced(shape: str) -> None:
    """Prefill of prompts of different lengths, then stream tokens in two blocks: every logit equals the
    plain causal forward over that row's own prompt (catches a per-row length or position error, a
    padded slot that is attended, a wrong RoPE index after the prompt)."""
    model = tiny_prompt_model(0, **SHAPES[shape])
    prompts = Prompts.of([[1, 5, 3, 2], [1, 8, 2], [1, 4, 4, 6, 7, 2]])
    S = model.layout.stream_len
    stream = torch.randint(0, model.layout.vocab_size, (3, S))
    forced = model.layout.forced()
    stream = torch.where(forced >= 0, forced, stream)
    ref = model.logits(prompts, stream[:, :-1])  # (3, S, V)
    for pad_id in (0, 9):  # the padding's content must not matter
        padded = Prompts(torch.where(torch.arange(6)[None] < prompts.lengths[:, None], prompts.ids, pad_id), prompts.lengths)
        model.setup_cache(3, 4)
        first, _ = model.prefill(padded)
        half = S // 2
        a, _ = model.forward_tokens(stream[:, :half], torch.arange(half)[None].expand(3, -1))
        model.set_committed(torch.full((3,), half))
        b, _ = model.forward_tokens(stream[:, half:-1], torch.arange(half, S - 1)[None].expand(3, -1))
        got = torch.cat([first[:, None], a, b], 1)
        assert (got - ref).abs().max() < 1e-4


@pytest.mark.parametrize("shape", SHAPES)
def test_harness_models_depend_on_prompt_and_prefix(shape: str) -> None:
    """The exactness tests below only see conditioning errors if the law moves with the prompt and with
    earlier image tokens: assert both are large (TV)."""
    prompt, earlier = dependence_on_prompt(tiny_prompt_model(0, **SHAPES[shape]))
    assert prompt > 0.2 and earlier > 0.2, (prompt, earlier)


def test_outputs_drop_structural_tokens_and_count_image_tokens() -> None:
    """tokens (B, H*W) are codes only; Stats.tokens excludes row ends; the heatmap is the image grid."""
    model = tiny_prompt_model(0, janus=False, row_end=1, height=2, width=3)
    out = sv.generate(model, condition_rows(model, [0, 1]), sv.SJD(window=4, init="vertical-sample"),
                      sv.Sampling(cfg_scale=2.0, noise="stream"), seed=0)
    assert out.tokens.shape == (2, 6) and int(out.tokens.max()) < model.layout.vocab_size
    assert out.stats.tokens == 6 and out.stats.accept_map.shape == (2, 2, 3)
    assert int(out.stats.accept_map.min()) >= 1


def test_classes_and_prompts_are_not_interchangeable() -> None:
    text = tiny_prompt_model(0)
    with pytest.raises(ValueError, match="text-conditioned"):
        sv.generate(text, torch.tensor([0, 1]))
    cls = sv.models.LlamaGen(sv.models.LlamaGenConfig(vocab_size=4, dim=32, n_layer=1, n_head=2, num_classes=2,
                                                      block_size=4, multiple_of=16))
    with pytest.raises(ValueError, match="class-conditional"):
        sv.generate(cls, Prompts.of([[1, 2]]))


def test_janus_unconditional_prompt_keeps_bos_and_boi() -> None:
    """Janus's CFG row: every token but BOS (1) and begin-of-image (2) becomes pad (0), same length."""
    model = tiny_prompt_model(0, janus=True)
    u = model.unconditional(Prompts.of([[1, 5, 3, 2], [1, 8, 2]]))
    assert u.ids.tolist() == [[1, 0, 0, 2], [1, 0, 2, 0]] and u.lengths.tolist() == [4, 3]


CFG = sv.Sampling(temperature=1.0, cfg_scale=2.5, top_k=2, noise="stream")
LOSSLESS = [sv.AR()] + [sv.SJD(window=3, init=i) for i in
                        ("random", "horizontal-repeat", "vertical-repeat", "horizontal-sample", "vertical-sample")]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", LOSSLESS + ["speculative"], ids=lambda m: m if isinstance(m, str) else f"{m.name}-{getattr(m, 'init', '')}")
def test_exactness_on_prompt_models(shape: str, method) -> None:
    """Chi-square of the method's output law against the enumerated law of the prompt model (CFG with
    the family's unconditional rows, top-k over the image codes, row ends forced for Emu3's shape):
    catches a wrong prompt row, an unconditional row that is not the family's, a forced token that is
    sampled or drafted against, and every error the harness catches on class-conditional models."""
    model = tiny_prompt_model(0, height=2, width=2, **SHAPES[shape])
    kw = {}
    if method == "speculative":
        method, kw = sv.Speculative(gamma=2), {"draft": tiny_prompt_model(1, height=2, width=2, **SHAPES[shape])}
    assert check_method(model, method, CFG, **kw) > P_MIN


@pytest.mark.parametrize("shape", SHAPES)
def test_jacobi_equals_greedy_ar_on_prompt_models(shape: str) -> None:
    model = tiny_prompt_model(2, height=3, width=3, **SHAPES[shape])
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0, noise="stream")
    rows = condition_rows(model, [0, 1, 2])
    ar = sv.generate(model, rows, sv.AR(), greedy).tokens
    for method in (sv.Jacobi(window=4), sv.SJD(window=4, init="vertical-repeat")):
        assert torch.equal(sv.generate(model, rows, method, greedy).tokens, ar)


@pytest.mark.parametrize("init", ["random", "horizontal-repeat", "vertical-repeat", "horizontal-sample", "vertical-sample"])
def test_sjd_never_drafts_against_a_forced_token(init: str, monkeypatch) -> None:
    """Every window SJD builds holds, at each row-end position, the row-end id drawn from a point mass
    (catches an initialisation that drafts an image code there: still exact, but each row end would
    then cost a rejection)."""
    from specvis.methods import sjd

    model = tiny_prompt_model(0, janus=False, row_end=1, height=3, width=3)
    seen = []
    original = sjd.JacobiWindow.next_window

    def spy(self, p, base, start, first_init, prev=None):
        draft, q = original(self, p, base, start, first_init, prev)
        pos = (start[:, None] + self.slots).clamp_max(self.ctx.forced.shape[0] - 1)
        f = self.ctx.forced[pos]
        at = f >= 0
        seen.append(int(at.sum()))
        assert torch.equal(draft[at], f[at])
        assert torch.equal(q[at], torch.nn.functional.one_hot(f[at], q.shape[-1]).float())
        return draft, q

    monkeypatch.setattr(sjd.JacobiWindow, "next_window", spy)
    sv.generate(model, condition_rows(model, [0, 1, 2]), sv.SJD(window=5, init=init), sv.Sampling(noise="stream"), seed=0)
    assert sum(seen) > 0
