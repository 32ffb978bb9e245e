"""Reading a Hugging Face checkpoint directory (config.json, safetensors single or sharded with
``model.safetensors.index.json``) into specvis's own decoder: key renaming as data, no transformers."""

from __future__ import annotations

import json
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
        return DecoderConfig(
            dim=dim, n_layer=int(text["num_hidden_layers"]), n_head=heads,
            n_kv_head=int(text.get("num_key_value_heads") or heads), ffn_hidden=int(text["intermediate_size"]),
            text_vocab_size=int(text["vocab_size"]), norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
            attention_bias=bool(text.get("attention_bias", False)),
            max_positions=int(max_positions or text.get("max_position_embeddings", 4096)))
    except KeyError as e:
        raise ValueError(f"{where}: text config lacks {e}") from None
