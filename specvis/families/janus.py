"""Janus / Janus-Pro (DeepSeek) in the transformers layout (``model_type: janus``).

A Llama text model; image codes are embedded by a separate table lifted by an MLP aligner and scored
by a separate generation head over the VQ codebook (16,384 codes, 24x24 grid at 384 px for
Janus-Pro). No structural tokens inside the image. CFG (``JanusForConditionalGeneration.generate``,
image mode): the unconditional prompt is the conditional one with every token but BOS and
begin-of-image replaced by the pad token, same length, attended; guided = u + s (c - u) on the raw
generation-head logits, which is docs/design/api.md's formula. A text prompt is the processor's chat template
followed by begin-of-image (``JanusProcessor(..., generation_mode="image")``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ..models.base import Layout
from ..models.decoder import AlignedEmbedding, MLPHead, PromptDecoder
from .base import Family
from .hf import decoder_route, llama_config, read_json

NAME = "janus"
DEFAULT_SAMPLING = {"cfg_scale": 5.0, "temperature": 1.0}  # the official generation script
ACTS = {"gelu": nn.GELU, "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU, "relu": nn.ReLU}
# checkpoint key -> our key (regex, applied in order)
RENAMES = [
    (r"^model\.language_model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.language_model\.norm\.", "norm."),
    (r"^model\.language_model\.layers\.", "hf_layers."),
    (r"^model\.generation_embeddings\.", "image_embed.codes."),
    (r"^model\.generation_aligner\.fc1\.", "image_embed.fc1."),
    (r"^model\.generation_aligner\.hidden_layers\.", "image_embed.hidden."),
    (r"^model\.generation_head\.", "head."),
]
KEEP = ("tok_embeddings.", "norm.", "hf_layers.", "image_embed.", "head.")


def matches(config: dict) -> bool:
    return config.get("model_type") == NAME


def special_ids(directory: Path) -> dict[str, int]:
    """BOS, pad and begin-of-image ids from generation_config.json (where the official generate reads them)."""
    gen = read_json(directory / "generation_config.json")
    kw = gen.get("generation_kwargs") or {}
    try:
        return {"bos": int(gen["bos_token_id"]), "pad": int(gen["pad_token_id"]), "boi": int(kw.get("boi_token_id", gen.get("boi_token_id")))}
    except (KeyError, TypeError):
        raise ValueError(f"{directory}/generation_config.json: needs bos_token_id, pad_token_id and "
                         "generation_kwargs.boi_token_id") from None


def native_grid(config: dict) -> tuple[int, int]:
    n = int((config.get("vision_config") or {}).get("num_image_tokens", 576))
    side = math.isqrt(n)
    return side, side


def make_decoder(config: dict, ids: dict[str, int], where: str, height: int | None = None,
                 width: int | None = None) -> PromptDecoder:
    """The decoder a Janus ``config.json`` describes (random weights: ``build`` loads them), with the
    special ``ids`` (bos, pad, boi: ``special_ids``) for its unconditional prompt. Build it under
    ``torch.device("meta")`` to place no storage (it has no buffers)."""
    cfg = llama_config(config.get("text_config") or {}, where)
    vq = config.get("vq_config") or {}
    H, W = native_grid(config) if height is None else (height, width)
    try:
        codes, code_dim, proj = int(vq["num_embeddings"]), int(vq["embed_dim"]), int(vq["projection_dim"])
        depth, act = int(vq.get("num_hidden_layers", 2)), ACTS[vq.get("hidden_act", "gelu")]
        head_in = int(vq.get("image_token_embed_dim", cfg.dim))
    except KeyError as e:
        raise ValueError(f"{where}: vq_config lacks or has an unsupported {e}") from None
    return PromptDecoder(cfg, Layout(H, W, codes), AlignedEmbedding(codes, code_dim, proj, depth, act()),
                         MLPHead(head_in, proj, codes, act()), unconditional=("keep", (ids["bos"], ids["boi"]), ids["pad"]))


def build(directory: Path, config: dict, height: int | None = None, width: int | None = None):
    """(decoder, route): the model of this config (built by ``models.loading.skeleton``: parameters
    on meta) and where each checkpoint tensor goes in it."""
    model = make_decoder(config, special_ids(directory), str(directory), height, width)
    return model, decoder_route(RENAMES, KEEP, model.config)


def sampling(directory: Path, config: dict | None = None) -> dict:
    """The official defaults, with generation_config.json's ``guidance_scale`` as the CFG scale where it
    has one (transformers' generate reads its CFG scale there too)."""
    scale = read_json(Path(directory) / "generation_config.json").get("guidance_scale")
    return dict(DEFAULT_SAMPLING) if scale is None else {**DEFAULT_SAMPLING, "cfg_scale": float(scale)}


def encode(processor, texts: list[str], height: int, width: int, model=None) -> list[list[int]]:
    """The official image-generation prompt: the processor's chat template (a user turn, generation
    prompt) then begin-of-image."""
    prompts = []
    for t in texts:
        if getattr(processor, "chat_template", None):
            t = processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": t}]}],
                                              add_generation_prompt=True)
        prompts.append(processor(text=t, generation_mode="image")["input_ids"][0])
    return [list(map(int, p)) for p in prompts]


def load_vq(directory: Path, device: str | torch.device = "cpu"):
    """The image decoder of this checkpoint (``decode(codes, height, width)``, ``codebook``)."""
    from ..models.hf_vq import load_hf_vq

    return load_hf_vq(directory, device=device)


class Janus(Family):
    """Janus / Janus-Pro: text prompts through the processor's chat template; CFG rows from the
    model's own unconditional rule (``make_decoder``)."""

    name = NAME
    conditioning = "text"
    default_sampling = DEFAULT_SAMPLING
    matches = staticmethod(matches)
    build = staticmethod(build)
    sampling = staticmethod(sampling)
    encode = staticmethod(encode)
    image_decoder = staticmethod(load_vq)

    def native_grid(self, directory: Path, config: dict | None) -> tuple[int, int]:
        return native_grid(config or {})


FAMILY = Janus()
