"""Emu3 (BAAI) in the transformers layout (``model_type: emu3``; also the legacy key layout of
``BAAI/Emu3-Gen-hf``, ``text_model.model.*`` / ``text_model.lm_head`` / ``vqmodel.*``).

A Llama text model whose vocabulary holds the VQ codes as ``<|visual token NNNNNN|>`` tokens. The
image is written row by row, each row followed by the end-of-line token ``<|extra_200|>`` (forced:
``Layout.row_end = 1``); after the last row the official stream goes on with end-of-frame and
end-of-image, which no image token depends on, so specvis stops after the last row end. Sampling is
restricted to the visual tokens (the official ``prefix_allowed_tokens_fn``). The prompt template is
``<bos> text <|image start|>H*W<|image token|>`` (``Emu3Processor(..., return_for_image_generation=True)``);
the native size is 720x720 px, i.e. 90x90 tokens. CFG: transformers' ``generate`` guides
log-softmaxed logits, u' + s (c' - u') with c' = c - logsumexp(c); that is docs/design/api.md's formula plus a
per-row constant, which the softmax over the image vocabulary removes, so the law is docs/design/api.md's.
The unconditional prompt is the official negative prompt through the same template.

Prompt text: the official scripts append the positive suffix " masterpiece, film grained, best
quality." to every prompt (``image_generation.py`` lines 31 and 36, ``gradio_demo.py`` lines 71 and 79:
``prompt + POSITIVE_PROMPT``) and none to the negative prompt, which is their ``NEGATIVE_PROMPT``
(``NEGATIVE`` here). specvis does the same by default (``POSITIVE_SUFFIX``, appended by the pipeline to
text prompts, not to token-id prompts); ``pipe(..., positive_suffix=False)`` or ``specvis generate
--no-positive-suffix`` sends the text as given.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ..models.base import Layout
from ..models.decoder import MappedEmbedding, PromptDecoder
from ..models.loading import Piece
from .base import Family
from .hf import decoder_route, llama_config, read_json, rows_of

NAME = "emu3"
DEFAULT_SAMPLING = {"cfg_scale": 3.0, "top_k": 2048}  # the official generation example
EOL = "<|extra_200|>"
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."  # image_generation.py POSITIVE_PROMPT
NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
            "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry.")
RENAMES = [
    (r"^text_model\.lm_head\.", "lm_head."),  # legacy layout
    (r"^text_model\.model\.", "model.text_model."),
    (r"^model\.text_model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.text_model\.norm\.", "norm."),
    (r"^model\.text_model\.layers\.", "hf_layers."),
]
KEEP = ("tok_embeddings.", "norm.", "hf_layers.", "lm_head.")
# Emu3Processor's class defaults (ratio "W:H", image_area in pixels) and its fixed downsample_ratio
RATIO, AREA, DOWNSAMPLE = "1:1", 518400, 8


def matches(config: dict) -> bool:
    return config.get("model_type") == NAME


def visual_ids(config: dict, where: str) -> tuple[list[int], int]:
    """Text-vocabulary ids of codes 0 .. V-1 and of the end-of-line token, from ``vocabulary_map``."""
    vocab = config.get("vocabulary_map") or {}
    codes = {int(k[-8:-2]): v for k, v in vocab.items() if k.startswith("<|visual token")}
    if not codes or sorted(codes) != list(range(len(codes))) or EOL not in vocab:
        raise ValueError(f"{where}: config.json vocabulary_map needs <|visual token 000000|>... and {EOL}")
    return [codes[i] for i in range(len(codes))], int(vocab[EOL])


def generation_defaults(directory: Path) -> tuple[str, int]:
    """(ratio, image_area) the checkpoint's processor generates at by default: from processor_config.json
    (top level, or its image_processor entry), else preprocessor_config.json, else config.json (the
    original BAAI layout keeps image_area there), else Emu3Processor's class defaults (1:1, 518400)."""
    ratio, area = None, None
    for name in ("processor_config.json", "preprocessor_config.json", "config.json"):
        if not (directory / name).exists():
            continue
        data = read_json(directory / name)
        for d in (data, data.get("image_processor") if isinstance(data.get("image_processor"), dict) else {}):
            ratio = d.get("ratio") if ratio is None else ratio
            area = d.get("image_area") if area is None else area
    return (RATIO if ratio is None else ratio), (AREA if area is None else area)


