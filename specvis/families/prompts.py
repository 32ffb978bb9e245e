"""A call's text prompts as the model reads them (text- and caption-conditioned families): each prompt
through the family's official template (``Family.encode``) or taken as token ids, the positive suffix its
official scripts append, the lengths each model's context leaves, and the CFG rows (negative prompts or
the family's official unconditional rows). The functions take the pipeline (its family, models,
processor and extras); ``Pipeline.prefix``/``conditions``/``with_positive_suffix``/``prompt_class``
hand off to them."""

from __future__ import annotations

from .. import checks
from ..models.base import Condition
from ..sampling import Sampling


def prompt_class(pipe, prompt) -> int:
    """The class a prompt asks for, from the checkpoint's ``extras["prompt_classes"]`` (the emoji-t2i
    bundle: every glyph name, lower case -> its emoji class), -1 when it names none."""
    if not isinstance(prompt, str):
        return -1
    return int((pipe.extras.get("prompt_classes") or {}).get(prompt.strip().lower(), -1))


def token_ids(pipe, prompts, what: str, height: int, width: int) -> list[list[int]]:
    """Each prompt's token ids: a ``str`` through the family's official template (``Family.encode``),
    a ``list[int]`` as given; checked against what the model reads (``Family.check_ids``)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"{what} must be a non-empty list of str or of token-id lists")
    for i, p in enumerate(prompts):
        if isinstance(p, str):  # empty or non-UTF-8 text: one line naming the entry
            checks.text(p, f"{what}[{i}]", allow_empty=what != "prompts")
        elif not (isinstance(p, (list, tuple)) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            raise ValueError(f"{what}: each entry must be a str or a non-empty list of token ids, got {p!r:.60}")
    texts = [p for p in prompts if isinstance(p, str)]
    encoded = iter(pipe.family.encode(pipe.processor, texts, height, width, pipe.target) if texts else [])
    out = [next(encoded) if isinstance(p, str) else list(p) for p in prompts]
    pipe.family.check_ids(pipe, out, what)
    return out


def with_positive_suffix(family, prompts, on: bool):
    """The text prompts with the family's official positive suffix appended (``Family.positive_suffix``,
    "" where it has none) when ``on``; token-id prompts are whole prefixes and stay as given."""
    if not isinstance(on, bool):
        raise ValueError(f"positive_suffix must be True or False, got {on!r}")
    suffix = family.positive_suffix
    if not on or not suffix or not isinstance(prompts, (list, tuple)):
        return prompts
    return [p + suffix if isinstance(p, str) else p for p in prompts]


def check_lengths(pipe, rows: list[list[int]], what: str) -> None:
    """Each prefix must leave room for the image stream in every model's context (the draft's too)."""
    for model, whose in ((pipe.target, f"model {pipe.name}"), (pipe.draft, "the draft")):
        if model is None:
            continue
        i = max(range(len(rows)), key=lambda j: len(rows[j]))
        if len(rows[i]) > model.max_prefix:
            L = model.layout
            raise ValueError(f"{what}[{i}] is {len(rows[i])} tokens, longer than {whose} allows with a "
                             f"{L.height}x{L.width} image: {model.config.max_positions} positions less the "
                             f"image's {L.stream_len} leave {model.max_prefix} for the prompt")


def prefix(pipe, prompts, what: str = "prompts", height: int | None = None, width: int | None = None):
    """The conditional prefix rows of ``prompts`` on the pipeline's device (``Family.prefix``:
    ``Prompts`` of token ids, or LlamaGen t2i's ``Captions``), on the grid last set."""
    L = pipe.target.layout
    H, W = L.height if height is None else height, L.width if width is None else width
    rows = token_ids(pipe, prompts, what, H, W)
    check_lengths(pipe, rows, what)
    return pipe.family.prefix(pipe, rows)


def conditions(pipe, prompts, negative_prompts, sampling: Sampling, height: int | None, width: int | None,
               positive_suffix: bool = True) -> Condition:
    """The call's conditional rows and their CFG rows (None without CFG), on the grid it asks for
    (``Family.set_grid``): the negative prompts' rows, else the family's official unconditional rows
    (``Family.unconditional``)."""
    if (isinstance(prompts, (list, tuple)) and isinstance(negative_prompts, (list, tuple))
            and len(negative_prompts) != len(prompts)):
        raise ValueError(f"negative_prompts: {len(negative_prompts)} given for {len(prompts)} prompts; give one per prompt")
    H, W = pipe.family.set_grid(pipe, height, width)
    cond = prefix(pipe, with_positive_suffix(pipe.family, prompts, positive_suffix), "prompts", H, W)
    if negative_prompts is not None:
        uncond = prefix(pipe, negative_prompts, "negative_prompts", H, W)
    elif not sampling.uses_cfg:
        uncond = None
    else:
        uncond = pipe.family.unconditional(pipe, cond, H, W)
    if uncond is not None and len(uncond) != len(cond):
        raise ValueError(f"negative_prompts: {len(uncond)} given for {len(cond)} prompts")
    return Condition(cond, uncond)
