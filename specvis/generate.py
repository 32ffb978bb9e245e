"""``specvis.generate``: run any method on any ``CachedTokenModel`` (token level, no pixels)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checks
from .accept import AcceptanceRule, BoundRule, RuleTables, default_rule
from .gsd import input_embeddings
from .methods.auto import REFUSED, Auto
from .methods.base import DecodeContext, Stats, timed
from .methods.cspd import CSpD
from .methods.ordered import OrderedVerifier, OrderedView
from .methods.slots import SlotQueue
from .methods.views import DrafterView, guided_view
from .models.base import Captions, Condition, Prompts
from .models.continuous import ContinuousAR
from .models.decoder import CachedStack
from .noise import image_seeds
from .options import Options, option_fields
from .progress import ImageBar
from .registry import method_argument, refilling_methods
from .sampling import Sampling, make_generator, sampling_argument


@dataclass
class Generation:
    tokens: torch.Tensor | None  # (B, H*W) image-token ids; None for continuous-token models (``latents``)
    stats: Stats
    images: list = field(default_factory=list)  # PIL images when a pipeline decoded them
    latents: torch.Tensor | None = None  # (B, H*W, C) continuous tokens (continuous-token models)
    method: Any = None  # the method that ran (``sv.Auto()`` in a pipeline: the one it chose)
    calibration: Any = None  # ``sv.Auto()`` in a pipeline: its ``tune.Calibration`` (the choice and why)


def check_conditions(model, conditions) -> None:
    """Class ids for class-conditional models, ``Prompts``/``Captions`` (or a ``Condition``) for
    text-conditioned ones. A model declares which: ``num_conditions`` (its class count; None for
    text-conditioned models, ``TokenModel``)."""
    n = model.num_conditions
    if isinstance(conditions, (Prompts, Captions, Condition)):
        if n is not None:
            raise ValueError("this model is class-conditional: give classes, not prompts")
        return
    if n is None:
        raise ValueError("this model is text-conditioned: give prompts, not classes")
    if conditions.ndim != 1 or conditions.dtype not in (torch.int32, torch.int64):
        raise ValueError("conditions must be a 1-D integer tensor of class ids")
    if conditions.numel() == 0:
        raise ValueError("conditions is empty: give at least one class id")
    if n is not None and conditions.numel() and not bool(((conditions >= 0) & (conditions < n)).all()):
        raise ValueError(f"class ids must be in 0..{n - 1}, got {conditions.tolist()}")


def fit_to_stream(method, stream_len: int):
    """``method`` with each of its options that count tokens along the image stream (declared
    ``stream=True``: ``window``, ``gamma``, ``depth``; the upper end of ADT's ``depth_range``) at most
    ``stream_len``, the tokens a row decodes; a warning names each field clamped. A window or gamma of
    L or more already commits the whole rest of the stream in one round when every draft is accepted,
    so the law is the same and the work per round is bounded by the grid: speculative with
    gamma=100000 ran 100000 draft forwards per round (one image took minutes)."""
    if not isinstance(method, Options):
        return method
    changes: dict[str, Any] = {}
    for info in option_fields(type(method)):
        value = getattr(method, info.name)
        if not info.stream:
            continue
        if isinstance(value, int) and value > stream_len:
            changes[info.name] = stream_len
        elif isinstance(value, tuple) and value[1] > stream_len + 1:  # an open interval (ADT): depths lo .. hi - 1
            changes[info.name] = (min(value[0], stream_len - 1), stream_len + 1)
    if not changes:
        return method
    said = ", ".join(f"{k} {getattr(method, k)} -> {v}" for k, v in changes.items())
    warnings.warn(f"{method.name}: {said}: the image stream has {stream_len} tokens", stacklevel=2)
    return dataclasses.replace(method, **changes)


def bind_rule(rule: AcceptanceRule | None, codebook: torch.Tensor | None, model=None) -> BoundRule | None:
    """The method's rule bound once to the tables it declares it needs (``rule.needs``): the tokenizer's
    codebook (LANTERN's neighbourhoods; GSD's distance with embedding="codebook"), the target's input
    embeddings (GSD's default distance), and the layout's structural ids (``Layout.row_end``)."""
    if rule is None:
        return None
    if codebook is None and "codebook" in rule.needs:
        raise ValueError(f"acceptance rule {rule.name} needs the tokenizer codebook (codebook=...)")
    embeddings = input_embeddings(model) if "embeddings" in rule.needs else None
    return rule.bind(RuleTables(codebook, embeddings, model.layout.row_end if model is not None else 0))


def check_refill(method, model, ordered) -> None:
    """Continuous batching (``batch_size`` below the conditions) needs a method that restarts rows
    (``refills``: they run the target alone) and a token model with a cache of condition prefixes
    (``CachedStack``)."""
    if not (isinstance(method, Options) and method.refills):
        raise ValueError(f"batch_size below the number of conditions restarts finished rows with the next "
                         f"condition, which method {method.name} does not support; methods that do: "
                         f"{', '.join(refilling_methods())}")
    if ordered is not None or not isinstance(model, CachedStack):
        raise ValueError("batch_size below the number of conditions needs a token model with a prefix cache: "
                         "not a continuous-token or ordered (MAR) model")


def keyed_method(method, sampling: Sampling):
    """The method as it runs under ``sampling``'s noise: a lossless method built without a rule verifies by
    ``Coupled`` under keyed noise (``accept.default_rule``); ``Coupled`` needs keyed noise and a lossless
    method (verified through the context's walk) or a lossy one that declares ``coupled_walk`` (its own
    walk verifies the keyed point masses: PJD's rows). A lossy method keeps its own default rule."""
    rule = method.acceptance
    if rule is None:
        return method
    if method.lossless:
        chosen = default_rule(rule, sampling.keyed)
        if chosen is not rule:
            return dataclasses.replace(method, acceptance=chosen)
    if "noise" in rule.needs:
        if not sampling.keyed:
            raise ValueError(f"acceptance rule {rule.name} needs keyed noise: sampling noise=\"keyed\" "
                             f"(--noise keyed), got noise={sampling.noise!r}")
        if not (method.lossless or isinstance(method, Options) and method.coupled_walk):
            raise ValueError(f"acceptance rule {rule.name} verifies the lossless methods and PJD; method "
                             f"{method.name} runs its own walk: use exact, lantern or gsd with it")
    return method


def stream_order(model, ordered) -> bool:
    """Whether ``model`` decodes discrete tokens in stream order, the models keyed noise applies to (and
    their default noise, ``Sampling.resolved``): not a continuous-token or ordered (MAR) model."""
    return ordered is None and not isinstance(model, ContinuousAR)


def keyed_seeds(model, sampling: Sampling, seed: int, conditions, ordered) -> list[int] | None:
    """Under keyed noise the seeds of the call's images (image k: seed + k); None under stream noise."""
    if not sampling.keyed:
        return None
    if not stream_order(model, ordered):
        raise ValueError("sampling noise=\"keyed\" needs a discrete-token model decoded in stream order, "
                         "not a continuous-token or ordered (MAR) model")
    return image_seeds(seed, Condition.of(model, conditions).batch)


@torch.no_grad()
def generate(model, conditions, method=None, sampling: Sampling | None = None, seed: int = 0,
             draft=None, drafter=None, codebook: torch.Tensor | None = None, graphs: bool | None = None,
             progress=None, ordered: OrderedVerifier | None = None, batch_size: int | None = None) -> Generation:
    """Generate one token grid per condition with ``method`` under the law set by ``sampling`` (its noise
    by default keyed for discrete tokens decoded in stream order, else stream: ``Sampling.resolved``).
    ``conditions``: class ids (B,), ``Prompts`` (the model's own unconditional prompts serve CFG) or a
    ``Condition`` (conditional and unconditional rows given).
    ``graphs``: replay each round as a captured CUDA graph (default: on for CUDA models; no effect on
    CPU); the tokens are the same either way. ``progress``: called after each round (between captured
    rounds) with the fraction of the stream every row has committed (one host read a round; for UIs);
    True shows a bar on stderr (images done, tokens per second, ETA: ``specvis.progress``).
    ``ordered``: the model reveals its tokens in an order of its own (MAR), as its family declares it
    (``families.mar.MARReveal``); ``conditions`` are then class ids and the tokens continuous.
    ``batch_size``: decode at most this many samples at once; when one finishes, the next condition
    takes its row (continuous batching, ``methods/slots.py``; methods that declare ``refills``). The
    tokens come back in the conditions' order; ``stats.step_compression`` counts each row's tokens over
    the batched forwards. Each argument is checked once, before anything runs (a bad one: one line
    naming it)."""
    if not isinstance(model, torch.nn.Module):
        raise checks.InputTypeError(f"model must be a loaded token model (pipe.target, a torch module), got {checks.shown(model)}")
    progress = checks.progress(progress)
    method = method_argument(method)
    if isinstance(method, Auto):
        raise ValueError(REFUSED)
    sampling = sampling_argument(sampling, Sampling()).resolved(stream_order(model, ordered))
    seed = checks.seed(seed)
    device = next(model.parameters()).device
    if isinstance(conditions, (Prompts, Captions)):
        conditions = conditions.to(device)
    elif not isinstance(conditions, Condition):
        conditions = torch.as_tensor(conditions, device=device)
    check_conditions(model, conditions)
    if batch_size is not None:
        batch_size = checks.integer(batch_size, "batch_size", low=1)
    return generate_checked(model, conditions, method, sampling, seed, draft=draft, drafter=drafter, codebook=codebook,
                            graphs=graphs, progress=progress, ordered=ordered, batch_size=batch_size)


@torch.no_grad()
def generate_checked(model, conditions, method, sampling: Sampling, seed: int, draft=None, drafter=None,
                     codebook: torch.Tensor | None = None, graphs: bool | None = None, progress=None,
                     ordered: OrderedVerifier | None = None, batch_size: int | None = None) -> Generation:
    """``generate`` of arguments checked already: a method instance (not ``sv.Auto``), ``sampling`` with
    its noise resolved, a seed in range, conditions of the model's kind on its device, ``batch_size``
    None or >= 1, ``progress`` None, a bool or a callable. The pipelines check a call's arguments once
    (``Pipeline.__call__``) and run here (through ``tune.run``), so no argument is checked twice."""
    device = next(model.parameters()).device
    queued = None
    if batch_size is not None:  # an ordered (MAR) model's conditions are class ids; its sampler makes the CFG rows
        condition = Condition(conditions) if ordered is not None else Condition.of(model, conditions)
        if batch_size < condition.batch:
            check_refill(method, model, ordered)
            queued, conditions = condition, condition[:batch_size]
            draft = drafter = None  # a refilling method runs the target alone
    if draft is not None and draft.layout != model.layout:
        raise ValueError(f"draft layout {draft.layout} != target layout {model.layout}")
    if ordered is None:  # an ordered model's steps are not stream tokens: its fields stay as given
        method = fit_to_stream(method, model.layout.stream_len)
    elif not method.model_order:
        raise ValueError(f"this model reveals its tokens in its own order (MAR): method must be AR or CSpD, "
                         f"got {type(method).__name__}")
    seeds = keyed_seeds(model, sampling, seed, conditions if queued is None else queued, ordered)
    method = keyed_method(method, sampling)
    pad = method.pad
    rule = bind_rule(method.acceptance, codebook, model)
    # greedy rules that relax on the temperature-1 law (LANTERN) get it with every law (DiscreteLaw.soft)
    keep_soft = sampling.greedy and rule is not None and "soft" in rule.needs
    if ordered is not None:
        target = OrderedView(model, conditions, sampling, ordered)
        draft_view = OrderedView(draft, conditions, sampling, ordered) if draft is not None else None
    else:
        target = guided_view(model, Condition.of(model, conditions), sampling, pad, keep_soft=keep_soft)
        draft_view = guided_view(draft, Condition.of(draft, conditions), sampling, pad) if draft is not None else None
    graphs = device.type == "cuda" if graphs is None else graphs
    ctx = DecodeContext(target, make_generator(seed, device), pad, draft=draft_view,
                        drafter=None if drafter is None else DrafterView(drafter), rule=rule, graphs=graphs,
                        progress=progress, seeds=seeds, coupled=rule is not None and "noise" in method.acceptance.needs)
    if queued is not None:
        ctx.queue = SlotQueue(ctx, queued)
    bar = ImageBar(queued.batch if queued is not None else ctx.n.shape[0], ctx.L) if progress is True else None
    ctx.progress = bar.fraction if bar is not None else progress or None  # True: a bar on stderr; False: none
    try:
        with torch.inference_mode():  # no autograd bookkeeping on the round's many small ops
            wall = timed(lambda: method.decode(ctx), device)
    finally:
        if bar is not None:
            bar.close()
    stats = ctx.stats(wall)
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