def native_grid(directory: Path) -> tuple[int, int]:
    """The processor's default image size in tokens (rows, columns), computed as
    ``Emu3Processor.calculate_generate_size(ratio, image_area, 8)`` does: for ratio "W:H", scale
    s = sqrt(image_area / (W * H)), rows round(H * s / 8), columns round(W * s / 8)."""
    ratio, area = generation_defaults(directory)
    try:
        w, h = (int(v) for v in str(ratio).split(":"))
        area = float(area)
        if w < 1 or h < 1 or not area > 0:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{directory}: processor defaults ratio {ratio!r} (\"W:H\") and image_area {area!r} "
                         "(pixels > 0) are not usable") from None
    scale = math.sqrt(area / (w * h))
    rows, cols = int(round(h * scale / DOWNSAMPLE)), int(round(w * scale / DOWNSAMPLE))
    if rows < 1 or cols < 1:
        raise ValueError(f"{directory}: processor defaults ratio {ratio} and image_area {area:g} give a "
                         f"{rows}x{cols} token grid")
    return rows, cols


def build(directory: Path, config: dict, height: int | None = None, width: int | None = None):
    """(decoder, route): the model (``models.loading.skeleton`` builds it on meta) and where each
    checkpoint tensor goes; the head is the image-vocabulary rows of ``lm_head``."""
    where = str(directory)
    cfg = llama_config(config.get("text_config") or config, where)
    codes, eol = visual_ids(config, where)
    H, W = native_grid(directory) if height is None else (height, width)
    head = nn.Linear(cfg.dim, len(codes), bias=False)
    model = PromptDecoder(cfg, Layout(H, W, len(codes), row_end=1), None, head, unconditional=None)
    model.image_embed = MappedEmbedding(model.tok_embeddings, torch.tensor(codes + [eol]))
    return model, decoder_route(RENAMES, KEEP, cfg, {"lm_head.weight": Piece("head.weight", None, rows_of(codes))})


def template(text: str, height: int, width: int, tokenizer) -> str:
    """BOS, the text, then begin-of-image, the size and the image wrapper (Emu3Processor)."""
    return f"{tokenizer.bos_token}{text}{tokenizer.boi_token}{height}*{width}{tokenizer.image_wrapper_token}"


def encode(processor, texts: list[str], height: int, width: int, model=None) -> list[list[int]]:
    """The official image-generation prompt at the requested size (what the processor builds for its
    default size), tokenised by the checkpoint's tokenizer."""
    tok = processor.tokenizer
    return [list(map(int, tok(template(t, height, width, tok))["input_ids"])) for t in texts]


def negative(processor, count: int, height: int, width: int, model=None) -> list[list[int]]:
    return encode(processor, [NEGATIVE] * count, height, width)


def load_vq(directory: Path, device: str | torch.device = "cpu"):
    """The image decoder of this checkpoint (``decode(codes, height, width)``, ``codebook``)."""
    from ..models.hf_vq import load_hf_vq

    return load_hf_vq(directory, device=device)


class Emu3(Family):
    """Emu3: text prompts through the official template with its positive suffix; the official
    negative prompt as the CFG rows."""

    name = NAME
    conditioning = "text"
    positive_suffix = POSITIVE_SUFFIX
    default_sampling = DEFAULT_SAMPLING
    matches = staticmethod(matches)
    build = staticmethod(build)
    encode = staticmethod(encode)
    negative = staticmethod(negative)
    image_decoder = staticmethod(load_vq)

    def native_grid(self, directory: Path, config: dict | None) -> tuple[int, int]:
        return native_grid(directory)


FAMILY = Emu3()
