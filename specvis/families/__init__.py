"""Real model families loaded from their official checkpoint directories into specvis's decoder.

A family module is data and three small functions: ``matches(config)``, ``build(dir, config, height,
width) -> (PromptDecoder, route)`` (the model, built here without initialisation, and the route of
each checkpoint key onto its tensors: ``families.hf.decoder_route``) and ``encode(processor, texts,
height, width)`` (its official prompt template). Everything else is shared here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..models.decoder import PromptDecoder
from ..models.loading import (config_dtype, empty_parameters, load_safetensors, resolve, safetensors_dtype,
                              safetensors_index)
from ..models.quantize import check_quantize, quantize_linears, streaming_quantizer
from . import chameleon, emu3, janus, llamagen_t2i, mar
from ..checks import config_sizes
from .hf import check_text_size, read_json, weight_files

FAMILIES = (janus, emu3, chameleon, llamagen_t2i, mar)


def detect(directory: str | Path):
    """The family module whose config.json this directory holds, or a one-line ValueError."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d}: not a directory")
    for family in FAMILIES:  # releases without a config.json (LlamaGen t2i: .pt files), by their files
        if hasattr(family, "matches_dir") and family.matches_dir(d):
            return family, None
    config = read_json(d / "config.json")
    for family in FAMILIES:
        if family.matches(config):
            config_sizes(config, str(d / "config.json"))  # zero or huge sizes: one line, before any module is built
            check_text_size(config, d)
            return family, config
    names = ", ".join(f.NAME for f in FAMILIES)
    raise ValueError(f"{d}/config.json: model_type {config.get('model_type')!r} is not supported (supported: {names})")


def load_decoder(directory: str | Path, height: int | None = None, width: int | None = None, *,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                 quantize: str | None = None) -> PromptDecoder:
    """The checkpoint's text-to-image decoder with its weights, in eval mode, on ``device`` in
    ``dtype`` (None: ``models.loading.default_dtype`` of the checkpoint's own dtype). Loaded at the
    cost of the weights: built on the meta device, each tensor streamed from the memory-mapped
    safetensors, shard by shard, into its place (``models.loading``); with ``quantize="int8"``
    each block linear becomes int8 as its weight arrives (``models.quantize``). ``model.dtype_source``
    says why this dtype."""
    check_quantize(quantize)
    family, config = detect(directory)
    if hasattr(family, "load_decoder"):  # a family with its own model class and file format
        model = family.load_decoder(Path(directory), height, width, device=device, dtype=dtype)
        model.family = family
        if quantize:
            quantize_linears(model)
        return model
    d = Path(directory)
    files = weight_files(d)
    dt, why = resolve(dtype, config_dtype(config) or safetensors_dtype(files), device)
    with empty_parameters():
        model, route = family.build(d, config, height, width)
    check_layer_count(model, safetensors_index(files), route, str(directory))
    load_safetensors(model, files, route, dt, device, str(directory),
                     finish=streaming_quantizer(model) if quantize else None)
    if quantize:
        quantize_linears(model)  # block linears with a bias (none in these families' releases)
    model.family, model.dtype_source = family, why
    return model.eval()


LAYER = re.compile(r"layers\.(\d+)\.")


def check_layer_count(model: PromptDecoder, keys, route, where: str) -> None:
    """The decoder layers the checkpoint's keys fill (read from the headers, through ``route``) are the
    config's count: else a one-line ValueError, before any tensor is read (a config with fewer layers
    than the file would otherwise report the rest as unexpected tensors, one key at a time)."""
    stored = {int(m.group(1)) for k in keys for p in (route(k) or ()) if (m := LAYER.match(p.name))}
    if stored and len(stored) != model.config.n_layer:
        raise ValueError(f"{where}: config.json gives {model.config.n_layer} decoder layers, the checkpoint stores {len(stored)}")


def load_pipeline(name: str | Path, draft: str | Path | None = None, drafter: str | Path | None = None, *,
                  device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                  quantize: str | None = None):
    """A ``TextPipeline`` for a checkpoint directory or Hugging Face Hub id (``specvis.hub``), with an
    optional draft checkpoint of the same family (same tokenizer, same image vocabulary) and an
    optional EAGLE head trained for this checkpoint (``specvis train-drafter --model``: its ``--out``
    directory or the ``final/`` head in it; a Hub id works too). All are loaded on ``device`` in
    ``dtype`` (None: the target checkpoint's default, ``models.loading.default_dtype``; the draft and
    the head follow the target); ``quantize="int8"``: the target's and the draft's block linears
    in int8 (``models.quantize``)."""
    from ..pipeline import TextPipeline
    from ..sampling import Sampling
    from ..hub import resolve_model_dir

    directory = resolve_model_dir(str(name))
    family, _ = detect(directory)
    if hasattr(family, "load_pipeline"):  # its own pipeline (LlamaGen t2i: captions from flan-t5)
        return family.load_pipeline(name, Path(directory), draft=draft, drafter=drafter, device=device, dtype=dtype)
    target = load_decoder(directory, device=device, dtype=dtype, quantize=quantize)
    dt = next(target.parameters()).dtype
    draft_model = None
    if draft is not None:
        draft_dir = resolve_model_dir(str(draft))
        draft_model = load_decoder(draft_dir, device=device, dtype=dt, quantize=quantize)
        check_draft(draft_model, target, draft_dir, directory)
    drafter_model = None
    if drafter is not None:
        from ..models.drafter import load_drafter

        drafter_model = load_drafter(resolve_model_dir(str(drafter)), target)
    family = target.family
    grid = (target.layout.height, target.layout.width)
    extras = {"grid": grid, "family": family.NAME, "directory": str(directory), "dtype_source": target.dtype_source}
    if draft is not None:
        extras["draft"] = _display_name(draft, draft_dir)
    return TextPipeline(_display_name(name, directory), target, None, draft=draft_model, drafter=drafter_model,
                        directory=directory,
                        default_sampling=Sampling(**getattr(target, "default_sampling", family.DEFAULT_SAMPLING)),
                        extras=extras)


def _display_name(name: str | Path, directory: Path) -> str:
    """How reports name a checkpoint: its Hub id when it came from the cache (the snapshot directory is
    a commit hash), else the directory's name."""
    return Path(directory).name if Path(str(name)).expanduser().is_dir() else str(name)


def check_draft(draft, target, draft_dir, directory) -> None:
    """A draft must be the target's family with the same text vocabulary (it reads the same prompt
    ids) and the same image vocabulary and structural tokens (it proposes the target's tokens). Its
    native grid may differ: the pipeline sets both to the requested grid."""
    if draft.family is not target.family:
        raise ValueError(f"draft {draft_dir} ({draft.family.NAME}) is not of the family of {directory} "
                         f"({target.family.NAME}): the draft must be a checkpoint of the target's family")
    d, t = draft.layout, target.layout
    if (d.vocab_size, d.row_end) != (t.vocab_size, t.row_end):
        raise ValueError(f"draft {draft_dir}: image vocabulary of {d.vocab_size} codes (row ends {d.row_end}) "
                         f"differs from {directory}'s {t.vocab_size} (row ends {t.row_end})")
    if draft.config.text_vocab_size != target.config.text_vocab_size:
        raise ValueError(f"draft {draft_dir}: text vocabulary of {draft.config.text_vocab_size} tokens differs from "
                         f"{directory}'s {target.config.text_vocab_size}: the draft must share the target's tokenizer")
