"""Reading a Hugging Face checkpoint directory (config.json, safetensors single or sharded with
``model.safetensors.index.json``) into specvis's own decoder: key renaming as data (a route from each
file key to the rows of our tensors it fills, ``models.loading``), no transformers."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from typing import Callable, Sequence

import torch

from ..checks import one_line
from ..io import read_text, regular_file
from ..models.decoder import DecoderConfig
from ..models.loading import Piece, Route, check_header, rename_with, safetensors_files

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
HF_ATTENTION = ("separate", "half")
"""(``qkv_layout``, ``rope_pairs``) of the Hugging Face Llama layout: q_proj, k_proj, v_proj stored
apart, each head's rows in rotate-half order (transformers' ``rotate_half``)."""


def read_json(path: Path) -> dict:
    """A checkpoint's JSON object file (``io.read_text``: a regular file of bounded size)."""
    if not path.exists():
        raise ValueError(f"{path.parent}: missing {path.name}")
    text = read_text(path, "checkpoint file")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: unreadable JSON ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    return data


def stored_numel(directory: Path) -> int:
    """Elements of every tensor in the checkpoint's safetensors files, from their headers alone."""
    import struct

    total = 0
    for f in weight_files(directory):
        try:
            regular_file(f, "checkpoint file")
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(min(n, 100_000_000)))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except Exception as exc:  # noqa: BLE001 - any unreadable header is the same user error
            raise ValueError(f"{f}: unreadable safetensors header ({one_line(exc)})") from None
        check_header(f, header, os.stat(f).st_size - 8 - n)
    return total


STORED_KEYS = ("vocab_size", "num_embeddings", "codebook_size", "hidden_size", "intermediate_size")


def check_text_size(config: dict, directory: Path) -> None:
    """config.json must not describe modules larger than the weights stored, so that inflated sizes
    are refused before a module of that size is allocated: each ``STORED_KEYS`` size (a table or
    matrix dimension: its module stores at least that many weights) and a Llama-style text config
    (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``, ``vocab_size``) as a whole."""
    have = stored_numel(directory)

    def walk(c: dict, path: str = "") -> None:
        for key, value in c.items():
            if isinstance(value, dict):
                walk(value, f"{path}{key}.")
            elif key in STORED_KEYS and isinstance(value, int) and value > have:
                raise ValueError(f"{directory}/config.json: {path}{key} {value:,} is more than the checkpoint's "
                                 f"{have:,} stored weights: the config does not match the weights")

    walk(config)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        d, n, f, v = (int(text[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    except (KeyError, TypeError, ValueError):
        return
    wanted = n * (2 * d * d + 2 * d * f) + v * d  # a lower bound: q and o, two MLP matrices, the embedding
    if wanted > have:
        raise ValueError(f"{directory}/config.json: its sizes (hidden_size {d}, num_hidden_layers {n}, intermediate_size "
                         f"{f}, vocab_size {v}) need at least {wanted:,} weights, the checkpoint stores {have:,}: "
                         "the config does not match the weights")


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards its index names, or model.safetensors."""
    return safetensors_files(directory)


def head_norm(heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Chameleon's per-head q/k norm affine (heads * head_dim or (heads, head_dim)) as (heads, head_dim):
    a view of the stored tensor (the rows keep the file's rotate-half order, as q and k do)."""
    return lambda w: w.reshape(heads, -1)


def llama_layer_route(cfg: DecoderConfig, prefix: str = "hf_layers.") -> Callable[[str], Sequence[Piece]]:
    """A Hugging Face Llama layer key under ``prefix`` -> where it goes in our blocks, for the
    Hugging Face attention layout ``llama_config`` declares (separate projections, rotate-half
    rotary): q/k/v_proj -> wq/wk/wv and Chameleon's per-head q/k norms as stored (no row is moved, so
    on the CPU each stays in the file's mapping: ``models.loading.maps_in_place``), o -> wo,
    gate/up/down -> w1/w3/w2, the two layer norms -> attention_norm / ffn_norm. Other keys of a layer
    (e.g. stored rotary tables) are skipped."""
    if (cfg.qkv_layout, cfg.rope_pairs) != HF_ATTENTION:
        raise ValueError(f"llama_layer_route reads the Hugging Face attention layout (qkv_layout, rope_pairs) = "
                         f"{HF_ATTENTION}, got {(cfg.qkv_layout, cfg.rope_pairs)}")
    attn = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv"}
    plain = {"self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(.+)\.(weight|bias)$")

    def route(key: str) -> Sequence[Piece]:
        m = pattern.match(key)
        if m is None:
            return ()
        dst, module, kind = f"layers.{m.group(1)}.", m.group(2), m.group(3)
        proj = module.removeprefix("self_attn.")
        if proj in attn:
            return (Piece(f"{dst}attention.{attn[proj]}.{kind}"),)
        if proj in ("q_norm", "k_norm"):
            return (Piece(f"{dst}attention.{proj}.{kind}", None, head_norm(cfg.n_head if proj == "q_norm" else cfg.n_kv_head)),)
        if module in plain:
            return (Piece(f"{dst}{plain[module]}.{kind}"),)
        return ()

    return route


def decoder_route(renames: list[tuple[str, str]], keep: tuple[str, ...], cfg: DecoderConfig,
                  special: dict[str, Piece] | None = None) -> Route:
    """A family's file key -> our pieces: ``renames`` (regex, replacement) applied in order; Llama
    layers (``hf_layers.``) by ``llama_layer_route``; a renamed key in ``special`` to its piece (e.g.
    Emu3's ``lm_head.weight`` -> the image rows of ``head.weight``); other keys starting with one of
    ``keep`` to the tensor of that name; the rest (vision tower, VQ model) not read."""
    rename = rename_with(renames)
    layers = llama_layer_route(cfg)
    special = special or {}

    def route(key: str) -> Sequence[Piece] | None:
        name = rename(key)
        if name.startswith("hf_layers."):
            return layers(name)
        if name in special:
            return (special[name],)
        return (Piece(name),) if name.startswith(keep) else ()

    return route


def rows_of(ids: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Rows ``ids`` of a (vocab, dim) table (the image vocabulary of a text-vocabulary head)."""
    index = torch.tensor(ids)
    return lambda w: w[index]


def llama_config(text: dict, where: str, max_positions: int | None = None) -> DecoderConfig:
    """DecoderConfig from a transformers Llama-style text config (hidden_size, num_attention_heads ...)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"{where}: rope type {kind!r} is not supported (supported: default)")
    try:
        heads = int(text["num_attention_heads"])
        dim = int(text["hidden_size"])
        kv = int(text.get("num_key_value_heads") or heads)
        if heads < 1 or kv < 1 or dim % heads or heads % kv:
            raise ValueError(f"{where}: hidden_size {dim} must be a multiple of num_attention_heads {heads}, and that "
                             f"of num_key_value_heads {kv}")
        return DecoderConfig(
            dim=dim, n_layer=int(text["num_hidden_layers"]), n_head=heads,
            n_kv_head=int(text.get("num_key_value_heads") or heads), ffn_hidden=int(text["intermediate_size"]),
            text_vocab_size=int(text["vocab_size"]), norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
            attention_bias=bool(text.get("attention_bias", False)), qkv_layout=HF_ATTENTION[0], rope_pairs=HF_ATTENTION[1],
            max_positions=int(max_positions or text.get("max_position_embeddings", 4096)))
    except KeyError as e:
        raise ValueError(f"{where}: text config lacks {e}") from None
