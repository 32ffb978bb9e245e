"""Write a synthetic checkpoint in a family's official layout at a real size, streaming.

    python scripts/synthetic_checkpoint.py FAMILY SIZE DIR [--seed 0] [--max-shard-gb G] [--dtype bf16]

FAMILY: janus, emu3, anole, lumina (Chameleon layouts), llamagen-t2i. SIZE: a release's size (below)
or a trunk of about 0.3b / 1.5b parameters with the family's vocabularies, heads of 128 (LlamaGen:
64) and its GQA ratio. The directory is what ``sv.load(DIR)`` reads: the transformers layout
(config.json, generation_config.json for Janus, tokenizer and processor files, safetensors shards
with model.safetensors.index.json) or LlamaGen's release files (t2i_<size>_256.pt, vq_ds16_t2i.pt,
a flan-t5 directory). Every tensor of the official model is written, vision tower and VQ included:
key names and shapes come from transformers' own classes (built on the meta device) or, for
LlamaGen, from specvis's ``LlamaGenT2I``, whose state dict uses the official names.

Sizes (the numbers of the released config.json files, as stored copies on the Hugging Face Hub read
on 2026-11-26; transformers 5.23's ChameleonConfig and Emu3Config defaults are the same numbers):

- janus 1b (Janus-Pro-1B text_config, hf-internal-testing/tiny-processor-janus config.json): hidden
  2048, 24 layers, 16 heads (16 KV), FFN 5632, vocabulary 102400; 7b (deepseek-ai/Janus-Pro-7B
  config.json language_config): hidden 4096, 30 layers, 32 heads, FFN 11008, vocabulary 102400.
  Generation: 16384 VQ codes of dimension 8, aligner 8 -> hidden (depth 2), head hidden -> 16384.
- emu3 8b (BAAI/Emu3-Gen config.json): hidden 4096, 32 layers, 32 heads, 8 KV heads, FFN 14336,
  vocabulary 184622 (32768 visual tokens), rope_theta 1e6, rms_norm_eps 1e-5, 9216 positions.
- anole / lumina 7b (Chameleon-7B: GAIR/Anole-7b, Alpha-VLLM/Lumina-mGPT-7B-768): hidden 4096, 32
  layers, 32 heads, FFN 11008, vocabulary 65536 (8192 image tokens), rms_norm_eps 1e-5, q/k norms;
  Lumina-mGPT's ChameleonXLLMXConfig adds z_loss_weight (10240 positions, as its 2.0 release's
  config). Lumina-mGPT-7B-768 ships two shards of 9.98 and 4.05 GB (its Hub file listing): 10 GB
  shards here; the other families 5 GB (transformers' long-time save_pretrained default).
- llamagen-t2i xl / xxl / 3b (LlamaGen ``autoregressive/models/gpt.py`` GPT_XL: dim 1280, 36 layers,
  20 heads; GPT_XXL: 1536, 48, 24; GPT_3B: 3200, 24, 32), FFN of SwiGLU with multiple_of 256,
  16384 codes, captions of 120 x 2048 (flan-t5-xl). 0.3b is GPT_L (1024, 24, 16) and 1.5b GPT_XXL.
  The flan-t5 written beside it is a stand-in of flan-t5-xl's width (2048) with one tiny layer: the
  encoder's cost is not what these checkpoints measure.

Weights are random, drawn so that laws are not degenerate (as tests/hf_tiny.py does): matrices
N(0, 1/fan_in), embedding tables N(0, 1), norm scales 1 + N(0, 0.1^2), biases N(0, 0.1^2), and the
heads that score image tokens scaled by 4 (logits of a few units: peaked laws, rare argmax ties).
Each tensor is drawn in row blocks from its own seeded generator and written as it is drawn: the
script never holds more than one block (about 64 MiB) of a tensor, whatever the size. Files are
written under temporary names and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's tokenizer builders (tests/hf_tiny.py)

HEAD_GAIN = 4.0
BLOCK_BYTES = 64 * 2 ** 20
GB = 10 ** 9
DTYPES = {"bf16": (torch.bfloat16, "BF16"), "fp32": (torch.float32, "F32"), "fp16": (torch.float16, "F16")}

# (hidden, layers, heads, kv heads, FFN) of the released trunks (module docstring)
REAL = {
    "janus": {"1b": (2048, 24, 16, 16, 5632), "7b": (4096, 30, 32, 32, 11008)},
    "emu3": {"8b": (4096, 32, 32, 8, 14336)},
    "anole": {"7b": (4096, 32, 32, 32, 11008)},
    "lumina": {"7b": (4096, 32, 32, 32, 11008)},
    "llamagen-t2i": {"xl": (1280, 36, 20, 20, 3584), "xxl": (1536, 48, 24, 24, 4096), "3b": (3200, 24, 32, 32, 8704)},
}
SCALED = {"0.3b": (1024, 16, 8, 2816), "1.5b": (2048, 24, 16, 5632)}  # hidden, layers, heads, FFN (head 128)
LLAMAGEN_SCALED = {"0.3b": (1024, 24, 16, 16, 2816), "1.5b": (1536, 48, 24, 24, 4096)}  # GPT_L, GPT_XXL
VOCAB = {"janus": 102400, "emu3": 184622, "anole": 65536, "lumina": 65536}
SHARD_GB = {"janus": 5, "emu3": 5, "anole": 5, "lumina": 10}


def trunk(family: str, size: str) -> tuple[int, int, int, int, int]:
    """(hidden, layers, heads, kv heads, FFN) of FAMILY at SIZE."""
    size = size.lower()
    if size in REAL.get(family, {}):
        return REAL[family][size]
    if family == "llamagen-t2i" and size in LLAMAGEN_SCALED:
        return LLAMAGEN_SCALED[size]
    if size in SCALED and family != "llamagen-t2i":
        hidden, layers, heads, ffn = SCALED[size]
        h, _, H, kv, _ = next(iter(REAL[family].values()))
        return hidden, layers, heads, max(1, heads * kv // H), ffn
    sizes = sorted(set(REAL.get(family, {})) | set(LLAMAGEN_SCALED if family == "llamagen-t2i" else SCALED))
    raise SystemExit(f"size must be one of {', '.join(sizes)} for {family}, got {size!r}")


# ---------------------------------------------------------------- random tensors, streamed
def std_of(key: str, shape: tuple[int, ...], embeddings: tuple[str, ...]) -> tuple[float, float]:
    """(mean, std) of a tensor's entries: module docstring."""
    if len(shape) >= 2:
        if key.endswith(embeddings):
            return 0.0, 1.0
        return 0.0, 1.0 / math.sqrt(math.prod(shape[1:]))
    return (0.0, 0.1) if key.endswith("bias") else (1.0, 0.1)


