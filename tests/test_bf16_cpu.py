"""bf16 on CPU (``sv.load(..., dtype="bf16")``, ``--dtype bf16``): where the CPU has bf16 dot products
its forward cost curve is flatter than fp32's (docs/results/archive/bf16-cpu.md), so this is a dtype users
run for speed. Every step of these methods runs with bf16 weights on the CPU (there the KV cache stays
float32, ``storage_dtype``: a block not cast on write, or a query not cast for attention, fails here),
and the output law passes the chi-square harness against the law enumerated from the same bf16 model.

What "exact" means in bf16: the law of a position depends, at rounding level, on the block it is
computed in (docs/results/archive/bf16-cpu.md measures it on the emoji target); 20,000 samples cannot see
that, and the harness checks the same things as in fp32 (a wrong residual, position or bonus token)."""

import pytest
import torch
from exactness import CPU_METHODS as METHODS, CPU_SAMPLING as SAMPLING, check_method, cpu_models, tiny_llamagen

import specvis as sv
from specvis import cpu_features
from specvis.models.continuous import ContinuousAR
from specvis.models.drafter import EagleDrafter


@pytest.fixture(scope="module")
def bf16_models():
    return cpu_models(torch.bfloat16)  # the CPU layout sv.load gives (Pipeline.configure)


@pytest.mark.parametrize("name", list(METHODS))
def test_bf16_cpu_passes_the_harness(bf16_models, name):
    target, draft, drafter = bf16_models
    assert next(target.parameters()).dtype == torch.bfloat16
    assert check_method(target, METHODS[name], SAMPLING, draft=draft, drafter=drafter) > 1e-3


def test_bf16_pipeline_generates_in_bf16():
    """``sv.load(dtype="bf16")`` puts the target, draft and drafter in bf16 and a default-method run
    completes with in-range tokens."""
    pipe = sv.load("emoji", dtype="bf16", threads=1)
    for m in (pipe.target, pipe.draft, pipe.drafter):
        assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    out = pipe([0, 5], method=sv.SJD(window=16, init="vertical-sample", coupling="gumbel"), seed=1)
    assert out.tokens.shape == (2, pipe.target.layout.num_tokens)
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < pipe.target.layout.vocab_size


def test_rope_tables_stay_float32_under_casts():
    """A bf16 cast keeps every RoPE table float32 with the fp32 values (``Float32Rope``; LlamaGen keeps
    its freqs_cis float32 too): a table rounded to bf16 would rotate every query and key by up to
    2^-9 of cos / sin. Catches a family whose table follows the cast."""
    from test_cspd import tiny_config

    for model in (tiny_llamagen(0), EagleDrafter.from_target(tiny_llamagen(0), seed=1), ContinuousAR(tiny_config())):
        table = model.rope.clone()
        assert table.dtype == torch.float32
        model.to(torch.bfloat16)
        assert next(model.parameters()).dtype == torch.bfloat16
        assert model.rope.dtype == torch.float32 and torch.equal(model.rope, table), type(model).__name__
        model.half().float()
        assert torch.equal(model.rope, table)


def test_cpu_cache_of_a_bf16_model_is_float32():
    """On CPU a bf16/fp16 model keeps its KV cache in float32 (``storage_dtype``: bf16 attention over one
    query is slower there); elsewhere, and for fp32 models, the cache takes the model's dtype."""
    from specvis.models.base import storage_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert storage_dtype(torch.bfloat16, cpu) == storage_dtype(torch.float16, cpu) == torch.float32
    assert storage_dtype(torch.bfloat16, cuda) == torch.bfloat16 and storage_dtype(torch.float32, cpu) == torch.float32
    target = tiny_llamagen(0).to(torch.bfloat16)
    target.setup_cache(2, 4)
    target.prefill(torch.tensor([0, 1]))
    assert target.cache.k.dtype == torch.float32
    logits, _ = target.forward_tokens(torch.tensor([[1], [2]]), torch.zeros(2, 1, dtype=torch.long))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.mark.parametrize("flags, warns", [(frozenset({"avx2", "fma"}), True),
                                          (frozenset({"avx2", "avx512_bf16"}), False),
                                          (None, False)])
def test_bf16_on_a_cpu_without_bf16_dot_products_warns(monkeypatch, recwarn, flags, warns):
    """On a CPU whose flags lack bf16 dot products (an AVX2-only EPYC measured 3-18x slower in bf16
    than fp32) ``sv.load(dtype="bf16")`` warns and names fp32; with avx512_bf16, or flags unknown,
    it stays silent. Catches: the warning lost, or given on every CPU (users told off a faster dtype)."""
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: flags)
    sv.load("random-tiny", dtype="bf16")
    said = [str(w.message) for w in recwarn if "dot products" in str(w.message)]
    assert (len(said) == 1) == warns, said
    if warns:
        assert "bfloat16" in said[0] and "avx512_bf16" in said[0] and "use fp32" in said[0]


def test_cpu_flags_read_the_x86_and_arm_spellings(monkeypatch, tmp_path):
    """``cpu_flags`` reads x86's "flags" and Arm's "Features" line; fp32 is always native."""
    import builtins

    real_open = builtins.open
    for text, want in (("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n", True),
                       ("processor\t: 0\nFeatures\t: fp asimd asimdhp\n", False)):
        (tmp_path / "cpuinfo").write_text(text)
        monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(tmp_path / "cpuinfo" if p == "/proc/cpuinfo" else p, *a, **k))
        cpu_features.cpu_flags.cache_clear()
        assert cpu_features.native_dot_products(torch.bfloat16) is want
        assert cpu_features.native_dot_products(torch.float16) is (not want)
        assert cpu_features.native_dot_products(torch.float32) is True
    monkeypatch.setattr(builtins, "open", real_open)
    cpu_features.cpu_flags.cache_clear()


def test_cpu_name_gives_the_x86_family_and_model(monkeypatch, tmp_path):
    """Two EPYCs a hypervisor names alike (family 25, Zen 4; family 26, Zen 5) are told apart in
    ``device_name``, so a resumed benchmark does not reuse a cost curve measured on the other."""
    import builtins

    real_open = builtins.open
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(cpuinfo if p == "/proc/cpuinfo" else p, *a, **k))
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n")
    assert cpu_features.cpu_name() == "AMD EPYC (family 26 model 2)"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert cpu_features.cpu_name() == "Some CPU"


def test_cpu_description_names_the_model_level_and_bf16(monkeypatch):
    """What bench reports record as ``device_name`` (and compare before reusing a cost curve): two
    CPUs that differ in bf16 dot products are told apart, where "x86_64" made them one."""
    monkeypatch.setattr(cpu_features, "cpu_name", lambda: "AMD EPYC")
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2"}))
    plain = cpu_features.cpu_description()
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert plain.startswith("AMD EPYC, ") and "bf16" not in plain
    assert cpu_features.cpu_description() == plain + ", bf16 dot products"
