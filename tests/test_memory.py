"""Memory planned before work (``specvis.memory``, ``Pipeline.memory``): the KV bytes a plan counts
are the bytes the caches allocate, a call that does not fit a (simulated) budget stops before any
forward with one line, ``max_batch_size`` is the largest batch that fits, and the CLI stops a huge
batch the same way."""

from __future__ import annotations

import pytest
import torch

import specvis as sv
from specvis import memory
from specvis.families.prompts import token_ids
from specvis.models.base import storage_dtype


def issue_formula(model, rows: int, slots: int) -> int:
    """layers x 2 x kv heads x head dim x slots x rows x the stored dtype's size, from the model's
    own configuration (not through ``cache_geometry``)."""
    cfg = model.config
    layers, heads = cfg.n_layer, cfg.n_kv_head
    head_dim = cfg.dim // cfg.n_head
    p = next(model.parameters())
    size = torch.empty(0, dtype=storage_dtype(p.dtype, p.device)).element_size()
    return layers * 2 * heads * head_dim * slots * rows * size


def allocated(model) -> int:
    return model.cache.k.numel() * model.cache.k.element_size() * 2


@pytest.mark.parametrize("name, dtype, method, kw", [
    ("emoji", "fp32", sv.SJD(window=16), {"classes": [0, 3]}),
    ("emoji", "bf16", sv.Speculative(gamma=3), {"classes": [1, 2, 5]}),
    ("emoji-t2i", "fp32", sv.SJD(window=8), {"prompts": ["grinning face", "red apple"]}),
    ("emoji-t2i", "bf16", sv.AR(), {"prompts": ["cat"]}),
])
def test_planned_kv_bytes_are_the_allocated_bytes(name, dtype, method, kw):
    """After a call, the target's cache holds exactly the bytes the formula gives for the plan's rows
    and slots (CFG rows, prompt + stream + the method's slots, fp32 storage of a bf16 model on CPU),
    and the plan's KV total is the target's plus the draft's and the EAGLE head's. Catches: a
    factor 2 (keys and values) lost, CFG rows not doubled, the method's slots left out, the bf16 size
    used for a cache the CPU stores in fp32."""
    pipe = sv.load(name, dtype=dtype)
    out = pipe(method=method, decode=False, **kw)
    B = out.tokens.shape[0]
    t = pipe.target
    width = t.cache.slots - t.layout.stream_len - method.pad  # the prompt width this call allocated
    plan = pipe.memory(B, method, prompt_tokens=width)
    assert plan.rows == 2 * B and plan.slots == t.cache.slots
    assert allocated(t) == issue_formula(t, plan.rows, plan.slots)
    assert t.cache_geometry(plan.rows, width, method.pad).nbytes(next(t.parameters()).dtype, "cpu") == allocated(t)
    if isinstance(method, sv.Speculative):
        assert allocated(pipe.draft) == issue_formula(pipe.draft, plan.rows, plan.slots)
    geoms = [m.cache_geometry(plan.rows, width, method.pad) for m in (pipe.target, pipe.draft, pipe.drafter)]
    assert plan.kv_bytes == sum(g.nbytes(next(m.parameters()).dtype, "cpu")
                                for g, m in zip(geoms, (pipe.target, pipe.draft, pipe.drafter)))
    assert plan.kv_bytes >= allocated(t)


class Forwards:
    """Counts the target's prefill and forward calls."""

    def __init__(self, model, monkeypatch) -> None:
        self.n = 0
        for name in ("prefill", "forward_tokens"):
            original = getattr(model, name)

            def wrapped(*a, _f=original, **k):
                self.n += 1
                return _f(*a, **k)

            monkeypatch.setattr(model, name, wrapped)


@pytest.mark.parametrize("name, kw", [("emoji", lambda n: {"classes": [0] * n}),
                                      ("emoji-t2i", lambda n: {"prompts": ["cat"] * n})])
def test_a_call_that_does_not_fit_stops_before_any_forward(monkeypatch, name, kw):
    """With a simulated budget that holds 3 samples, a call of 4 stops in one line naming the bytes
    needed, the bytes free and the largest batch (3) before any forward; a call of 3 runs. Catches:
    the check skipped or inverted, the largest batch off by one."""
    pipe = sv.load(name)
    method = sv.SJD(window=16)
    widest = len(token_ids(pipe, ["cat"], "prompts", *pipe.grid)[0]) if name == "emoji-t2i" else None
    p3 = pipe.memory(3, method, prompt_tokens=widest)
    p4 = pipe.memory(4, method, prompt_tokens=widest)
    budget = (p3.needed_bytes + p4.needed_bytes) // 2
    monkeypatch.setattr(memory, "free_bytes", lambda device: budget)
    forwards = Forwards(pipe.target, monkeypatch)
    with pytest.raises(memory.MemoryPlanError) as e:
        pipe(method=method, decode=False, **kw(4))
    msg = str(e.value)
    assert "\n" not in msg and forwards.n == 0
    assert f"needs {p4.needed_bytes} bytes" in msg and f"has {budget} bytes" in msg
    assert msg.endswith("the largest batch that fits is 3")
    plan = pipe.memory(3, method, prompt_tokens=widest)
    assert plan.fits and plan.max_batch_size == 3 and not pipe.memory(4, method, prompt_tokens=widest).fits
    pipe(method=method, decode=False, **kw(3))
    assert forwards.n > 0


def test_max_batch_size_is_the_largest_that_fits(monkeypatch):
    """For several budgets, ``max_batch_size`` fits and one more does not."""
    pipe = sv.load("emoji")
    method = sv.SJD(window=32)
    for budget in (10**8, 4 * 10**8 + 12345, 2 * 10**9):
        monkeypatch.setattr(memory, "free_bytes", lambda device, b=budget: b)
        m = pipe.memory(1, method).max_batch_size
        assert m >= 1
        assert pipe.memory(m, method).fits and not pipe.memory(m + 1, method).fits


def test_cli_stops_a_huge_batch_in_one_line(tmp_path, capsys, monkeypatch):
    """``specvis generate --num 100000`` and ``specvis sample --batch-size 100000`` exit 2 with the
    plan's one line (no traceback, no allocation failure, nothing written) on a machine with 2 GiB
    free (simulated: a real machine may hold 100,000 rows of this tiny model); ``-v`` prints the plan."""
    from specvis.cli import main

    monkeypatch.setattr(memory, "free_bytes", lambda device: 2 * 2 ** 30)
    assert main(["generate", "--model", "random-tiny", "--num", "100000", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs" in err[0] and "the largest batch that fits is" in err[0]
    assert not (tmp_path / "g").exists()
    assert main(["sample", "--model", "random-tiny", "-n", "200000", "--batch-size", "100000",
                 "--out", str(tmp_path / "s")]) == 2
    assert "the largest batch that fits is" in capsys.readouterr().err
    assert main(["generate", "--model", "random-tiny", "--num", "2", "--method", "ar", "-v",
                 "--out", str(tmp_path / "v")]) == 0
    assert "memory plan on cpu: weights" in capsys.readouterr().out


def test_bad_batch_size_is_a_one_line_error():
    pipe = sv.load("random-tiny")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            pipe.memory(bad)