def blocks(key: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int, gain: float, embeddings):
    """The tensor's values in row blocks of at most ``BLOCK_BYTES`` (fp32 while drawn)."""
    mean, std = std_of(key, shape, embeddings)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    rows = shape[0] if shape else 1
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, BLOCK_BYTES // (4 * per_row))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        x = torch.randn((n, *shape[1:]) if shape else (), generator=gen)
        yield (x * (std * gain) + mean).to(dtype)


def write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, tag: str, seed: int,
                      gains: dict[str, float], embeddings) -> None:
    """One safetensors file, header first (offsets from the shapes), then each tensor as drawn."""
    size = torch.empty(0, dtype=dtype).element_size()
    header, offset = {}, 0
    for key, shape in specs:
        n = math.prod(shape) * size
        header[key] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for key, shape in specs:
            for block in blocks(key, shape, dtype, seed, gains.get(key, 1.0), embeddings):
                f.write(block.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    os.replace(tmp, path)


def write_sharded(directory: Path, specs, dtype, tag, seed, gains, embeddings, max_shard: int) -> None:
    """Shards of at most ``max_shard`` bytes in key order, and model.safetensors.index.json."""
    size = torch.empty(0, dtype=dtype).element_size()
    shards, current, used = [], [], 0
    for key, shape in specs:
        n = math.prod(shape) * size
        if current and used + n > max_shard:
            shards.append(current)
            current, used = [], 0
        current.append((key, shape))
        used += n
    shards.append(current)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, part in zip(names, shards):
        print(f"  {name}: {len(part)} tensors, {sum(math.prod(s) for _, s in part) * size / GB:.2f} GB", flush=True)
        write_safetensors(directory / name, part, dtype, tag, seed, gains, embeddings)
    index = {"metadata": {"total_size": sum(math.prod(s) for _, s in specs) * size},
             "weight_map": {k: name for name, part in zip(names, shards) for k, _ in part}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def meta_specs(build) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of every tensor ``build()``'s state dict holds, built on the meta device."""
    with torch.device("meta"):
        model = build()
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


# ---------------------------------------------------------------- the transformers families
def janus(size: str, out: Path, args) -> None:
    from hf_tiny import JANUS_CHAT_TEMPLATE, JANUS_TOKENS, _char_tokenizer
    from transformers import (JanusConfig, JanusForConditionalGeneration, JanusImageProcessorPil, JanusProcessor,
                              JanusVisionConfig, JanusVQVAEConfig, LlamaConfig)

    hidden, layers, heads, kv, ffn = trunk("janus", size)
    t = JANUS_TOKENS
    tok = _char_tokenizer([t["bos"], t["eos"], t["pad"], t["image"], t["boi"], t["eoi"]], [], unk=t["pad"], bos=t["bos"],
                          extra_special={"image_token": t["image"], "boi_token": t["boi"], "eoi_token": t["eoi"]},
                          bos_token=t["bos"], eos_token=t["eos"], pad_token=t["pad"])
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in t.items()}
    text = LlamaConfig(vocab_size=VOCAB["janus"], hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=16384,
                       rms_norm_eps=1e-6, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    vision = JanusVisionConfig(projection_dim=hidden)  # SigLIP-L/16 at 384 px, 576 tokens
    vq = JanusVQVAEConfig(projection_dim=hidden, image_token_embed_dim=hidden)  # VQ-16: 16384 codes of 8
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=ids["image"])
    config.dtype = args.dtype_name
    specs = meta_specs(lambda: JanusForConditionalGeneration(config))
    gains = {k: HEAD_GAIN for k, _ in specs if k.startswith("model.generation_head.vision_head.")}
    write_transformers(out, config, specs, args, gains, ("embed_tokens.weight", "generation_embeddings.weight",
                                                         "embedding.weight"), SHARD_GB["janus"])
    from transformers import GenerationConfig

    gc = GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], guidance_scale=5.0,
                          generation_kwargs={"boi_token_id": ids["boi"]})
    gc.save_pretrained(out)
    JanusProcessor(image_processor=JanusImageProcessorPil(size={"height": 384, "width": 384}), tokenizer=tok,
                   chat_template=JANUS_CHAT_TEMPLATE, use_default_system_prompt=True,
                   num_image_tokens=576).save_pretrained(out)


