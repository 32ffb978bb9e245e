"""Tiny random Janus-Pro and Emu3 checkpoints in the Hugging Face ``transformers`` layout, and
transformers' own reference behaviour on them. A helper module for tests (no tests here).

``make_janus(dir)`` / ``make_emu3(dir)`` build a seeded random ``JanusForConditionalGeneration`` /
``Emu3ForConditionalGeneration`` offline in about a second and write it like the official hub
repositories: config.json, generation_config.json, model.safetensors (or, with ``shards=True``,
several ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json``), the tokenizer
files, and the processor files, so ``AutoProcessor.from_pretrained(dir)`` gives the family's own
``JanusProcessor`` / ``Emu3Processor`` (hence the official prompt templating) with no network.

Sizes: hidden 64, 2 layers, 4 heads (Janus 4 kv heads, Emu3 2), codebook 32. Janus: 4x4 image
tokens (16x16 px); Emu3: 3 rows x 4 columns (12x16 px), each row followed by an end-of-line token.
The tokenizers are character level (every printable ASCII character is a token) plus each family's
special tokens under their official spellings; Emu3's ``<|visual token 0000NN|>`` tokens are the
last 32 ids of its vocabulary, as in the real one.

Weights are re-drawn so that the models are far from degenerate: matrices ~ N(0, 1/fan_in),
embeddings ~ N(0, 1), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2), and the image head
(Janus ``generation_head.vision_head``, Emu3 ``lm_head``) scaled by ``HEAD_GAIN``: logits have a
standard deviation of a few units, laws are peaked and greedy argmax ties are negligible. Janus's
image-token input (generation aligner output) is scaled by ``INPUT_GAIN`` so that greedy decoding
does not lock onto one repeated code. rope_theta is deliberately not the family default (Janus 500,
Emu3 2000) so an importer that ignores the config is caught.

Reference functions (transformers' code paths, float32, CPU):

- ``prompt_ids(dir, prompts, negative_prompt="")``: the exact conditional and unconditional rows
  the reference feeds (``input_ids``/``attention_mask`` and ``uncond_input_ids``/``uncond_attention_mask``).
- ``hf_greedy_image_tokens(dir, prompts, cfg_scale)``: ``generate`` greedily with CFG (Janus
  ``generation_mode="image"``; Emu3 with the row-end layout constraint and a negative prompt),
  codes (B, H*W) in [0, 32) with structural tokens removed.
- ``hf_logits(dir, input_ids, ...)``: raw logits of full sequences as transformers computes them
  (Janus: generation head over image tokens fed through the generation embeddings + aligner;
  Emu3: lm_head over the whole vocabulary).
- ``image_stream_ids(dir, codes)``: codes -> the token ids that represent them in the model's stream.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

__all__ = [
    "CODEBOOK", "JANUS_GRID", "EMU3_GRID", "FIXTURE_FILE",
    "make_janus", "make_emu3", "read_fixture", "load_hf_model", "load_processor",
    "prompt_ids", "hf_greedy_image_tokens", "hf_logits", "image_stream_ids", "emu3_allowed_tokens",
]

CODEBOOK = 32
HIDDEN = 64
INPUT_GAIN = 0.3  # Janus image-token embeddings are scaled down: the context, not the last code, drives the next
HEAD_GAIN = 4.0  # image-head weights are scaled up so that next-token laws are peaked, not near uniform
JANUS_GRID = (4, 4)
EMU3_GRID = (3, 4)
FIXTURE_FILE = "specvis_fixture.json"  # what the fixture is (family, grid, special ids); not an HF file

# official token spellings (DeepSeek LLM tokenizer of Janus-Pro; Qwen-based tokenizer of Emu3)
JANUS_TOKENS = {
    "bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "pad": "<｜▁pad▁｜>",
    "image": "<image_placeholder>", "boi": "<begin_of_image>", "eoi": "<end_of_image>",
}
EMU3_TOKENS = {
    "pad": "<|endoftext|>", "image": "<image>", "eol": "<|extra_200|>", "eof": "<|extra_201|>",
    "bos": "<|extra_203|>", "eos": "<|extra_204|>", "boi": "<|image start|>", "eoi": "<|image end|>",
    "wrapper": "<|image token|>",
}

# Our own chat template; for a single user text message it renders the official Janus-Pro format
# "<|User|>: {text}\n\n<|Assistant|>:" (the DeepSeek sft template with an empty system prompt).
JANUS_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<|User|>: ' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ '<|Assistant|>: ' }}"
    "{%- else -%}{{ message['role'] | capitalize ~ ': ' }}{%- endif -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<image_placeholder>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if message['role'] == 'user' -%}{{ '\n\n' }}{%- else -%}<｜end▁of▁sentence｜>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|Assistant|>:{%- endif -%}"
)

_TEXT_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


# --------------------------------------------------------------------------- building


def _char_tokenizer(specials: list[str], extra: list[str], unk: str, bos: str | None, extra_special: dict,
                    **named):
    """A character-level WordLevel tokenizer: specials first, then the characters, then ``extra``
    (added, non-special tokens); wrapped as a PreTrainedTokenizerFast padding on the left."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in [*specials, *_TEXT_CHARS, *extra]:
        vocab.setdefault(tok, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials)
    if extra:
        core.add_tokens(extra)
    if bos is not None:
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=unk, padding_side="left",
                                   model_max_length=4096, extra_special_tokens=extra_special, **named)


