"""Real model families loaded from their official checkpoint directories into specvis's decoder.

A family module is data and three small functions: ``matches(config)``, ``build(dir, config, height,
width) -> (PromptDecoder, tensors)`` (its key renames onto our names, Llama layers still in the
Hugging Face layout under ``hf_layers.``) and ``encode(processor, texts, height, width)`` (its
official prompt template). Everything else is shared here.
"""

from __future__ import annotations

from pathlib import Path

from ..models.checkpoint import load_strict
from ..models.decoder import PromptDecoder, import_llama_layers
from . import chameleon, emu3, janus, llamagen_t2i, mar
from ..checks import config_sizes
from .hf import check_text_size, read_json

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


def load_decoder(directory: str | Path, height: int | None = None, width: int | None = None) -> PromptDecoder:
    """The checkpoint's text-to-image decoder with its weights, in eval mode (fp32 unless cast later)."""
    family, config = detect(directory)
    if hasattr(family, "load_decoder"):  # a family with its own model class and file format
        model = family.load_decoder(Path(directory), height, width)
        model.family = family
        return model
    model, sd = family.build(Path(directory), config, height, width)
    load_tensors(model, sd, str(directory))
    model.family = family
    return model.float().eval()


def load_tensors(model: PromptDecoder, sd: dict, where: str) -> None:
    """Load a family's renamed tensors (``build``'s: Llama layers still in the Hugging Face layout under
    ``hf_layers.``) into ``model``, strictly; one-line ValueErrors naming ``where``."""
    cfg = model.config
    stored = {int(k.split(".")[1]) for k in sd if k.startswith("hf_layers.") and k.split(".")[1].isdigit()}
    if stored and len(stored) != cfg.n_layer:  # else the extra layers would be dropped without a word
        raise ValueError(f"{where}: config.json gives {cfg.n_layer} decoder layers, the checkpoint stores {len(stored)}")
    try:
        layers = import_llama_layers(sd, "hf_layers.", cfg.n_layer, cfg.n_head, cfg.n_kv_head)
    except KeyError as e:
        raise ValueError(f"{where}: checkpoint lacks {e}") from None
    sd = {k: v for k, v in sd.items() if not k.startswith("hf_layers.")} | layers
    load_strict(model, sd, where)


def load_pipeline(name: str | Path, draft: str | Path | None = None, drafter: str | Path | None = None):
    """A ``TextPipeline`` for a checkpoint directory or Hugging Face Hub id (``specvis.hub``), with an
    optional draft checkpoint of the same family (same tokenizer, same image vocabulary) and an
    optional EAGLE head trained for this checkpoint (``specvis train-drafter --model``: its ``--out``
    directory or the ``final/`` head in it; a Hub id works too)."""
    from ..pipeline import TextPipeline
    from ..sampling import Sampling
    from ..hub import resolve_model_dir

    directory = resolve_model_dir(str(name))
    family, _ = detect(directory)
    if hasattr(family, "load_pipeline"):  # its own pipeline (LlamaGen t2i: captions from flan-t5)
        return family.load_pipeline(name, Path(directory), draft=draft, drafter=drafter)
    target = load_decoder(directory)
    draft_model = None
    if draft is not None:
        draft_dir = resolve_model_dir(str(draft))
        draft_model = load_decoder(draft_dir)
        check_draft(draft_model, target, draft_dir, directory)
    drafter_model = None
    if drafter is not None:
        from ..models.drafter import load_drafter

        drafter_model = load_drafter(resolve_model_dir(str(drafter)), target)
    family = target.family
    grid = (target.layout.height, target.layout.width)
    extras = {"grid": grid, "family": family.NAME, "directory": str(directory)}
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