def emu3(size: str, out: Path, args) -> None:
    from hf_tiny import EMU3_TOKENS, _char_tokenizer
    from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor, Emu3TextConfig

    hidden, layers, heads, kv, ffn = trunk("emu3", size)
    t = EMU3_TOKENS
    visual = [f"<|visual token {i:06d}|>" for i in range(32768)]
    tok = _char_tokenizer([t[k] for k in ("pad", "image", "eol", "eof", "bos", "eos", "boi", "eoi", "wrapper")], visual,
                          unk=t["pad"], bos=None,
                          extra_special={"image_token": t["image"], "boi_token": t["boi"], "eoi_token": t["eoi"],
                                         "image_wrapper_token": t["wrapper"], "eof_token": t["eof"]},
                          bos_token=t["bos"], eos_token=t["eos"], pad_token=t["pad"])
    vocab = tok.get_vocab()
    text = Emu3TextConfig(vocab_size=VOCAB["emu3"], hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv,
                          pad_token_id=vocab[t["pad"]], bos_token_id=vocab[t["bos"]], eos_token_id=vocab[t["eos"]])
    config = Emu3Config(text_config=text, vocabulary_map=vocab)  # Emu3-8B's VQ (32768 codes)
    config.dtype = args.dtype_name
    specs = meta_specs(lambda: Emu3ForConditionalGeneration(config))
    write_transformers(out, config, specs, args, {"lm_head.weight": HEAD_GAIN}, ("embed_tokens.weight", "embedding.weight"),
                       SHARD_GB["emu3"])
    Emu3Processor(image_processor=Emu3ImageProcessor(), tokenizer=tok).save_pretrained(out)


