"""CPU layout of linear weights (models/weight_layout.py): same values and outputs, other strides."""
from __future__ import annotations

import torch
from torch import nn

from specvis import load
from specvis.models.weight_layout import transpose_linear_weights


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


def test_load_on_cpu_transposes_the_target_drafter_and_draft_linears():
    pipe = load("random-tiny")
    for model in (pipe.target, pipe.draft, pipe.drafter):
        linears = [s for s in model.modules() if isinstance(s, nn.Linear)]
        assert linears and any(not s.weight.is_contiguous() for s in linears)
        for s in linears:
            w = s.weight
            assert w.is_contiguous() or w.stride() == (1, w.shape[0])
