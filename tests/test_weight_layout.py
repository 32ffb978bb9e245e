"""CPU layouts of linear weights (models/weight_layout.py): same values and outputs, other kernels."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from specvis import load
from specvis.models.weight_layout import (PACKED_AVAILABLE, PACKED_MIN_ROWS, PackedLinear, prepare_cpu_linears,
                                          transpose_linear_weights)

needs_packed = pytest.mark.skipif(not PACKED_AVAILABLE, reason="this torch build has no packed oneDNN linear")


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.proj = nn.Linear(6, 5)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied output head


def test_layout_keeps_values_and_outputs_and_skips_tied_weights():
    torch.manual_seed(0)
    m = Tied()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(3, 6)
    y = m.proj(x)
    assert transpose_linear_weights(m) == 1  # proj only: head shares the embedding's weight
    assert m.proj.weight.stride() == (1, 5) and m.head.weight.is_contiguous()
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    torch.testing.assert_close(m.proj(x), y)
    assert transpose_linear_weights(m) == 0  # idempotent


def packed(in_features: int = 24, out_features: int = 40, bias: bool = True, dtype=torch.float32) -> PackedLinear:
    torch.manual_seed(0)
    lin = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    prepare_cpu_linears(lin)
    return lin


@needs_packed
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_f_linear_at_every_row_count(dtype, bias):
    """Every row count (both kernels), 2-D and 3-D inputs, with and without bias: the output is
    F.linear's up to rounding. A dropped bias or a weight packed transposed fails here."""
    lin = packed(bias=bias, dtype=dtype)
    assert type(lin) is PackedLinear
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for rows in range(1, 13):
        for shape in ((rows, 24), (2, rows, 24)):
            x = torch.randn(shape, dtype=dtype)
            with torch.inference_mode():
                y = lin(x)
            ref = torch.nn.functional.linear(x.float(), lin.weight.float(), None if lin.bias is None else lin.bias.float())
            torch.testing.assert_close(y.float(), ref, **tol)
    assert lin._packed_key is not None  # the packed kernel ran


@needs_packed
def test_fp32_calls_under_the_row_threshold_stay_on_f_linear():
    lin = packed()
    with torch.no_grad():
        lin(torch.randn(PACKED_MIN_ROWS[torch.float32] - 1, 24))
        assert lin._packed_key is None
        lin(torch.randn(PACKED_MIN_ROWS[torch.float32], 24))
        assert lin._packed_key is not None


@needs_packed
def test_packed_copy_follows_in_place_updates_and_casts():
    """A weight changed in place (an optimiser step) or cast to another dtype is repacked before the
    next call: a stale packed copy would return the old layer's outputs."""
    lin = packed()
    x = torch.randn(8, 24)
    with torch.no_grad():
        lin(x)
        lin.weight.mul_(2.0)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
    lin.to(torch.bfloat16)
    with torch.no_grad():
        y = lin(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), torch.nn.functional.linear(x, lin.weight.float(), lin.bias.float()),
                               rtol=5e-2, atol=5e-2)


@needs_packed
def test_packed_linear_copies_and_pickles():
    """``copy.deepcopy`` and ``torch.save`` of a layer that has run packed (a trainer's EMA copy, a
    saved module) work, and the copy computes what the original does."""
    import copy
    import io

    lin = packed()
    x = torch.randn(8, 24)
    with torch.no_grad():
        y = lin(x)
        twin = copy.deepcopy(lin)
        buf = io.BytesIO()
        torch.save(lin, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        for m in (twin, loaded):
            assert type(m) is PackedLinear
            torch.testing.assert_close(m(x), y)


@needs_packed
def test_packed_linear_trains_through_autograd():
    """With autograd on, the layer is plain F.linear: gradients reach its weight and bias."""
    lin = packed()
    x = torch.randn(16, 24)
    lin(x).sum().backward()
    assert lin.weight.grad is not None and lin.bias.grad is not None
    torch.testing.assert_close(lin.bias.grad, torch.full((40,), 16.0))


def test_load_on_cpu_prepares_the_target_drafter_and_draft_linears():
    pipe = load("random-tiny")
    for model in (pipe.target, pipe.draft, pipe.drafter):
        linears = [s for s in model.modules() if isinstance(s, nn.Linear)]
        assert linears and any(not s.weight.is_contiguous() for s in linears)
        for s in linears:
            w = s.weight
            assert w.is_contiguous() or w.stride() == (1, w.shape[0])
            assert type(s) is (PackedLinear if PACKED_AVAILABLE else nn.Linear)
    assert any(pipe.drafter.head is s for s in pipe.target.modules())  # the borrowed head stays the target's


@needs_packed
def test_packing_stops_at_the_memory_budget_in_module_order():
    """Layers are packed in order while their weights fit the budget; the rest stay nn.Linear with a
    warning. A guard that packed everything would double a large checkpoint's weight memory."""
    torch.manual_seed(0)
    first, second = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), nn.Linear(8, 8)  # 256 bytes each
    with pytest.warns(UserWarning, match="packed 2 of 3"):
        assert prepare_cpu_linears(first, second, budget_bytes=600) == 2
    assert [type(s) for s in (*first, second)] == [PackedLinear, PackedLinear, nn.Linear]
    assert not second.weight.is_contiguous()  # transposed all the same
    shared = nn.Linear(8, 8)  # one layer in two modules: packed and budgeted once, so no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_cpu_linears(nn.Sequential(shared), nn.Sequential(shared), budget_bytes=256) == 1


@needs_packed
def test_load_packs_nothing_when_available_memory_is_short(monkeypatch):
    """The pipeline budgets its packed copies against the memory available at load (half of it)."""
    import specvis.models.weight_layout as layout

    monkeypatch.setattr(layout, "available_memory_bytes", lambda: 1000)
    with pytest.warns(UserWarning, match="packed 0 of"):
        pipe = load("random-tiny")
    assert not any(type(s) is PackedLinear for s in pipe.target.modules())


@needs_packed
@pytest.mark.parametrize("name", ["speculative", "sjd", "static-tree"])
def test_methods_on_packed_fp32_layers_pass_the_harness(name):
    """The exactness harness on float32 models prepared as ``sv.load`` prepares them on CPU: its
    batches of many rows send every forward of the target, draft and drafter through the packed
    kernel (one- to three-row calls aside). A packed kernel that mixed the batch's rows moves the
    output law (a planted row reversal fails here: scripts/mutants.py)."""
    import specvis as sv
    from exactness import check_method, cpu_models

    target, draft, drafter = cpu_models()
    assert all(type(s) is PackedLinear for m in (target, draft, drafter) for s in m.modules() if isinstance(s, nn.Linear))
    method = {"speculative": sv.Speculative(3), "sjd": sv.SJD(window=3, init="vertical-sample", coupling="gumbel"),
              "static-tree": sv.StaticTree(tree="chain")}[name]
    sampling = sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream")
    assert check_method(target, method, sampling, draft=draft, drafter=drafter) > 1e-3
