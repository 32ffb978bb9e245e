"""A drafter is a proposer: the server's auto method is a switch between AR's and SJD's proposers over the
one chain loop (``methods/proposer.py``), so a decode whose every round is one method's is that method's
decode, token for token and forward for forward."""

from __future__ import annotations

import pytest
import torch

import specvis as sv
from exactness import CPU_SAMPLING, tiny_llamagen
from specvis.generate import bind_rule, fit_to_stream, keyed_method
from specvis.methods.base import DecodeContext
from specvis.methods.views import guided_view
from specvis.models.base import Condition
from specvis.sampling import make_generator
from specvis.serve.switch import Switching

WINDOW = 3


def decoded(model, method, sampling, seed: int) -> tuple[torch.Tensor, dict[int, int]]:
    """(tokens, target forwards by block size) of ``method`` on classes 0, 1, 2 at ``seed``, set up as the
    server sets a decode up (``serve.engine.decode_live``, without live rows)."""
    method = keyed_method(fit_to_stream(method, model.layout.stream_len), sampling)
    target = guided_view(model, Condition.of(model, torch.tensor([0, 1, 2])), sampling, method.pad)
    ctx = DecodeContext(target, make_generator(seed, "cpu"), method.pad, rule=bind_rule(method.acceptance, None, model),
                        seeds=[seed, seed + 1, seed + 2] if sampling.keyed else None,
                        coupled="noise" in method.acceptance.needs if method.acceptance is not None else False)
    with torch.inference_mode():
        method.decode(ctx)
    return ctx.tokens[:, : ctx.L].clone(), dict(target.sizes)


def test_auto_choosing_sjd_every_round_is_sjd():
    """Every round SJD's: the same tokens and target forwards (by block size) as SJD with auto's window,
    random init and gumbel coupling, at the same seed."""
    model = tiny_llamagen(3, grid=3)
    for seed in range(3):
        switched = decoded(model, Switching(lambda: "sjd", window=WINDOW), CPU_SAMPLING, seed)
        assert [torch.equal(a, b) if torch.is_tensor(a) else a == b
                for a, b in zip(switched, decoded(model, sv.SJD(window=WINDOW, init="random", coupling="gumbel"),
                                                  CPU_SAMPLING, seed))] == [True, True]


@pytest.mark.parametrize("noise", ["stream", "keyed"])
def test_auto_choosing_ar_every_round_is_ar(noise):
    """Every round AR's: one target forward per token, each feeding one token; under keyed noise AR's very
    tokens (the window auto keeps ready draws from the generator, so under stream noise the tokens are
    AR's in law only). Catches a switch that ignores the choice."""
    model = tiny_llamagen(3, grid=3)
    sampling = sv.Sampling(**{**vars(CPU_SAMPLING), "noise": noise})
    for seed in range(3):
        tokens, sizes = decoded(model, Switching(lambda: "ar", window=WINDOW), sampling, seed)
        assert sizes == {1: model.layout.stream_len}
        if noise == "keyed":
            assert torch.equal(tokens, decoded(model, sv.AR(), sampling, seed)[0])


def test_a_mar_model_runs_only_the_methods_that_declare_its_order():
    """``generate`` asks the method (``model_order``: AR and CSpD) and refuses any other on a model that
    reveals its tokens in its own order, naming it, before a view is built."""
    from test_cspd_mar import random_mar

    from specvis.families import mar as mar_family

    model = random_mar(0, mixture=False)
    for method in (sv.SJD(), sv.Speculative(2), sv.PJD(), sv.Jacobi()):
        with pytest.raises(ValueError, match=f"method must be AR or CSpD, got {type(method).__name__}$"):
            sv.generate(model, torch.tensor([0, 1]), method, sv.Sampling(temperature=1.0), ordered=mar_family.MARReveal(2))
