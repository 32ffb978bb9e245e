"""Reading a Hugging Face checkpoint directory (config.json, safetensors single or sharded with
``model.safetensors.index.json``) into specvis's own decoder: key renaming as data, no transformers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from ..models.checkpoint import one_line
from ..models.decoder import DecoderConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path.parent}: missing {path.name}") from None
    except Exception as exc:  # noqa: BLE001
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
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(min(n, 100_000_000)))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except Exception as exc:  # noqa: BLE001 - any unreadable header is the same user error
            raise ValueError(f"{f}: unreadable safetensors header ({one_line(exc)})") from None
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
    if (directory / INDEX).exists():
        shards = sorted(set(read_json(directory / INDEX).get("weight_map", {}).values()))
        missing = [s for s in shards if not (directory / s).exists()]
        if not shards or missing:
            raise ValueError(f"{directory}: {INDEX} names missing shards {missing[:3] or '(none listed)'}")
        return [directory / s for s in shards]
    if (directory / SINGLE).exists():
        return [directory / SINGLE]
    raise ValueError(f"{directory}: no weights ({SINGLE} or {INDEX})")


def read_tensors(directory: Path, renames: list[tuple[str, str]], keep=lambda k: True) -> dict[str, torch.Tensor]:
    """Tensors of the checkpoint whose (renamed) key passes ``keep``; each rename is (regex, replacement),
    applied in order (e.g. a family's legacy key layout onto its current one)."""
    from safetensors import safe_open

    out = {}
    for f in weight_files(directory):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    name = key
                    for pattern, repl in renames:
                        name = re.sub(pattern, repl, name)
                    if keep(name):
                        out[name] = fh.get_tensor(key)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{f}: unreadable safetensors ({one_line(exc)})") from None
    return out


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
            attention_bias=bool(text.get("attention_bias", False)),
            max_positions=int(max_positions or text.get("max_position_embeddings", 4096)))
    except KeyError as e:
        raise ValueError(f"{where}: text config lacks {e}") from None
