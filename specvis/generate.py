"""``specvis.generate``: run any method on any ``CachedTokenModel`` (token level, no pixels)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .methods.ar import AR
from .methods.base import DecodeContext, GuidedModel, Stats, timed
from .sampling import Sampling, make_generator


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, H*W) image-token ids
    stats: Stats
    images: list = field(default_factory=list)  # PIL images when a pipeline decoded them
    latents: torch.Tensor | None = None  # (B, H*W, C) continuous tokens (continuous-token models)


def check_conditions(model, conditions: torch.Tensor) -> None:
    n = getattr(model, "num_conditions", None)
    if conditions.ndim != 1 or conditions.dtype not in (torch.int32, torch.int64):
        raise ValueError("conditions must be a 1-D integer tensor of class ids")
    if n is not None and conditions.numel() and not bool(((conditions >= 0) & (conditions < n)).all()):
        raise ValueError(f"class ids must be in 0..{n - 1}, got {conditions.tolist()}")


def bind_rule(rule, codebook: torch.Tensor | None, model=None):
    """Rules that need a table expose ``bind(codebook, embeddings=)``: the tokenizer's codebook (LANTERN
    neighbourhoods; GSD's distance with embedding="codebook") or the target's input-embedding table (GSD's
    default distance). Rules say whether they need the codebook (``needs_codebook``, default yes)."""
    if rule is None or not hasattr(rule, "bind"):
        return rule
    if codebook is None and getattr(rule, "needs_codebook", True):
        raise ValueError(f"acceptance rule {rule.name} needs the tokenizer codebook (codebook=...)")
    from .gsd import input_embeddings
    return rule.bind(codebook, embeddings=input_embeddings(model))


@torch.no_grad()
def generate(model, conditions: torch.Tensor, method=None, sampling: Sampling | None = None, seed: int = 0,
             draft=None, drafter=None, codebook: torch.Tensor | None = None, graphs: bool | None = None) -> Generation:
    """Generate one token grid per condition with ``method`` under the law set by ``sampling``.
    ``graphs``: replay each round as a captured CUDA graph (default: on for CUDA models; no effect on
    CPU); the tokens are the same either way."""
    method = AR() if method is None else method
    sampling = Sampling() if sampling is None else sampling
    device = next(model.parameters()).device
    conditions = torch.as_tensor(conditions, device=device)
    check_conditions(model, conditions)
    if draft is not None and draft.layout.vocab_size != model.layout.vocab_size:
        raise ValueError(f"draft vocabulary {draft.layout.vocab_size} != target vocabulary {model.layout.vocab_size}")
    pad = method.pad
    rule = bind_rule(getattr(method, "acceptance", None), codebook, model)
    # greedy rules that relax on the temperature-1 law (LANTERN) get it as ctx.target.soft
    keep_soft = sampling.greedy and bool(getattr(rule, "needs_soft", False))
    target = GuidedModel(model, conditions, sampling, pad, keep_soft=keep_soft)
    draft_view = GuidedModel(draft, conditions, sampling, pad) if draft is not None else None
    graphs = device.type == "cuda" if graphs is None else graphs
    ctx = DecodeContext(target, make_generator(seed, device), pad, draft_view, drafter, codebook, graphs=graphs)
    ctx.rule = rule
    wall = timed(lambda: method.decode(ctx), device)
    draft_forwards = int(ctx.extra.pop("draft_forwards", 0))
    return Generation(ctx.tokens[:, : ctx.L].clone(), ctx.stats(wall, draft_forwards), latents=getattr(ctx, "latents", None))
