"""``specvis.generate``: run any method on any ``CachedTokenModel`` (token level, no pixels)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checks
from .methods.base import DecodeContext, Stats, timed
from .methods.ar import AR
from .methods.cspd import CSpD
from .methods.ordered import OrderedVerifier, OrderedView
from .methods.views import DrafterView, guided_view
from .models.base import Captions, Condition, Prompts
from .sampling import Sampling, make_generator


@dataclass
class Generation:
    tokens: torch.Tensor | None  # (B, H*W) image-token ids; None for continuous-token models (``latents``)
    stats: Stats
    images: list = field(default_factory=list)  # PIL images when a pipeline decoded them
    latents: torch.Tensor | None = None  # (B, H*W, C) continuous tokens (continuous-token models)
    method: Any = None  # the method that ran (``sv.Auto()``: the one it chose)


def check_conditions(model, conditions) -> None:
    """Class ids for class-conditional models, ``Prompts``/``Captions`` (or a ``Condition``) for text-conditioned ones."""
    n = getattr(model, "num_conditions", None)
    if isinstance(conditions, (Prompts, Captions, Condition)):
        if n is not None:
            raise ValueError("this model is class-conditional: give classes, not prompts")
        return
    if n is None and getattr(model, "null_condition", 0) is None:
        raise ValueError("this model is text-conditioned: give prompts, not classes")
    if conditions.ndim != 1 or conditions.dtype not in (torch.int32, torch.int64):
        raise ValueError("conditions must be a 1-D integer tensor of class ids")
    if conditions.numel() == 0:
        raise ValueError("conditions is empty: give at least one class id")
    if n is not None and conditions.numel() and not bool(((conditions >= 0) & (conditions < n)).all()):
        raise ValueError(f"class ids must be in 0..{n - 1}, got {conditions.tolist()}")


# Method fields that count tokens along the image stream: a value beyond the stream's length drafts or
# verifies positions past its end (memory and forwards, never tokens), so it is clamped to that length.
STREAM_FIELDS = ("window", "gamma", "depth")


def fit_to_stream(method, stream_len: int):
    """``method`` with each of its ``STREAM_FIELDS`` (and the upper end of ADT's ``depth_range``) at most
    ``stream_len``, the tokens a row decodes; a warning names each field clamped. A window or gamma of
    L or more already commits the whole rest of the stream in one round when every draft is accepted,
    so the law is the same and the work per round is bounded by the grid: speculative with
    gamma=100000 ran 100000 draft forwards per round (one image took minutes)."""
    if not dataclasses.is_dataclass(method) or isinstance(method, type):
        return method
    fields = {f.name for f in dataclasses.fields(method) if f.init}
    changes: dict[str, Any] = {}
    for name in STREAM_FIELDS:
        value = getattr(method, name) if name in fields else None
        if isinstance(value, int) and not isinstance(value, bool) and value > stream_len:
            changes[name] = stream_len
    if "depth_range" in fields:
        lo, hi = method.depth_range
        if hi > stream_len + 1:  # ADT: depths lo .. hi - 1 (tree.py), at most stream_len
            changes["depth_range"] = (min(lo, stream_len - 1), stream_len + 1)
    if not changes:
        return method
    said = ", ".join(f"{k} {getattr(method, k)} -> {v}" for k, v in changes.items())
    warnings.warn(f"{method.name}: {said}: the image stream has {stream_len} tokens", stacklevel=2)
    return dataclasses.replace(method, **changes)


def bind_rule(rule, codebook: torch.Tensor | None, model=None):
    """Rules that need a table expose ``bind(codebook, embeddings=)``: the tokenizer's codebook (LANTERN
    neighbourhoods; GSD's distance with embedding="codebook") or the target's input-embedding table (GSD's
    default distance). Rules say whether they need the codebook (``needs_codebook``, default yes)."""
    if rule is None or not hasattr(rule, "bind"):
        return rule
    if codebook is None and getattr(rule, "needs_codebook", True):
        raise ValueError(f"acceptance rule {rule.name} needs the tokenizer codebook (codebook=...)")
    from .gsd import input_embeddings
    bound = rule.bind(codebook, embeddings=input_embeddings(model))
    structural = getattr(getattr(model, "layout", None), "row_end", 0)
    return bound.with_structural(structural) if structural and hasattr(bound, "with_structural") else bound


@torch.no_grad()
def generate(model, conditions, method=None, sampling: Sampling | None = None, seed: int = 0,
             draft=None, drafter=None, codebook: torch.Tensor | None = None, graphs: bool | None = None,
             progress=None, ordered: OrderedVerifier | None = None) -> Generation:
    """Generate one token grid per condition with ``method`` under the law set by ``sampling``.
    ``conditions``: class ids (B,), ``Prompts`` (the model's own unconditional prompts serve CFG) or a
    ``Condition`` (conditional and unconditional rows given).
    ``graphs``: replay each round as a captured CUDA graph (default: on for CUDA models; no effect on
    CPU); the tokens are the same either way. ``progress``: called after each round (between captured
    rounds) with the fraction of the stream every row has committed (one host read a round; for UIs).
    ``ordered``: the model reveals its tokens in an order of its own (MAR), as its family declares it
    (``families.mar.MARReveal``); ``conditions`` are then class ids and the tokens continuous."""
    method = checks.method(method)
    sampling = checks.sampling(sampling, Sampling())
    seed = checks.seed(seed)
    device = next(model.parameters()).device
    if isinstance(conditions, (Prompts, Captions)):
        conditions = conditions.to(device)
    elif not isinstance(conditions, Condition):
        conditions = torch.as_tensor(conditions, device=device)
    check_conditions(model, conditions)
    auto = method if hasattr(method, "resolve") else None
    if auto is not None:  # sv.Auto(): calibrate (first call for its key) and run the method it picks
        method = auto.resolve(model, conditions, sampling, draft=draft, drafter=drafter, graphs=graphs)
    if draft is not None and draft.layout != model.layout:
        raise ValueError(f"draft layout {draft.layout} != target layout {model.layout}")
    if ordered is None:  # an ordered model's steps are not stream tokens: its fields stay as given
        method = fit_to_stream(method, model.layout.stream_len)
    elif not isinstance(method, (AR, CSpD)):
        raise ValueError(f"this model reveals its tokens in its own order (MAR): method must be AR or CSpD, "
                         f"got {type(method).__name__}")
    pad = method.pad
    rule = bind_rule(getattr(method, "acceptance", None), codebook, model)
    # greedy rules that relax on the temperature-1 law (LANTERN) get it with every law (DiscreteLaw.soft)
    keep_soft = sampling.greedy and bool(getattr(rule, "needs_soft", False))
    if ordered is not None:
        target = OrderedView(model, conditions, sampling, ordered)
        draft_view = OrderedView(draft, conditions, sampling, ordered) if draft is not None else None
    else:
        target = guided_view(model, Condition.of(model, conditions), sampling, pad, keep_soft=keep_soft)
        draft_view = guided_view(draft, Condition.of(draft, conditions), sampling, pad) if draft is not None else None
    graphs = device.type == "cuda" if graphs is None else graphs
    ctx = DecodeContext(target, make_generator(seed, device), pad, draft=draft_view,
                        drafter=None if drafter is None else DrafterView(drafter), rule=rule, graphs=graphs,
                        progress=progress)
    with torch.inference_mode():  # no autograd bookkeeping on the round's many small ops
        wall = timed(lambda: method.decode(ctx), device)
    stats = ctx.stats(wall)
    if auto is not None:
        stats.extra["auto_calibration_s"] = auto.calibration_s
    if ctx.latents is not None:  # continuous tokens (made under inference mode: cloned into normal tensors)
        return Generation(None, stats, latents=ctx.latents[:, : ctx.L].clone(), method=method)
    return Generation(ctx.image_tokens().clone(), stats, method=method)


@torch.no_grad()
def generate_latents(model, conditions: torch.Tensor, method=None, sampling: Sampling | None = None,
                     seed: int = 0, draft=None) -> tuple[torch.Tensor, Stats]:
    """Run ``method`` (default: target-only, ``CSpD(prefill=1.0)``) on a continuous model; returns the
    tokens (B, L, C) and Stats (``generate(...).latents`` and ``.stats``)."""
    out = generate(model, conditions, CSpD(prefill=1.0) if method is None else method, sampling, seed, draft=draft)
    return out.latents, out.stats
