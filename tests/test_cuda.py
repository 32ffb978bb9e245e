"""On a GPU (skipped without CUDA): captured rounds replay exactly what eager rounds compute, for
every method, and the exactness harness passes with graphs on, in fp32 and in bf16 (a bf16 model's
law is the law of its own bf16 logits, enumerated from that model)."""

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["ar", "speculative", "sjd", "eagle"])
def test_exact_with_graphs(name, dtype):
    target, draft, drafter = _models(dtype)
    method = {"ar": sv.AR(), "speculative": sv.Speculative(3), "sjd": sv.SJD(window=3, init="vertical-sample"),
              "eagle": sv.EagleTree(depth=2, top_k=2, total_tokens=4)}[name]
    assert check_method(target, method, CFG, draft=draft, drafter=drafter) > 1e-3