@torch.no_grad()
def _redraw(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Non-degenerate random weights (see the module docstring)."""
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            if isinstance(_owner(module, name), torch.nn.Embedding):
                std = 1.0
            else:
                std = 1.0 / (p[0].numel() ** 0.5)  # fan_in of Linear (out, in) / Conv (out, in, k...)
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        else:  # norm scales
            p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)


def _owner(root: torch.nn.Module, param_name: str) -> torch.nn.Module:
    return root.get_submodule(param_name.rsplit(".", 1)[0]) if "." in param_name else root


def _save(model, processor, path: Path, shards: bool, info: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, max_shard_size="400KB" if shards else "50GB")
    processor.save_pretrained(path)
    with open(path / FIXTURE_FILE, "w") as f:
        json.dump(info, f, indent=2)
    load_hf_model.cache_clear()
    load_processor.cache_clear()
    return path


def make_janus(dir: str | os.PathLike, seed: int = 0, shards: bool = False) -> Path:
    """A tiny random Janus-Pro checkpoint (JanusForConditionalGeneration) written to ``dir``."""
    from transformers import (JanusConfig, JanusForConditionalGeneration, JanusImageProcessorPil,
                              JanusProcessor, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig)

    t = JANUS_TOKENS
    specials = [t["bos"], t["eos"], t["pad"], t["image"], t["boi"], t["eoi"]]
    tok = _char_tokenizer(specials, [], unk=t["pad"], bos=t["bos"],
                          extra_special={"image_token": t["image"], "boi_token": t["boi"], "eoi_token": t["eoi"]},
                          bos_token=t["bos"], eos_token=t["eos"], pad_token=t["pad"])
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in t.items()}
    side = JANUS_GRID[0]
    text = LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                       bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16 * side,
                               patch_size=16, mlp_ratio=2.0, projection_dim=HIDDEN, depth=2,
                               num_image_tokens=side * side)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=CODEBOOK, latent_channels=32, base_channels=32,
                          channel_multiplier=[1, 1, 2], num_res_blocks=1, projection_dim=HIDDEN,
                          num_hidden_layers=2, image_token_embed_dim=HIDDEN)
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=ids["image"])
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config).eval()
    _redraw(model, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.model.generation_head.vision_head.weight.mul_(HEAD_GAIN)
        for t in (model.model.generation_aligner.hidden_layers[-1].weight, model.model.generation_aligner.hidden_layers[-1].bias):
            t.mul_(INPUT_GAIN)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
    gc.guidance_scale = 5.0
    gc._from_model_config = False  # as convert_janus_weights_to_hf.py: else extra keys are dropped on load
    gc.generation_kwargs = {"boi_token_id": ids["boi"]}
    image_processor = JanusImageProcessorPil(size={"height": 16 * side, "width": 16 * side})
    processor = JanusProcessor(image_processor=image_processor, tokenizer=tok, chat_template=JANUS_CHAT_TEMPLATE,
                               use_default_system_prompt=True, num_image_tokens=side * side)
    info = {"family": "janus", "height": side, "width": side, "codebook": CODEBOOK, "seed": seed,
            "token_ids": ids}
    return _save(model, processor, Path(dir), shards, info)


def make_emu3(dir: str | os.PathLike, seed: int = 0, shards: bool = False) -> Path:
    """A tiny random Emu3 (Gen) checkpoint (Emu3ForConditionalGeneration) written to ``dir``."""
    from transformers import (Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor,
                              Emu3TextConfig, Emu3VQVAEConfig)

    t = EMU3_TOKENS
    specials = [t[k] for k in ("pad", "image", "eol", "eof", "bos", "eos", "boi", "eoi", "wrapper")]
    visual = [f"<|visual token {i:06d}|>" for i in range(CODEBOOK)]
    tok = _char_tokenizer(specials, visual, unk=t["pad"], bos=None,
                          extra_special={"image_token": t["image"], "boi_token": t["boi"], "eoi_token": t["eoi"],
                                         "image_wrapper_token": t["wrapper"], "eof_token": t["eof"]},
                          bos_token=t["bos"], eos_token=t["eos"], pad_token=t["pad"])
    vocab = tok.get_vocab()
    ids = {k: vocab[v] for k, v in t.items()}
    height, width = EMU3_GRID
    text = Emu3TextConfig(vocab_size=len(vocab), hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 2000.0},
                          attention_dropout=0.0, pad_token_id=ids["pad"], bos_token_id=ids["bos"],
                          eos_token_id=ids["eos"])
    vq = Emu3VQVAEConfig(codebook_size=CODEBOOK, embed_dim=4, latent_channels=4, base_channels=32,
                         channel_multiplier=[1, 1, 2], num_res_blocks=1, attn_resolutions=[2],
                         temporal_downsample_factor=4, hidden_size=64, num_attention_heads=1)
    config = Emu3Config(vq_config=vq, text_config=text, vocabulary_map=vocab)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    _redraw(model.model.text_model, torch.Generator().manual_seed(seed))
    _redraw(model.lm_head, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_GAIN)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
    image_processor = Emu3ImageProcessor(spatial_factor=4, min_pixels=64, max_pixels=64 * 64)
    processor = Emu3Processor(image_processor=image_processor, tokenizer=tok)
    # Emu3Processor turns (ratio "W:H", image_area) into the token grid with its fixed factor 8:
    # "4:3" and 768 = (3*8)*(4*8) give 3 rows x 4 columns.
    info = {"family": "emu3", "height": height, "width": width, "codebook": CODEBOOK, "seed": seed,
            "ratio": f"{width}:{height}", "image_area": height * width * 64, "token_ids": ids,
            "visual_token_ids": [vocab[v] for v in visual]}
    return _save(model, processor, Path(dir), shards, info)


# --------------------------------------------------------------------------- loading


def read_fixture(dir: str | os.PathLike) -> dict:
    with open(Path(dir) / FIXTURE_FILE) as f:
        return json.load(f)


@functools.lru_cache(maxsize=8)
def _load_model(path: str, mtime: float):
    import transformers

    family = read_fixture(path)["family"]
    cls = transformers.JanusForConditionalGeneration if family == "janus" else transformers.Emu3ForConditionalGeneration
    return cls.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()


def load_hf_model(dir: str | os.PathLike):
    """The checkpoint loaded with transformers' ``from_pretrained`` (float32, eval; cached)."""
    path = str(Path(dir).resolve())
    return _load_model(path, os.path.getmtime(os.path.join(path, "config.json")))


load_hf_model.cache_clear = _load_model.cache_clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=8)
def _load_processor(path: str, mtime: float):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, local_files_only=True)


