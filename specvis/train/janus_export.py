"""Ship a trained Janus-layout ``PromptDecoder`` as an official transformers Janus-Pro checkpoint.

``export_janus(model, spec, vq, tokenizer, out)`` writes a directory that
``transformers.JanusForConditionalGeneration.from_pretrained`` and ``AutoProcessor.from_pretrained``
read as they read deepseek-community/Janus-Pro-*: ``config.json`` (``model_type: janus``),
``generation_config.json``, ``model.safetensors``, the tokenizer and processor files. specvis loads
it back through ``specvis.families.janus`` (``sv.load(out)``).

Weights, the exact inverse of specvis's importer:

- the language model, generation embeddings / aligner / head: the inverse of
  ``specvis.families.janus.RENAMES`` and of ``families.hf.llama_layer_route``: a fused ``wqkv`` (a
  trained ``janus_format`` decoder) split into q/k/v projections, separate ``wq``/``wk``/``wv`` (a
  loaded Janus checkpoint) taken as they are; q and k rows of a decoder with interleaved rotary
  (``rope_pairs``) de-interleaved from (2i, 2i+1) pairs back to rotate-half pairs;
- the VQ (``model.vqmodel.*``): our LlamaGen ``VQModel`` under JanusVQVAE's module names
  (``conv_blocks.i`` -> ``down.i`` / ``up.i``, ``res.j`` -> ``block.j``, ``mid.0/1/2`` ->
  ``mid.block_1/attn_1/block_2``). JanusVQVAE hard-codes GroupNorm(32) and L2-normalised code
  lookup and has one channel multiplier list for encoder and decoder; a VQ it cannot represent is
  refused with a one-line ValueError;
- the SigLIP understanding tower (``model.vision_model``, ``model.aligner``) is unused by image
  generation: a tiny one (patch = VQ downsample, so its image size is the VQ image size and its
  token count the image grid), randomly initialised from ``seed``; the text ``lm_head`` is tied to
  the token embeddings (``tie_word_embeddings``), as JanusConfig defaults.

Prompts are BOS + caption + begin-of-image: ``JanusProcessor(text, generation_mode="image")`` with
no chat template (``specvis.families.janus.encode`` applies a chat template only when the processor
has one). The directory is written next to ``out`` under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from ..models.decoder import PromptDecoder
from ..models.vq import VQModel
from .janus_format import SPECIAL_TOKENS, JanusSpec

__all__ = ["export_janus", "janus_vq_config", "vq_state_dict_to_janus", "decoder_state_dict_to_janus",
           "deinterleave_rows"]

# our LlamaGen VQ key -> JanusVQVAE key (regex, applied in order; every key must change or be kept as is)
VQ_RENAMES = [
    (r"^encoder\.conv_blocks\.(\d+)\.res\.", r"encoder.down.\1.block."),
    (r"^encoder\.conv_blocks\.(\d+)\.", r"encoder.down.\1."),
    (r"^decoder\.conv_blocks\.(\d+)\.res\.", r"decoder.up.\1.block."),
    (r"^decoder\.conv_blocks\.(\d+)\.", r"decoder.up.\1."),
    (r"^(encoder|decoder)\.mid\.0\.", r"\1.mid.block_1."),
    (r"^(encoder|decoder)\.mid\.1\.", r"\1.mid.attn_1."),
    (r"^(encoder|decoder)\.mid\.2\.", r"\1.mid.block_2."),
]
# our decoder key prefix -> checkpoint key prefix (inverse of specvis.families.janus.RENAMES)
DECODER_PREFIXES = [
    ("tok_embeddings.", "model.language_model.embed_tokens."),
    ("norm.", "model.language_model.norm."),
    ("image_embed.codes.", "model.generation_embeddings."),
    ("image_embed.fc1.", "model.generation_aligner.fc1."),
    ("image_embed.hidden.", "model.generation_aligner.hidden_layers."),
    ("head.", "model.generation_head."),
]
JANUS_GROUPS = 32  # JanusVQVAEResnetBlock / AttnBlock / norm_out: GroupNorm(num_groups=32)


def deinterleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Per head, output rows from interleaved pairs (2i, 2i + 1) back to rotate-half pairs (i, i + d/2)
    (the inverse of interleaving: new[j] = old[idx[j]], idx = 0, d/2, 1, d/2 + 1, ...)."""
    d = w.shape[0] // heads
    idx = torch.arange(d).view(2, d // 2).t().reshape(-1)
    inv = torch.argsort(idx)  # old[i] = new[inv[i]]
    return w.reshape(heads, d, *w.shape[1:])[:, inv].reshape(w.shape)


def decoder_state_dict_to_janus(model: PromptDecoder) -> dict[str, torch.Tensor]:
    """Our decoder's tensors under JanusForConditionalGeneration's names (``model.language_model.*``,
    ``model.generation_*``). Every tensor of ``model`` is used exactly once, else ValueError."""
    cfg = model.config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    hd = cfg.dim // cfg.n_head
    nq, nk = cfg.n_head * hd, cfg.n_kv_head * hd
    interleaved = cfg.rope_pairs == "interleaved"
    for i in range(cfg.n_layer):
        src, dst = f"layers.{i}.", f"model.language_model.layers.{i}."
        for kind in ("weight", "bias"):
            key = src + f"attention.wqkv.{kind}"
            if key in sd:
                w = sd[key]
                if w.shape[0] != nq + 2 * nk:
                    raise ValueError(f"{key}: {w.shape[0]} rows, expected {nq + 2 * nk} (q {nq} + k {nk} + v {nk})")
                parts = {"q": w[:nq], "k": w[nq:nq + nk], "v": w[nq + nk:]}
                used.add(key)
            else:
                parts = {p: sd[src + f"attention.w{p}.{kind}"] for p in "qkv" if src + f"attention.w{p}.{kind}" in sd}
                used.update(src + f"attention.w{p}.{kind}" for p in parts)
            for p, w in parts.items():
                heads = {"q": cfg.n_head, "k": cfg.n_kv_head}.get(p)
                out[dst + f"self_attn.{p}_proj.{kind}"] = deinterleave_rows(w, heads) if interleaved and heads else w
        for ours, theirs in (("attention.wo", "self_attn.o_proj"), ("feed_forward.w1", "mlp.gate_proj"),
                             ("feed_forward.w3", "mlp.up_proj"), ("feed_forward.w2", "mlp.down_proj"),
                             ("attention_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
            for kind in ("weight", "bias"):
                key = src + f"{ours}.{kind}"
                if key in sd:
                    out[dst + f"{theirs}.{kind}"] = sd[key]
                    used.add(key)
    for key, value in sd.items():
        for ours, theirs in DECODER_PREFIXES:
            if key.startswith(ours):
                out[theirs + key[len(ours):]] = value
                used.add(key)
                break
    left = sorted(set(sd) - used)
    if left:
        raise ValueError(f"decoder tensor {left[0]} has no place in the Janus checkpoint ({len(left)} unmapped)")
    return out


def vq_state_dict_to_janus(vq: VQModel) -> dict[str, torch.Tensor]:
    """Our LlamaGen VQ's tensors under JanusVQVAE's names (without the ``model.vqmodel.`` prefix)."""
    out = {}
    for key, value in vq.state_dict().items():
        name = key
        for pattern, repl in VQ_RENAMES:
            name = re.sub(pattern, repl, name)
        out[name] = value.detach()
    return out


def janus_vq_config(vq: VQModel, spec: JanusSpec) -> dict:
    """JanusVQVAEConfig fields for our VQ, or a one-line ValueError naming what JanusVQVAE cannot hold."""
    c = vq.config
    if list(c.encoder_ch_mult) != list(c.decoder_ch_mult):
        raise ValueError(f"VQ encoder_ch_mult {c.encoder_ch_mult} != decoder_ch_mult {c.decoder_ch_mult}: "
                         "JanusVQVAE has one channel_multiplier for both")
    if not c.codebook_l2_norm:
        raise ValueError("VQ codebook_l2_norm is false: JanusVQVAE always L2-normalises looked-up codes")
    if c.norm_groups != JANUS_GROUPS:
        raise ValueError(f"VQ norm_groups {c.norm_groups} != {JANUS_GROUPS}: JanusVQVAE hard-codes GroupNorm(32)")
    if c.codebook_size != spec.codes:
        raise ValueError(f"VQ codebook_size {c.codebook_size} != spec.codes {spec.codes}")
    if c.codebook_embed_dim != spec.code_dim:
        raise ValueError(f"VQ codebook_embed_dim {c.codebook_embed_dim} != spec.code_dim {spec.code_dim}")
    return dict(embed_dim=c.codebook_embed_dim, num_embeddings=c.codebook_size, double_latent=False,
                latent_channels=c.z_channels, in_channels=3, out_channels=3, base_channels=c.ch,
                channel_multiplier=list(c.encoder_ch_mult), num_res_blocks=c.num_res_blocks,
                dropout=float(c.dropout_p), num_patches=spec.grid, projection_dim=spec.dim,
                num_hidden_layers=spec.aligner_depth, hidden_act="gelu", image_token_embed_dim=spec.dim)


def _check_spec(model: PromptDecoder, spec: JanusSpec) -> None:
    cfg, lay = model.config, model.layout
    pairs = {"dim": (cfg.dim, spec.dim), "n_layer": (cfg.n_layer, spec.n_layer), "n_head": (cfg.n_head, spec.n_head),
             "n_kv_head": (cfg.n_kv_head, spec.n_kv_head), "ffn_hidden": (cfg.ffn_hidden, spec.ffn_hidden),
             "text_vocab_size": (cfg.text_vocab_size, spec.text_vocab_size), "norm_eps": (cfg.norm_eps, spec.norm_eps),
             "rope_theta": (cfg.rope_theta, spec.rope_theta), "codes": (lay.vocab_size, spec.codes),
             "grid": ((lay.height, lay.width), (spec.grid, spec.grid)),
             "aligner_depth": (len(model.image_embed.hidden) + 1, spec.aligner_depth)}
    for name, (ours, theirs) in pairs.items():
        if ours != theirs:
            raise ValueError(f"model {name} {ours} != spec.{name} {theirs}")
    if getattr(cfg, "qk_norm", False):
        raise ValueError("model has qk_norm: a Janus (Llama) text model has none")


def _tokenizer_ids(tokenizer, spec: JanusSpec) -> dict[str, int]:
    vocab = tokenizer.get_vocab()
    ids = {}
    for name, text in SPECIAL_TOKENS.items():
        if text not in vocab:
            raise ValueError(f"tokenizer lacks the special token {name} {text!r}")
        ids[name] = int(vocab[text])
    for name in ("bos", "pad", "boi"):
        if ids[name] != getattr(spec, name):
            raise ValueError(f"tokenizer id of {name} is {ids[name]}, spec.{name} is {getattr(spec, name)}")
    if len(tokenizer) > spec.text_vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, spec.text_vocab_size is {spec.text_vocab_size}")
    return ids


def _janus_tokenizer(tokenizer):
    """A copy of ``tokenizer`` (its ``tokenizers`` core, the caller's object untouched) that names
    Janus's image / begin / end-of-image tokens (``extra_special_tokens``: what JanusProcessor reads),
    BOS / EOS / pad, and pads on the left."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    extra = {"image_token": SPECIAL_TOKENS["image"], "boi_token": SPECIAL_TOKENS["boi"],
             "eoi_token": SPECIAL_TOKENS["eoi"]}
    named = {k: getattr(tokenizer, k, None) for k in ("unk_token", "model_max_length")}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()),
                                   bos_token=SPECIAL_TOKENS["bos"], eos_token=SPECIAL_TOKENS["eos"],
                                   pad_token=SPECIAL_TOKENS["pad"], padding_side="left", extra_special_tokens=extra,
                                   **{k: v for k, v in named.items() if v is not None})


def _build(model: PromptDecoder, spec: JanusSpec, vq: VQModel, ids: dict[str, int], seed: int):
    from transformers import JanusConfig, JanusForConditionalGeneration, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig

    cfg = model.config
    text = LlamaConfig(vocab_size=spec.text_vocab_size, hidden_size=spec.dim, intermediate_size=spec.ffn_hidden,
                       num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                       num_key_value_heads=spec.n_kv_head, head_dim=spec.dim // spec.n_head,
                       max_position_embeddings=spec.max_positions, rms_norm_eps=spec.norm_eps,
                       rope_parameters={"rope_type": "default", "rope_theta": float(spec.rope_theta)},
                       attention_bias=bool(cfg.attention_bias), mlp_bias=False, hidden_act="silu",
                       bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    f = vq.config.downsample
    # the understanding tower sees images of the VQ's size in patches of the VQ's downsample: its
    # token count is the image grid (JanusConfig sets vq_config.num_patches = image_size // patch_size)
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               image_size=f * spec.grid, patch_size=f, mlp_ratio=2.0, projection_dim=spec.dim,
                               depth=2, num_image_tokens=spec.grid * spec.grid)
    vq_cfg = JanusVQVAEConfig(**janus_vq_config(vq, spec))
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq_cfg, image_token_id=ids["image"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = JanusForConditionalGeneration(config).eval()
    if hf.config.vq_config.num_patches != spec.grid:
        raise AssertionError(f"JanusConfig set num_patches {hf.config.vq_config.num_patches}, expected {spec.grid}")

    ours = decoder_state_dict_to_janus(model)
    ours |= {"model.vqmodel." + k: v for k, v in vq_state_dict_to_janus(vq).items()}
    target = hf.state_dict()
    unexpected = sorted(set(ours) - set(target))
    if unexpected:
        raise ValueError(f"exported tensor {unexpected[0]} is not a JanusForConditionalGeneration tensor "
                         f"({len(unexpected)} such)")
    for key, value in ours.items():
        if tuple(value.shape) != tuple(target[key].shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)} != JanusForConditionalGeneration's {tuple(target[key].shape)}")
    # the only tensors not from our model: the unused understanding tower and the text head (tied)
    own = ("model.language_model.", "model.generation_", "model.vqmodel.")
    missing = sorted(k for k in target if k.startswith(own) and k not in ours)
    if missing:
        raise ValueError(f"JanusForConditionalGeneration tensor {missing[0]} was not filled ({len(missing)} such)")
    state = {k: v for k, v in target.items() if not k.startswith(own)} | ours
    hf.load_state_dict({k: v.to(target[k].dtype).contiguous() for k, v in state.items()}, strict=True)
    if hf.lm_head.weight.data_ptr() != hf.model.language_model.embed_tokens.weight.data_ptr():
        raise AssertionError("lm_head is not tied to the token embeddings")

    gc = hf.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = True, 1.0, 1.0, None
    gc._from_model_config = False  # else generation_kwargs (boi_token_id) is dropped on load
    gc.generation_kwargs = {"boi_token_id": ids["boi"]}
    return hf


def export_janus(model: PromptDecoder, spec: JanusSpec, vq: VQModel, tokenizer, out: str | Path,
                 guidance_scale: float = 3.0, seed: int = 0, overwrite: bool = False) -> Path:
    """Write ``model`` (a Janus-layout ``PromptDecoder`` of shape ``spec``), its VQ ``vq`` and
    ``tokenizer`` (a ``PreTrainedTokenizerFast`` holding ``SPECIAL_TOKENS``, BOS added by its post
    processor) to ``out`` as a transformers Janus-Pro checkpoint; returns ``out``. ``guidance_scale``
    is the checkpoint's default CFG scale; ``seed`` draws the unused understanding tower. Refuses an
    existing non-empty ``out`` unless ``overwrite``. One-line ValueError on any mismatch."""
    from transformers import JanusImageProcessorPil, JanusProcessor

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"{out} exists and is not empty (pass overwrite=True to replace it)")
    if not guidance_scale > 1:
        raise ValueError(f"guidance_scale must be > 1 (transformers' Janus image generation), got {guidance_scale}")
    _check_spec(model, spec)
    ids = _tokenizer_ids(tokenizer, spec)
    janus_vq_config(vq, spec)  # refuse an unrepresentable VQ before writing anything

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tok = _janus_tokenizer(tokenizer)
        hf = _build(model, spec, vq, ids, seed)
        hf.generation_config.guidance_scale = float(guidance_scale)
        side = vq.config.downsample * spec.grid
        image_processor = JanusImageProcessorPil(size={"height": side, "width": side})
        processor = JanusProcessor(image_processor=image_processor, tokenizer=tok, chat_template=None,
                                   use_default_system_prompt=False, num_image_tokens=spec.grid * spec.grid)
        probe = processor(text="a", generation_mode="image")["input_ids"][0]
        probe = [int(i) for i in probe]
        if probe[0] != ids["bos"] or probe[-1] != ids["boi"]:
            raise ValueError(f"tokenizer: an image-mode prompt must start with BOS {ids['bos']} and end with "
                             f"begin-of-image {ids['boi']}, got {probe} (does its post processor add BOS?)")
        hf.save_pretrained(str(tmp))
        processor.save_pretrained(str(tmp))
        (tmp / "specvis_export.json").write_text(json.dumps({"spec": spec.to_dict(), "vq": asdict(vq.config),
                                                             "seed": seed}, indent=2, default=list))
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            try:
                tmp.rename(out)
            except BaseException:
                (old / out.name).rename(out)  # put the previous export back
                raise
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