def chameleon_vocabulary(codes: int = 8192) -> dict[str, int]:
    """Names -> ids: <s> 0, <pad> 1, </s> 2, <unk> 3, the image tokens IMGIMG<code in letters>Z from
    4, <reservedNNNNN> after them, <racm3:break>, then the printable characters."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for c in range(codes):
        vocab["IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z"] = len(vocab)
    for n in range(9000):
        vocab[f"<reserved{n:05d}>"] = len(vocab)
    vocab["<racm3:break>"] = len(vocab)
    for c in range(32, 127):
        vocab.setdefault(chr(c), len(vocab))
    return vocab


def chameleon(size: str, out: Path, args, lumina: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

    family = "lumina" if lumina else "anole"
    hidden, layers, heads, kv, ffn = trunk(family, size)
    vocab = chameleon_vocabulary()
    config = ChameleonConfig(vocab_size=VOCAB[family], hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, vocabulary_map=vocab,
                             max_position_embeddings=10240 if lumina else 4096, bos_token_id=0, pad_token_id=1,
                             eos_token_id=2)
    config.dtype = args.dtype_name
    specs = meta_specs(lambda: ChameleonForConditionalGeneration(config))
    extra = {"z_loss_weight": 1e-5, "architectures": ["ChameleonXLLMXForConditionalGeneration"]} if lumina else {}
    write_transformers(out, config, specs, args, {"lm_head.weight": HEAD_GAIN}, ("embed_tokens.weight", "embedding.weight"),
                       SHARD_GB[family], extra)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<reserved08706>", "<racm3:break>", "<reserved08799>"]})
    fast.save_pretrained(out)


def write_transformers(out: Path, config, specs, args, gains, embeddings, shard_gb: float, extra: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    d = config.to_dict()
    d.update(extra or {})
    total = sum(math.prod(s) for _, s in specs)
    print(f"{out}: {len(specs)} tensors, {total / 1e9:.3f}B parameters", flush=True)
    if not args.config_only:
        write_sharded(out, specs, args.dtype, args.tag, args.seed, gains, embeddings,
                      int((args.max_shard_gb or shard_gb) * GB))
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(d, indent=2))
    os.replace(tmp, out / "config.json")


# ---------------------------------------------------------------- LlamaGen t2i release files
def llamagen_t2i_config(size: str):
    """The ``LlamaGenT2IConfig`` of a size (module docstring)."""
    from specvis.models.llamagen import LlamaGenT2IConfig

    hidden, layers, heads, kv, ffn = trunk("llamagen-t2i", size)
    cfg = LlamaGenT2IConfig(dim=hidden, n_layer=layers, n_head=heads, n_kv_head=kv, vocab_size=16384, block_size=256,
                            multiple_of=256, caption_dim=2048, cls_token_num=120)
    if cfg.ffn_hidden != ffn:
        cfg.multiple_of = ffn  # GPT_3B's width: the FFN as released
    return cfg


def llamagen_t2i(size: str, out: Path, args) -> None:
    """t2i_<SIZE>_256.pt ({"model": state dict}), vq_ds16_t2i.pt and t5-ckpt/flan-t5-xl."""
    from specvis.models.llamagen import LlamaGenT2I
    from specvis.models.vq import VQConfig, VQModel

    if args.config_only:
        raise SystemExit("llamagen-t2i releases have no config file: its shapes are in the .pt (memory_table.py builds it)")
    cfg = llamagen_t2i_config(size)
    specs = meta_specs(lambda: LlamaGenT2I(cfg))
    out.mkdir(parents=True, exist_ok=True)
    total = sum(math.prod(s) for _, s in specs)
    print(f"{out}: {len(specs)} tensors, {total / 1e9:.3f}B parameters", flush=True)
    scratch = out / "weights.raw.tmp"
    size_of = torch.empty(0, dtype=args.dtype).element_size()
    with open(scratch, "wb") as f:  # each tensor drawn and written; torch.save reads them back mapped
        for key, shape in specs:
            for block in blocks(key, shape, args.dtype, args.seed, HEAD_GAIN if key == "output.weight" else 1.0,
                                ("tok_embeddings.weight", "uncond_embedding")):
                f.write(block.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    flat = torch.from_file(str(scratch), shared=False, size=total * size_of, dtype=torch.uint8)
    sd, offset = {}, 0
    for key, shape in specs:
        n = math.prod(shape) * size_of
        sd[key] = flat[offset: offset + n].view(args.dtype).view(shape)
        offset += n
    name = f"t2i_{size.upper()}_stage1_256.pt"
    torch.save({"model": sd}, out / (name + ".tmp"))
    del sd, flat
    os.replace(out / (name + ".tmp"), out / name)
    scratch.unlink()
    torch.manual_seed(args.seed)
    vq = VQModel(VQConfig())  # LlamaGen's VQ-16 (its own init: a small model)
    torch.save({"model": vq.state_dict()}, out / "vq_ds16_t2i.pt.tmp")
    os.replace(out / "vq_ds16_t2i.pt.tmp", out / "vq_ds16_t2i.pt")
    write_t5(out / "t5-ckpt" / "flan-t5-xl", cfg.caption_dim)


def write_t5(path: Path, width: int) -> None:
    """A flan-t5 stand-in of ``width`` (flan-t5-xl: 2048) with one tiny layer and a character tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    names = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    cfg = T5Config(vocab_size=len(names), d_model=width, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                   feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    T5EncoderModel(cfg).save_pretrained(path)


FAMILIES = {"janus": janus, "emu3": emu3, "anole": lambda s, o, a: chameleon(s, o, a, lumina=False),
            "lumina": lambda s, o, a: chameleon(s, o, a, lumina=True), "llamagen-t2i": llamagen_t2i}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=sorted(FAMILIES))
    p.add_argument("size", help="a release size (janus 1b/7b, emu3 8b, anole/lumina 7b, llamagen-t2i xl/xxl/3b) or 0.3b / 1.5b")
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--max-shard-gb", type=float, help="largest shard (default: the family's release, module docstring)")
    p.add_argument("--config-only", action="store_true",
                   help="config, tokenizer and processor files only, no weights (scripts/memory_table.py plans from them)")
    a = p.parse_args(argv)
    trunk(a.family, a.size)  # a bad size fails before anything is written
    a.dtype, a.tag = DTYPES[a.dtype]
    a.dtype_name = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}[a.dtype]
    a.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(a.dir).free
    print(f"writing {a.family} {a.size} to {a.dir} ({free / GB:.0f} GB free there)", flush=True)
    FAMILIES[a.family](a.size, a.dir, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
