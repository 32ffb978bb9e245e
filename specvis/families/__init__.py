"""Real model families loaded from their official checkpoint directories into specvis's decoder.

Each family module declares one ``Family`` (``families.base``: what a family provides, with a default
for every capability) as its ``FAMILY``; ``FAMILIES`` lists them in detection order. A
transformers-layout family is data and a few small functions: ``matches(config)``, ``build(dir,
config, height, width) -> (PromptDecoder, route)`` (the model, built without initialisation, and the
route of each checkpoint key onto its tensors: ``families.hf.decoder_route``) and ``encode(processor,
texts, height, width)`` (its official prompt template); the loading is the base's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.decoder import PromptDecoder
from ..models.quantize import check_quantize
from . import chameleon, emu3, janus, llamagen_t2i, mar
from .base import Family, check_layer_count, checked_config  # noqa: F401 - re-exported
from .hf import read_json

FAMILIES: tuple[Family, ...] = (janus.FAMILY, emu3.FAMILY, chameleon.FAMILY, llamagen_t2i.FAMILY, mar.FAMILY)


def detect(directory: str | Path) -> tuple[Family, dict | None]:
    """(the family whose checkpoint this directory holds, its config.json or None for releases
    recognised by their files), or a one-line ValueError."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d}: not a directory")
    for family in FAMILIES:  # releases without a config.json (LlamaGen t2i: .pt files), by their files
        if family.matches_dir(d):
            return family, None
    config = read_json(d / "config.json")
    for family in FAMILIES:
        if family.matches(config):
            checked_config(config, d)  # zero or huge sizes: one line, before any module is built
            return family, config
    names = ", ".join(f.name for f in FAMILIES)
    raise ValueError(f"{d}/config.json: model_type {config.get('model_type')!r} is not supported (supported: {names})")


def load_decoder(directory: str | Path, height: int | None = None, width: int | None = None, *,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                 quantize: str | None = None) -> PromptDecoder:
    """The checkpoint's decoder with its weights, in eval mode, on ``device`` in ``dtype`` (None:
    ``models.loading.default_dtype`` of the checkpoint's own dtype), loaded by its family
    (``Family.load``: at the cost of the weights, built on the meta device and streamed in);
    ``quantize="int8"``: weight-only int8 block linears. ``model.dtype_source`` says why this dtype."""
    check_quantize(quantize)
    family, config = detect(directory)
    return family.load(Path(directory), config, height, width, device=device, dtype=dtype, quantize=quantize)


def pipeline_fields(name: str | Path, draft: str | Path | None = None, drafter: str | Path | None = None, *,
                    device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                    quantize: str | None = None) -> dict:
    """The ``Pipeline`` fields (its keyword arguments: ``zoo.load_pipeline`` builds it) of a
    checkpoint directory or Hugging Face Hub id (``specvis.hub``), by its family (``Family.pipeline_fields``),
    with an optional draft checkpoint of the same family and an optional EAGLE head trained for this
    checkpoint (``drafter``)."""
    from ..hub import resolve_model_dir

    directory = Path(resolve_model_dir(str(name)))
    family, _ = detect(directory)
    return family.pipeline_fields(name, directory, draft=draft, drafter=drafter, device=device, dtype=dtype,
                                  quantize=quantize)