def load_processor(dir: str | os.PathLike):
    """``AutoProcessor.from_pretrained(dir)`` (cached): JanusProcessor or Emu3Processor."""
    path = str(Path(dir).resolve())
    return _load_processor(path, os.path.getmtime(os.path.join(path, "config.json")))


load_processor.cache_clear = _load_processor.cache_clear  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- prompts


def prompt_ids(dir: str | os.PathLike, prompts: list[str], negative_prompt: str = "") -> dict[str, torch.Tensor]:
    """The rows transformers' image generation feeds for ``prompts`` (left padded):

    Janus: the chat template ("<|User|>: {p}\\n\\n<|Assistant|>:"), BOS by the tokenizer, then
    JanusProcessor(generation_mode="image") appends <begin_of_image>. The unconditional row is the
    same row with every token that is neither BOS nor <begin_of_image> replaced by pad, and the same
    attention mask (JanusForConditionalGeneration.generate); ``negative_prompt`` is not used.

    Emu3: Emu3Processor(return_for_image_generation=True): BOS + p + <|image start|> + "H*W" +
    <|image token|>. The unconditional row is ``negative_prompt`` through the same template (as the
    original BAAI image_generation.py does), repeated per prompt.
    """
    info = read_fixture(dir)
    proc = load_processor(dir)
    prompts = list(prompts)
    if info["family"] == "janus":
        texts = [proc.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": p}]}],
                                          add_generation_prompt=True) for p in prompts]
        enc = proc(text=texts, generation_mode="image", padding=True, return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"]
        tid = info["token_ids"]
        keep = (ids == tid["bos"]) | (ids == tid["boi"])
        uncond = torch.where(keep, ids, torch.full_like(ids, tid["pad"]))
        return {"input_ids": ids, "attention_mask": mask, "uncond_input_ids": uncond,
                "uncond_attention_mask": mask.clone()}
    kw = dict(return_for_image_generation=True, ratio=info["ratio"], image_area=info["image_area"],
              padding=True, return_tensors="pt")
    enc = proc(text=prompts, **kw)
    neg = proc(text=[negative_prompt] * len(prompts), **kw)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "uncond_input_ids": neg["input_ids"], "uncond_attention_mask": neg["attention_mask"]}


