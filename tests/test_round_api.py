"""The round API is what a method is written against: a toy method defined here, in one class, drafts
only (``Chain`` of uniform drafts) and leaves verification and commit + cache rollback to
``ctx.verify`` / ``ctx.accept``; it is exact by the harness (and a one-line break of its verdict is
caught by it). ``ctx.accept`` also commits verdicts whose tokens are not a prefix of the stream
(``Verdict.at``, ``count``) and keeps the fed-block slots ``keep`` in the target cache: the hooks a 2-D
method (several image rows in flight) builds on."""

from dataclasses import dataclass, field

import pytest
import torch
from exactness import check_method

import specvis as sv
from specvis.methods.base import DecodeContext
from specvis.methods.verdicts import Chain, Verdict
from specvis.methods.views import guided_view
from specvis.models.base import Condition


@dataclass(frozen=True)
class UniformDraft:
    """Toy lossless method: ``gamma`` drafts per round drawn uniformly over the image codes (no draft
    model), verified by its rule. ``broken``: the verdict keeps the rejected draft instead of the
    residual token (the bug the harness must catch)."""

    gamma: int = 2
    acceptance: object = field(default_factory=sv.Exact)
    broken: bool = False
    name = "uniform-draft"
    lossless = True

    @property
    def pad(self) -> int:
        return self.gamma + 2

    def decode(self, ctx: DecodeContext) -> None:
        g, gen = self.gamma, ctx.generator
        B, codes = ctx.n.shape[0], ctx.layout.vocab_size
        q = torch.zeros(B, g, ctx.V, device=ctx.device)
        q[..., :codes] = 1.0 / codes
        ctx.accept(Verdict.sampled(ctx.target.prefill().sample(gen)))

        def round_() -> None:
            n = ctx.n.clone()
            drafts = torch.randint(codes, (B, g), generator=gen, device=ctx.device)
            fed = torch.cat([ctx.tokens.gather(1, (n - 1)[:, None]), drafts], 1)
            verdict = ctx.verify(ctx.target.forward(fed, ctx.positions(n - 1, g + 1)), Chain(drafts, q))
            if self.broken:
                verdict = Verdict(verdict.accepted, torch.cat([drafts, verdict.block[:, -1:]], 1))
            ctx.accept(verdict)

        ctx.run(round_)


@pytest.mark.parametrize("gamma", [1, 3])
def test_a_method_written_against_the_round_api_is_exact(target, gamma):
    sampling = sv.Sampling(temperature=0.9, cfg_scale=2.0, noise="stream")
    assert check_method(target, UniformDraft(gamma), sampling) > 1e-3
    assert check_method(target, UniformDraft(gamma, broken=True), sampling) < 1e-6


def _ctx(target, B: int = 2) -> DecodeContext:
    view = guided_view(target, Condition.of(target, torch.arange(B) % 3), sv.Sampling(cfg_scale=2.0, noise="stream"), 4)
    return DecodeContext(view, torch.Generator().manual_seed(0), 4)


def test_accept_commits_at_stream_positions_and_keeps_the_given_slots(target):
    """Row 0 commits 2 tokens at stream positions 3 and 1 (not a prefix), row 1 only the first of its
    block (``count``); ``filled`` marks them, ``n`` counts them, the accept map holds the block size.
    With ``keep``, the target cache keeps ``count`` fed slots (its length moves by ``count``)."""
    ctx = _ctx(target)
    ctx.target.prefill()
    length = target.cache.length.clone()
    verdict = Verdict(torch.tensor([1, 0]), torch.tensor([[2, 1], [3, 0]]), keep=torch.tensor([[0, 2], [1, 0]]),
                      count=torch.tensor([2, 1]), at=torch.tensor([[3, 1], [0, 2]]))
    assert ctx.accept(verdict).tolist() == [2, 1]
    assert ctx.n.tolist() == [2, 1]
    assert ctx.tokens[0, [3, 1]].tolist() == [2, 1] and ctx.tokens[1, 0].item() == 3
    assert ctx.filled[:, : ctx.L].tolist() == [[False, True, False, True], [True, False, False, False]]
    assert ctx.accept_map[0, [1, 3]].tolist() == [2, 2] and ctx.accept_map[1, 0].item() == 1
    assert (target.cache.length - length).tolist() == [2, 1, 2, 1]  # both CFG halves of each row


def test_accept_rolls_a_chain_back_in_place(target):
    """Without ``keep``: the target keeps the first ``count`` fed slots (the last committed token is
    never cached: the next round feeds it), and a finished row commits nothing."""
    ctx = _ctx(target)
    ctx.target.prefill()
    prefix = target.cache.length.clone()
    ctx.accept(Verdict.sampled(torch.tensor([1, 2])))
    ctx.target.forward(torch.tensor([[1, 0, 0], [2, 0, 0]]), ctx.positions(ctx.n - 1, 3))
    ctx.accept(Verdict(torch.tensor([2, 0]), torch.tensor([[0, 0, 3], [1, 0, 0]])))
    assert ctx.n.tolist() == [4, 2] and ctx.tokens[:, :4].tolist() == [[1, 0, 0, 3], [2, 1, 0, 0]]
    assert (target.cache.length - prefix).tolist() == [3, 1, 3, 1]
    assert ctx.accept(Verdict(torch.tensor([3, 3]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1]]))).tolist() == [0, 2]
