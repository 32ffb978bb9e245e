"""The loaders specvis had before loading went through ``specvis.models.loading`` (commit c905d0c),
kept here as the reference the new ones must equal: every model built with its random
initialisation, the whole checkpoint read into a dict (``torch.load`` / ``safetensors`` without
memory maps), renamed and fused in memory, copied in with ``load_state_dict``, then cast to fp32.
A helper module for tests/test_loading.py (no tests here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from specvis.families import chameleon, detect, emu3, janus
from specvis.models.checkpoint import WEIGHTS_NAME, load_strict


def read_tensors(directory: Path, renames, keep) -> dict[str, torch.Tensor]:
    """Old ``families.hf.read_tensors``: every kept tensor of every shard, in one dict."""
    from safetensors.torch import load_file

    from specvis.families.hf import weight_files

    out = {}
    for f in weight_files(directory):
        for key, value in load_file(str(f)).items():
            name = key
            for pattern, repl in renames:
                name = re.sub(pattern, repl, name)
            if keep(name):
                out[name] = value
    return out


def interleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    d = w.shape[0] // heads
    idx = torch.arange(d).view(2, d // 2).t().reshape(-1)
    return w.view(heads, d, *w.shape[1:])[:, idx].reshape(w.shape)


def import_llama_layers(sd, prefix: str, n_layer: int, n_head: int, n_kv_head: int,
                        separate: bool = False) -> dict[str, torch.Tensor]:
    """Old ``models.decoder.import_llama_layers``; ``separate``: for a decoder declaring the Hugging
    Face attention layout (``qkv_layout="separate"``, rotate-half rotary), q/k/v and the q/k norms
    kept as stored instead of fused and interleaved."""
    if separate:
        return separate_llama_layers(sd, prefix, n_layer, n_head, n_kv_head)
    out = {}
    for i in range(n_layer):
        src, dst = f"{prefix}{i}.", f"layers.{i}."
        a = src + "self_attn."
        for kind in ("weight", "bias"):
            if a + f"q_proj.{kind}" not in sd:
                continue
            q = interleave_rows(sd[a + f"q_proj.{kind}"], n_head)
            k = interleave_rows(sd[a + f"k_proj.{kind}"], n_kv_head)
            out[dst + f"attention.wqkv.{kind}"] = torch.cat([q, k, sd[a + f"v_proj.{kind}"]])
            if a + f"o_proj.{kind}" in sd:
                out[dst + f"attention.wo.{kind}"] = sd[a + f"o_proj.{kind}"]
        for norm, heads in (("q_norm", n_head), ("k_norm", n_kv_head)):
            for kind in ("weight", "bias"):
                if a + f"{norm}.{kind}" in sd:
                    w = sd[a + f"{norm}.{kind}"].reshape(heads, -1)
                    out[dst + f"attention.{norm}.{kind}"] = interleave_rows(w.reshape(-1), heads).view(heads, -1)
        for ours, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[dst + f"feed_forward.{ours}.weight"] = sd[src + f"mlp.{theirs}.weight"]
        out[dst + "attention_norm.weight"] = sd[src + "input_layernorm.weight"]
        out[dst + "ffn_norm.weight"] = sd[src + "post_attention_layernorm.weight"]
    return out


def separate_llama_layers(sd, prefix: str, n_layer: int, n_head: int, n_kv_head: int) -> dict[str, torch.Tensor]:
    """``import_llama_layers`` for the Hugging Face attention layout: every tensor renamed, none reordered."""
    names = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
             "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}
    out = {}
    for i in range(n_layer):
        src, dst = f"{prefix}{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            for theirs, ours in names.items():
                if src + f"{theirs}.{kind}" in sd:
                    out[dst + f"{ours}.{kind}"] = sd[src + f"{theirs}.{kind}"]
            for norm, heads in (("q_norm", n_head), ("k_norm", n_kv_head)):
                if src + f"self_attn.{norm}.{kind}" in sd:
                    out[dst + f"attention.{norm}.{kind}"] = sd[src + f"self_attn.{norm}.{kind}"].reshape(heads, -1)
    return out


def hf_decoder(directory: Path):
    """Old ``families.load_decoder`` for the transformers-layout families (Janus, Emu3, Chameleon):
    the family builds its model (initialised: outside the meta-device context), the old dict path
    fills it."""
    directory = Path(directory)
    family, config = detect(directory)
    module = {"janus": janus, "emu3": emu3, "chameleon": chameleon}[family.name]
    model, _ = family.build(directory, config)
    sd = read_tensors(directory, module.RENAMES, lambda k: k.startswith(module.KEEP))
    if module is emu3:
        sd["head.weight"] = sd.pop("lm_head.weight")[torch.tensor(emu3.visual_ids(config, "")[0])]
    elif module is chameleon:
        sd["head.weight"] = sd.pop("lm_head.weight")[torch.tensor(chameleon.image_ids(config, ""))]
    cfg = model.config
    layers = import_llama_layers(sd, "hf_layers.", cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.qkv_layout == "separate")
    sd = {k: v for k, v in sd.items() if not k.startswith("hf_layers.")} | layers
    load_strict(model, sd, str(directory))
    return model.float().eval()


def whole_state_dict(path, prefer=("ema", "model", "state_dict")) -> dict[str, torch.Tensor]:
    """Old ``read_state_dict``: the whole file read by ``torch.load`` (no memory map)."""
    import argparse

    with torch.serialization.safe_globals([argparse.Namespace]):
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    for key in prefer:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            return obj[key]
    return obj


def same_class_loaded(new_model: torch.nn.Module, sd: dict[str, torch.Tensor], build) -> torch.nn.Module:
    """``build()`` (initialised) filled by ``load_state_dict`` with ``sd``, in fp32, as the old loaders did."""
    model = build()
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
    return model.float().eval()


def pretrained(directory: Path, build) -> torch.nn.Module:
    """Old ``from_pretrained``: config.json, the whole model.safetensors, ``load_strict`` into ``build(config)``."""
    from safetensors.torch import load_file

    config = json.loads((Path(directory) / "config.json").read_text())
    model = build(config)
    load_strict(model, load_file(str(Path(directory) / WEIGHTS_NAME)), str(directory))
    return model.eval()