def emu3_allowed_tokens(info: dict, offset: int) -> list[int]:
    """Emu3's layout constraint (docs example / BAAI Emu3PrefixConstrainedLogitsHelper): the tokens
    allowed at generated position ``offset`` = 1, 2, ... counted from the <|image token|> wrapper."""
    h, w, tid = info["height"], info["width"], info["token_ids"]
    end = (w + 1) * h
    if offset % (w + 1) == 0:
        return [tid["eol"]]
    if offset == end + 1:
        return [tid["eof"]]
    if offset == end + 2:
        return [tid["eoi"]]
    if offset == end + 3:
        return [tid["eos"]]
    if offset > end + 3:
        return [tid["pad"]]
    return list(info["visual_token_ids"])


def _emu3_prefix_fn(info: dict):
    wrapper = info["token_ids"]["wrapper"]

    def allowed(batch_id: int, row: torch.Tensor) -> list[int]:
        start = int(torch.nonzero(row == wrapper)[0, 0])
        return emu3_allowed_tokens(info, row.shape[0] - start)

    return allowed


# --------------------------------------------------------------------------- reference generation


@torch.no_grad()
def hf_greedy_image_tokens(dir: str | os.PathLike, prompts: list[str], cfg_scale: float,
                           batch_size: int | None = None, negative_prompt: str = "") -> torch.LongTensor:
    """Greedy image codes (B, H*W) in [0, codebook) from transformers' own ``generate`` with CFG,
    ``batch_size`` prompts per call (default: all at once).

    Janus: ``generate(..., generation_mode="image", guidance_scale=cfg_scale, do_sample=False)``;
    transformers' ClassifierFreeGuidanceLogitsProcessor requires cfg_scale > 1 (at 1 the image loop
    breaks on the doubled batch), so Janus rejects cfg_scale <= 1 here.
    Emu3: ``generate`` with ``prefix_allowed_tokens_fn`` (row-end layout), ``negative_prompt_ids``
    and ``guidance_scale=cfg_scale`` (UnbatchedClassifierFreeGuidanceLogitsProcessor; cfg_scale 1
    means no guidance), H*(W+1)+3 new tokens; the <|extra_200|> row ends and the eof/eoi/eos tail
    are checked and removed, visual tokens mapped back to codes."""
    info = read_fixture(dir)
    model = load_hf_model(dir)
    prompts = list(prompts)
    step = batch_size or len(prompts)
    out = []
    for i in range(0, len(prompts), step):
        rows = prompt_ids(dir, prompts[i:i + step], negative_prompt)
        if info["family"] == "janus":
            if cfg_scale <= 1:
                raise ValueError("transformers' Janus image generation needs cfg_scale > 1")
            codes = model.generate(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                                   generation_mode="image", do_sample=False, guidance_scale=float(cfg_scale))
            out.append(codes.long())
            continue
        h, w = info["height"], info["width"]
        n_new = h * (w + 1) + 3
        extra = {}
        if cfg_scale != 1:
            extra = dict(guidance_scale=float(cfg_scale), negative_prompt_ids=rows["uncond_input_ids"],
                         negative_prompt_attention_mask=rows["uncond_attention_mask"])
        seq = model.generate(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], do_sample=False,
                             max_new_tokens=n_new,
                             prefix_allowed_tokens_fn=_emu3_prefix_fn(info), **extra)
        out.append(_emu3_codes(info, model, seq[:, rows["input_ids"].shape[1]:]))
    return torch.cat(out, 0)


