"""Weight-only int8 (``sv.load(..., quantize="int8")``, ``specvis.models.quantize``): the quantized
model is a model of its own and every method is exact with respect to it (the chi-square harness on
quantized tiny models, the law enumerated from the same quantized model); a checkpoint directory
quantizes while it streams and gives the same int8 layers as quantizing after a float load."""

from __future__ import annotations

import pytest
import torch
from exactness import CPU_METHODS as METHODS, CPU_SAMPLING as SAMPLING, check_method, cpu_models

import specvis as sv
from specvis.models.quantize import Int8Linear, int8_rows, quantize_linears


@pytest.fixture(scope="module")
def int8_models():
    target, draft, drafter = cpu_models(torch.float32)
    assert quantize_linears(target) == 2 * 5 and quantize_linears(draft) == 5
    return target, draft, drafter


@pytest.mark.parametrize("name", list(METHODS))
def test_methods_are_exact_for_the_quantized_model(int8_models, name):
    """Every block linear of target and draft is int8; the methods' output law passes the harness
    against the law enumerated from the same quantized model (batches of 10,000 rows mixing
    conditions, blocks of 1 to 4 tokens). Catches: an int8 product whose rows depend on other rows
    or positions of the block (a reshape that mixes them), a scale applied to the wrong axis in one
    kernel path only."""
    target, draft, drafter = int8_models
    assert all(not isinstance(m, torch.nn.Linear) for n, m in target.named_modules() if n.startswith("layers."))
    assert check_method(target, METHODS[name], SAMPLING, draft=draft, drafter=drafter) > 1e-3


@pytest.mark.parametrize("width", [48, 40])  # bf16 at 40: the per-call dequantised path (BF16_K_MULTIPLE)
def test_int8_rows_round_trip_and_product(width):
    """q s reproduces W within half a step of its row (s_r / 2), and the layer's product equals x (q s)^T
    for 3-D inputs, fp32 and bf16 activations, each row computed independently (token by token alike)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, width, generator=g) * torch.linspace(0.1, 3.0, 48)[:, None]
    w[5] = 0.0
    q, s = int8_rows(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127 and s[5] == 1.0
    assert bool(((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all())
    lin = torch.nn.Linear(width, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(w)
    layer = Int8Linear.of(lin)
    for dtype, tol in ((torch.float32, dict(rtol=1e-4, atol=1e-4)), (torch.bfloat16, dict(rtol=2e-2, atol=0.1))):
        x = torch.randn(3, 7, width, generator=g).to(dtype)
        ref = x.float() @ (q.float() * s[:, None]).t() + lin.bias.detach()
        with torch.inference_mode():
            y = layer.to(dtype)(x)
            one = torch.cat([layer(x[:, j: j + 1]) for j in range(7)], 1)  # token by token
        assert y.dtype == dtype and y.shape == (3, 7, 48)
        torch.testing.assert_close(y.float(), ref, **tol)
        torch.testing.assert_close(one.float(), y.float(), **tol)
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_scale.dtype == torch.float32  # casts leave them


def test_streamed_quantization_equals_quantizing_after_a_float_load(tmp_path):
    """A sharded checkpoint loaded with quantize="int8" holds, in every block linear, the int8 rows and
    scales of the float weight it streamed (so it never held the float block weights); the loaded
    model equals a float load quantized afterwards, and its summary records int8."""
    from hf_tiny import make_janus

    d = make_janus(tmp_path / "janus", shards=True)
    streamed = sv.load(str(d), quantize="int8")
    after = sv.load(str(d))
    quantize_linears(after.target)
    a, b = dict(streamed.target.named_buffers()), dict(after.target.named_buffers())
    assert sorted(a) == sorted(b) and any(k.endswith("weight_int8") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert streamed.extras["quantize"] == "int8"
    assert not any(isinstance(m, torch.nn.Linear) for n, m in streamed.target.named_modules() if n.startswith("layers."))
    out = streamed(prompts=["a cat"], method=sv.SJD(window=4), seed=0, decode=False)
    assert out.tokens.shape == (1, streamed.target.layout.num_tokens)


def test_bad_quantize_is_a_one_line_error():
    with pytest.raises(ValueError, match="quantize must be one of int8"):
        sv.load("random-tiny", quantize="int4")
    from specvis.cli import main

    assert main(["generate", "--model", "random-tiny", "--quantize", "int4"]) == 2
