"""The Chameleon family in the transformers layout (``model_type: chameleon``): Anole and Lumina-mGPT.

A Llama-shaped decoder with per-head query/key LayerNorms (``qk_norm``) and, where the config says
``swin_norm``, output normalisation; image codes are ``IMGIMG<digits as letters>Z`` tokens of the text
vocabulary (code order from ``vocabulary_map``). transformers masks image logits in
``ChameleonForConditionalGeneration.forward``, so it cannot generate images; specvis reads the image
rows of ``lm_head`` directly. Two layouts, as their official inference code builds them:

- Anole (Meta's chameleon inference, ``text2image.py``): prompt = BOS, the text, end-of-turn
  ``<reserved08706>``, begin-image ``<racm3:break>``; a 32x32 grid, no structural tokens. CFG is
  InstructPix2Pix-style over three rows (full, image-only, unconditional = [BOS, begin-image]): for a
  text-only prompt the image-only row equals the unconditional one, so the guided logits are
  u + s_text (c - u), API.md's formula with s = guidance_scale_text (official 3.0; temperature 0.7,
  top-p 0.9). Meta's code left-pads prompts of a batch with attended pad tokens; specvis gives every
  row its own length (the same law for batch 1).
- Lumina-mGPT (``ChameleonXLLMXForConditionalGeneration``, ``inference_solver.py``): the human turn
  "Generate an image of {w}x{h} according to the following prompt:\\n{text}" + ``<reserved08706>``,
  then begin-image and two grid-size tokens ``<reserved{8800 + n:05d}>`` (n = tokens / 2), which the
  official code lets the model sample and specvis fixes from height/width; each row of image tokens
  ends with ``<reserved08799>`` (forced: ``Layout.row_end = 1``). CFG starts at begin-image: the
  unconditional prompt is [begin-image, h, w] with no text and no BOS; guided = u + s (c - u) on raw
  logits (official cfg 4.0, top-k 2000).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..models.base import Layout
from ..models.decoder import MappedEmbedding, PromptDecoder
from ..models.loading import Piece
from .hf import decoder_route, llama_config, rows_of

NAME = "chameleon"
PROMPT_PROCESSOR = "AutoTokenizer"  # prompts need only the tokenizer (no image processor in these releases)
DEFAULT_SAMPLING = {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}  # Anole (Meta's Options.Image)
LUMINA_SAMPLING = {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 2000}
EOT, BOI, ROW_END = "<reserved08706>", "<racm3:break>", "<reserved08799>"
RENAMES = [
    (r"^model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.norm\.", "norm."),
    (r"^model\.layers\.", "hf_layers."),
]
KEEP = ("tok_embeddings.", "norm.", "hf_layers.", "lm_head.")


def matches(config: dict) -> bool:
    return config.get("model_type") == NAME


def is_lumina(config: dict) -> bool:
    """Lumina-mGPT's releases: ChameleonXLLMXConfig (model_type still chameleon) adds z_loss_weight."""
    return "z_loss_weight" in config or any("XLLMX" in a for a in config.get("architectures") or [])


def image_ids(config: dict, where: str) -> list[int]:
    """Text-vocabulary ids of codes 0 .. V-1: ``IMGIMG`` + the code's digits written A-J + ``Z``."""
    vocab = config.get("vocabulary_map") or {}
    codes = {}
    for name, i in vocab.items():
        if name.startswith("IMGIMG") and name.endswith("Z"):
            digits = "".join(str(ord(c) - ord("A")) for c in name[6:-1])
            codes[int(digits)] = int(i)
    if not codes or sorted(codes) != list(range(len(codes))):
        raise ValueError(f"{where}: config.json vocabulary_map has no complete set of IMGIMG image tokens")
    return [codes[c] for c in range(len(codes))]


def special(config: dict, name: str, where: str) -> int:
    vocab = config.get("vocabulary_map") or {}
    if name not in vocab:
        raise ValueError(f"{where}: config.json vocabulary_map lacks {name}")
    return int(vocab[name])


def native_grid(config: dict) -> tuple[int, int]:
    return (48, 48) if is_lumina(config) else (32, 32)  # Lumina-mGPT-7B-768; Anole 512 px


def build(directory: Path, config: dict, height: int | None = None, width: int | None = None):
    """(decoder, route): the model (``models.loading.skeleton`` builds it on meta) and where each
    checkpoint tensor goes; the head is the image-vocabulary rows of ``lm_head``."""
    where = str(directory)
    cfg = llama_config(config, where)
    cfg.qk_norm, cfg.swin_norm = True, bool(config.get("swin_norm", False))
    codes = image_ids(config, where)
    lumina = is_lumina(config)
    H, W = native_grid(config) if height is None else (height, width)
    row_end = [special(config, ROW_END, where)] if lumina else []
    head = nn.Linear(cfg.dim, len(codes), bias=False)
    model = PromptDecoder(cfg, Layout(H, W, len(codes), row_end=len(row_end)), None, head)
    model.image_embed = MappedEmbedding(model.tok_embeddings, torch.tensor(codes + row_end))
    model.chameleon_ids = {"eot": special(config, EOT, where), "boi": special(config, BOI, where), "lumina": lumina}
    model.default_sampling = LUMINA_SAMPLING if lumina else DEFAULT_SAMPLING
    return model, decoder_route(RENAMES, KEEP, cfg, {"lm_head.weight": Piece("head.weight", None, rows_of(codes))})


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


def encode(processor, texts: list[str], height: int, width: int, model: PromptDecoder) -> list[list[int]]:
    """The official prompt of the checkpoint's layout (module docstring), tokenised by its tokenizer."""
    tok = _tokenizer(processor)
    ids = model.chameleon_ids
    out = []
    for t in texts:
        if ids["lumina"]:
            q = f"Generate an image of {width * 16}x{height * 16} according to the following prompt:\n{t}"
            body = tok(q)["input_ids"] + [ids["eot"], ids["boi"]] + grid_tokens(tok, height, width)
        else:
            body = tok(t)["input_ids"] + [ids["eot"], ids["boi"]]
        out.append([int(i) for i in body])
    return out


def grid_tokens(tok, height: int, width: int) -> list[int]:
    """Lumina-mGPT's size tokens <reserved{8800 + n:05d}>, n = grid / 2 (32-px patches of 16-px tokens)."""
    if height % 2 or width % 2:
        raise ValueError(f"Lumina-mGPT grids are in 32-px patches: height and width must be even, got {height}x{width}")
    vocab = tok.get_vocab()
    return [int(vocab[f"<reserved{8800 + n // 2:05d}>"]) for n in (height, width)]


def negative(processor, count: int, height: int, width: int, model: PromptDecoder) -> list[list[int]]:
    """The unconditional prompt: [BOS, begin-image] (Anole); [begin-image, h, w] (Lumina-mGPT)."""
    tok = _tokenizer(processor)
    ids = model.chameleon_ids
    if ids["lumina"]:
        row = [ids["boi"]] + grid_tokens(tok, height, width)
    else:
        row = [int(tok.bos_token_id), ids["boi"]]
    return [row] * count


def load_vq(directory: Path, device: str | torch.device = "cpu"):
    """The image decoder of this checkpoint (``decode(codes, height, width)``, ``codebook``)."""
    from ..models.chameleon_vq import load_chameleon_vq

    return load_chameleon_vq(directory, device=device)