def _emu3_codes(info: dict, model, gen: torch.Tensor) -> torch.LongTensor:
    h, w, tid = info["height"], info["width"], info["token_ids"]
    if gen.shape[1] != h * (w + 1) + 3:
        raise AssertionError(f"Emu3 generated {gen.shape[1]} tokens, expected {h * (w + 1) + 3}")
    grid = gen[:, : h * (w + 1)].view(-1, h, w + 1)
    tail = gen[:, h * (w + 1):]
    if not bool((grid[:, :, w] == tid["eol"]).all()):
        raise AssertionError("Emu3 rows do not end with <|extra_200|>")
    if not bool((tail == torch.tensor([tid["eof"], tid["eoi"], tid["eos"]])).all()):
        raise AssertionError(f"Emu3 tail is {tail.tolist()}, expected eof, eoi, eos")
    visual = grid[:, :, :w].reshape(gen.shape[0], h * w)
    lo = min(info["visual_token_ids"])
    if not bool(((visual >= lo) & (visual < lo + info["codebook"])).all()):
        raise AssertionError("Emu3 image positions hold non-visual tokens")
    codes = model.vocabulary_mapping.bpe2img_mapping_tensor[visual.cpu()].long()
    return codes


# --------------------------------------------------------------------------- reference logits


def image_stream_ids(dir: str | os.PathLike, codes: torch.Tensor) -> torch.LongTensor:
    """Codes (B, H*W) -> the ids that stand for them after the prompt. Janus: the codes themselves
    (fed through the generation embeddings). Emu3: visual-token ids, <|extra_200|> after every row
    (no eof/eoi/eos tail)."""
    info = read_fixture(dir)
    codes = torch.as_tensor(codes).long()
    if info["family"] == "janus":
        return codes.clone()
    h, w = info["height"], info["width"]
    visual = torch.tensor(info["visual_token_ids"])[codes].view(-1, h, w)
    eol = torch.full((visual.shape[0], h, 1), info["token_ids"]["eol"], dtype=torch.long)
    return torch.cat([visual, eol], 2).view(visual.shape[0], h * (w + 1))


@torch.no_grad()
def hf_logits(dir: str | os.PathLike, input_ids: torch.Tensor, image_start: int | None = None,
              attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Raw logits (B, L, V) transformers computes for full sequences ``input_ids`` (B, L); logits[:, t]
    predicts token t+1.

    Janus: ids[:, :image_start] are text ids (``embed_tokens``), ids[:, image_start:] image codes
    (``generation_embeddings`` then ``generation_aligner``, i.e. prepare_embeddings_for_image_generation);
    the language model's last hidden states go through ``generation_head``, V = codebook.
    ``image_start`` defaults to L (text only). Positions default to 0..L-1 over the padded row, as
    the image-generation loop does (it passes no position_ids); RoPE only sees relative positions,
    so this equals cumsum(mask) - 1 up to rounding.

    Emu3: ``Emu3ForConditionalGeneration`` logits (lm_head, V = vocab). Positions default to
    cumsum(attention_mask) - 1 (pads 0), as ``generate`` builds them for the conditional rows; the
    unconditional branch of UnbatchedClassifierFreeGuidanceLogitsProcessor passes none, i.e. 0..L-1
    (the same unless the negative rows are padded).
    """
    info = read_fixture(dir)
    model = load_hf_model(dir)
    ids = torch.as_tensor(input_ids).long()
    B, L = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).long()
    if info["family"] == "janus":
        start = L if image_start is None else int(image_start)
        parts = [model.get_input_embeddings()(ids[:, :start])]
        if start < L:
            parts.append(model.prepare_embeddings_for_image_generation(ids[:, start:]))
        embeds = torch.cat(parts, 1)
        if position_ids is None:
            position_ids = torch.arange(L).unsqueeze(0).expand(B, L)
        hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                                            use_cache=False).last_hidden_state
        return model.model.generation_head(hidden)
    if position_ids is None:
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
