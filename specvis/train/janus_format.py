"""Text-to-image models we train, in the Janus-Pro checkpoint format (``model_type: janus``).

Why Janus-Pro: its image tokenizer is LlamaGen's VQ, the architecture of our emoji VQ, so the shipped
VQ (and every code sequence tokenised with it) carries over unchanged into ``JanusVQVAE``; Janus
embeds codes through a small table and an MLP aligner and scores them with an MLP head, so the
language model keeps a text-only vocabulary.

``JanusSpec`` is the shape of such a model; ``new_decoder(spec)`` is the trainable specvis
``PromptDecoder`` built exactly as ``specvis.families.janus.build`` builds it from a checkpoint
(``Layout(grid, grid, codes)``, ``AlignedEmbedding``, ``MLPHead``, Janus's pad-prompt CFG rule), with
GPT-style initialisation N(0, 0.02). Prompts follow Janus image mode: BOS, the caption, begin-of-image.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..models.base import Layout
from ..models.decoder import AlignedEmbedding, DecoderConfig, MLPHead, PromptDecoder

__all__ = ["JanusSpec", "new_decoder", "SPECIAL_TOKENS"]

# Janus-Pro's special tokens under their official spellings (tokenizer.json of deepseek-ai/Janus-Pro-*).
SPECIAL_TOKENS = {
    "bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "pad": "<｜▁pad▁｜>",
    "image": "<image_placeholder>", "boi": "<begin_of_image>", "eoi": "<end_of_image>",
}


@dataclass
class JanusSpec:
    """A Janus-shaped text-to-image model: Llama text model + generation embedding/aligner/head."""

    text_vocab_size: int
    bos: int
    pad: int
    boi: int
    dim: int = 256
    n_layer: int = 5
    n_head: int = 4
    n_kv_head: int = 4
    ffn_hidden: int = 704
    codes: int = 1024  # VQ codebook size
    code_dim: int = 8  # VQ codebook embedding dim (generation_embeddings width)
    aligner_depth: int = 2
    grid: int = 16  # image tokens per side
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    max_positions: int = 320  # prompt + image tokens

    def to_dict(self) -> dict:
        return asdict(self)


def new_decoder(spec: JanusSpec, init_std: float = 0.02) -> PromptDecoder:
    """A randomly initialised, trainable Janus-layout ``PromptDecoder`` (GELU MLPs, as Janus-Pro)."""
    cfg = DecoderConfig(dim=spec.dim, n_layer=spec.n_layer, n_head=spec.n_head, n_kv_head=spec.n_kv_head,
                        ffn_hidden=spec.ffn_hidden, text_vocab_size=spec.text_vocab_size, norm_eps=spec.norm_eps,
                        rope_theta=spec.rope_theta, max_positions=spec.max_positions)
    model = PromptDecoder(cfg, Layout(spec.grid, spec.grid, spec.codes),
                          AlignedEmbedding(spec.codes, spec.code_dim, spec.dim, spec.aligner_depth, nn.GELU()),
                          MLPHead(spec.dim, spec.dim, spec.codes, nn.GELU()),
                          unconditional=("keep", (spec.bos, spec.boi), spec.pad))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
    return model
