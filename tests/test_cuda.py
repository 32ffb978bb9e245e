"""On a GPU (skipped without CUDA): captured rounds replay exactly what eager rounds compute, for
every method, and the exactness harness passes with graphs on, in fp32 and in bf16 (a bf16 model's
law is the law of its own bf16 logits, enumerated from that model). ADT-Tree's rounds are static-shaped
on CUDA (the schedule as masks): they are captured (no fallback, the graph replays) and replay the
eager static rounds exactly."""

import warnings

import pytest
import torch
from exactness import check_method, tiny_llamagen
from test_oracle import METHODS

import specvis as sv
from specvis.models.drafter import EagleDrafter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CFG = sv.Sampling(temperature=0.7, cfg_scale=2.5)


def _models(dtype=torch.float32):
    target = tiny_llamagen(0).cuda().to(dtype)
    draft = tiny_llamagen(1, dim=16, n_layer=1).cuda().to(dtype)
    return target, draft, EagleDrafter.from_target(target, seed=1).cuda().to(dtype).eval()


@pytest.mark.parametrize("name", list(METHODS))
def test_graphs_replay_eager(name):
    """Same seed, graphs on and off: identical tokens, forward counts and acceptance maps."""
    target = tiny_llamagen(0, vocab=8, grid=4).cuda()
    draft = tiny_llamagen(1, vocab=8, grid=4, dim=16, n_layer=1).cuda()
    drafter = EagleDrafter.from_target(target, seed=1).cuda().eval()
    method, sampling = METHODS[name]
    outs = [sv.generate(target, torch.arange(6) % 3, method, sampling, seed=3, draft=draft, drafter=drafter, graphs=g)
            for g in (False, True)]
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    assert outs[0].stats.target_forwards == outs[1].stats.target_forwards
    assert outs[0].stats.draft_forwards == outs[1].stats.draft_forwards
    assert torch.equal(outs[0].stats.accept_map, outs[1].stats.accept_map)


@pytest.mark.parametrize("init", ["horizontal", "vertical", "random"])
@pytest.mark.parametrize("batch", [1, 4])
def test_adt_rounds_are_captured(init, batch, monkeypatch):
    """ADTTree on CUDA (static_shapes default): graphs on captures its rounds (no capture-failure
    warning, the graph is replayed) and gives the same tokens, forward counts, acceptance map and
    tree statistics as the same static rounds run eagerly; the drafter forwards are the fixed count
    (``levels`` per round). The host-synced rounds (static_shapes=False) are never captured."""
    target = tiny_llamagen(0, vocab=8, grid=4).cuda()
    drafter = EagleDrafter.from_target(target, seed=1).cuda().eval()
    method = sv.ADTTree(init=init, total_tokens=8)
    sampling = sv.Sampling(temperature=1.0, top_k=6, cfg_scale=2.0)
    replays = []
    replay = torch.cuda.CUDAGraph.replay

    def counted(self, *a, **k):
        replays.append(1)
        return replay(self, *a, **k)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    cond = torch.arange(batch, device="cuda") % 3
    outs = {}
    for graphs in (False, True):
        replays.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs[graphs] = sv.generate(target, cond, method, sampling, seed=3, drafter=drafter, graphs=graphs)
        assert not [w for w in caught if "capture failed" in str(w.message)]
        assert bool(replays) == graphs
    a, b = outs[False], outs[True]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.stats.accept_map, b.stats.accept_map)
    sa, sb = a.stats.to_dict(), b.stats.to_dict()
    for key in ("target_forwards", "draft_forwards", "mean_tree_depth", "mean_scheduled_depth"):
        assert sa[key] == sb[key], key
    levels = min(method.depth_range[1] - 1, method.total_tokens - 1)
    assert sb["draft_forwards"] == (sb["target_forwards"] - 1) * levels  # every round but the prefill
    replays.clear()
    host = sv.generate(target, cond, sv.ADTTree(init=init, total_tokens=8, static_shapes=False), sampling, seed=3,
                       drafter=drafter, graphs=True)
    assert not replays and host.stats.to_dict()["mean_tree_depth"] >= 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["ar", "speculative", "sjd", "eagle", "adt"])
def test_exact_with_graphs(name, dtype):
    target, draft, drafter = _models(dtype)
    method = {"ar": sv.AR(), "speculative": sv.Speculative(3), "sjd": sv.SJD(window=3, init="vertical-sample"),
              "eagle": sv.EagleTree(depth=2, top_k=2, total_tokens=4),
              "adt": sv.ADTTree(depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=6)}[name]
    assert check_method(target, method, CFG, draft=draft, drafter=drafter) > 1e-3
