"""specvis.train.janus_export: a Janus-layout PromptDecoder + LlamaGen VQ + tokenizer written as a
transformers Janus-Pro checkpoint. On a small random model: specvis loads the same tensors and logits
back; transformers' own JanusForConditionalGeneration (from_pretrained, generate in image mode with
CFG) gives the logits and greedy codes specvis gives; transformers' JanusVQVAE encodes and decodes as
our VQModel; a non-empty target and VQs JanusVQVAE cannot represent are refused, nothing written."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from specvis.families import load_decoder  # noqa: E402
from specvis.models.base import Prompts  # noqa: E402
from specvis.models.vq import VQConfig, VQModel  # noqa: E402
from specvis.train.janus_export import decoder_state_dict_to_janus, export_janus  # noqa: E402
from specvis.train.janus_format import SPECIAL_TOKENS, JanusSpec, new_decoder  # noqa: E402

GRID = 4
CODES = 32
WORDS = ["a", "red", "blue", "green", "cat", "dog", "apple", "smiling", "face", "with", "heart", "eyes", "tree",
         "sun", "on", "the", "big", "small"]
PROMPTS = ["a smiling cat with heart eyes", "red apple"]  # different lengths: left padding in the batch
CFG = 3.0


def make_tokenizer():
    """Word-level: the six Janus special tokens (ids 0..5), then WORDS; BOS prepended by the post processor."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS[k] for k in ("bos", "eos", "pad", "image", "boi", "eoi")]
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["pad"]))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(specials)
    bos = SPECIAL_TOKENS["bos"]
    core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B:1",
                                                        special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=SPECIAL_TOKENS["eos"],
                                   pad_token=SPECIAL_TOKENS["pad"], unk_token=SPECIAL_TOKENS["pad"])


def make_spec(tok) -> JanusSpec:
    v = tok.get_vocab()
    return JanusSpec(text_vocab_size=40, bos=v[SPECIAL_TOKENS["bos"]], pad=v[SPECIAL_TOKENS["pad"]],
                     boi=v[SPECIAL_TOKENS["boi"]], dim=64, n_layer=2, n_head=4, n_kv_head=2, ffn_hidden=128,
                     codes=CODES, code_dim=8, aligner_depth=2, grid=GRID, rope_theta=700.0, norm_eps=1e-5,
                     max_positions=64)


def make_vq(**overrides) -> VQModel:
    """16x16 px <-> 4x4 codes; weights re-drawn so decoded images are mostly inside (-1, 1), not clamped."""
    cfg = dict(codebook_size=CODES, codebook_embed_dim=8, encoder_ch_mult=[1, 2, 2], decoder_ch_mult=[1, 2, 2],
               z_channels=16, ch=32, num_res_blocks=1, norm_groups=32)
    torch.manual_seed(1)
    vq = VQModel(VQConfig(**(cfg | overrides))).eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in vq.named_parameters():
            if name.endswith("bias") or p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if "norm" in name and "weight" in name else 0.0))
            elif name != "quantize.embedding.weight":
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
        vq.decoder.conv_out.weight.mul_(0.3)
    return vq


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tok = make_tokenizer()
    spec = make_spec(tok)
    torch.manual_seed(0)
    model = new_decoder(spec, init_std=0.2).eval()
    with torch.no_grad():  # peaked laws: greedy argmax ties are negligible
        model.head.vision_head.weight.mul_(3.0)
    vq = make_vq()
    out = export_janus(model, spec, vq, tok, tmp_path_factory.mktemp("export") / "janus-emoji",
                       guidance_scale=CFG, seed=0)
    return {"out": out, "model": model, "spec": spec, "vq": vq, "tok": tok}


def test_files_and_configs(exported) -> None:
    import json

    out = exported["out"]
    names = set(os.listdir(out))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "processor_config.json"} <= names, names
    assert not [n for n in os.listdir(out.parent) if n.startswith(".")], "temporary directory left behind"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "janus" and cfg["architectures"] == ["JanusForConditionalGeneration"]
    assert cfg["vq_config"]["num_patches"] == GRID and cfg["vision_config"]["num_image_tokens"] == GRID * GRID
    gen = json.loads((out / "generation_config.json").read_text())
    spec = exported["spec"]
    assert (gen["bos_token_id"], gen["pad_token_id"], gen["generation_kwargs"]["boi_token_id"]) == \
        (spec.bos, spec.pad, spec.boi)
    assert gen["guidance_scale"] == CFG and gen["_from_model_config"] is False
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert (tc["image_token"], tc["boi_token"], tc["eoi_token"]) == \
        (SPECIAL_TOKENS["image"], SPECIAL_TOKENS["boi"], SPECIAL_TOKENS["eoi"])


def test_specvis_loads_the_same_model(exported) -> None:
    """Every tensor equal under the checkpoint's names (the trained decoder keeps specvis's fused
    ``wqkv`` with interleaved rotary, the loaded one the Hugging Face layout: separate projections,
    rotate-half rotary), teacher-forced logits equal up to the rounding of the two pairings (catches a
    wrong rename or q/k de-interleave)."""
    model, spec = exported["model"], exported["spec"]
    back = load_decoder(exported["out"])
    assert (model.config.qkv_layout, back.config.qkv_layout) == ("fused", "separate")
    a, b = decoder_state_dict_to_janus(model), decoder_state_dict_to_janus(back)
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (back.config.rope_theta, back.config.norm_eps, back.config.n_kv_head) == \
        (spec.rope_theta, spec.norm_eps, spec.n_kv_head)
    assert back.unconditional_rule == model.unconditional_rule  # CFG: keep BOS and boi, pad the rest
    assert (back.layout.height, back.layout.width, back.layout.vocab_size) == (GRID, GRID, CODES)
    rows = [exported["tok"](p)["input_ids"] + [spec.boi] for p in PROMPTS]
    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.logits(Prompts.of(rows), codes[:, :-1])
        got = back.logits(Prompts.of(rows), codes[:, :-1])
    assert (ref - got).abs().max() < 1e-4


def hf_inputs(out):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(out), local_files_only=True)
    assert type(proc).__name__ == "JanusProcessor" and not getattr(proc, "chat_template", None)
    return proc(text=PROMPTS, generation_mode="image", padding=True, return_tensors="pt")


def test_transformers_generate_equals_specvis_ar(exported) -> None:
    """transformers' own model: the same teacher-forced logits as ours, and greedy image generation with
    CFG (batch of 2 prompts of different lengths) gives specvis's greedy AR codes."""
    from transformers import JanusForConditionalGeneration

    out, model, spec = exported["out"], exported["model"], exported["spec"]
    hf = JanusForConditionalGeneration.from_pretrained(str(out), dtype=torch.float32, local_files_only=True).eval()
    enc = hf_inputs(out)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert rows == [exported["tok"](p)["input_ids"] + [spec.boi] for p in PROMPTS]  # BOS + caption + boi
    assert rows[0][0] == spec.bos and len(rows[0]) != len(rows[1])

    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        embeds = torch.cat([hf.get_input_embeddings()(ids), hf.prepare_embeddings_for_image_generation(codes)], 1)
        full_mask = torch.cat([mask, torch.ones_like(codes)], 1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = hf.model.language_model(inputs_embeds=embeds, attention_mask=full_mask, position_ids=pos,
                                         use_cache=False).last_hidden_state
        ref = hf.model.generation_head(hidden)[:, ids.shape[1] - 1:-1]
        ours = model.logits(Prompts.of(rows), codes[:, :-1])
    assert (ours - ref).abs().max() < 1e-4

    with torch.no_grad():
        hf_codes = hf.generate(input_ids=ids, attention_mask=mask, generation_mode="image", do_sample=False,
                               guidance_scale=CFG)
    pipe = sv.load(str(out))
    greedy = sv.Sampling(temperature=0.0, cfg_scale=CFG)
    mine = pipe(prompts=PROMPTS, method=sv.AR(), sampling=greedy, decode=False, height=GRID, width=GRID).tokens
    assert mine.shape == (2, GRID * GRID)
    assert len(set(mine.flatten().tolist())) > 4  # not a degenerate repeat of one code
    assert torch.equal(mine.cpu(), hf_codes.long().cpu())


def test_janus_vqvae_equals_our_vq(exported) -> None:
    """transformers' JanusVQVAE from the checkpoint decodes codes (and encodes images to latents) as our VQModel."""
    from specvis.models.hf_vq import load_hf_vq

    vq = exported["vq"]
    hfvq = load_hf_vq(exported["out"])
    codes = torch.randint(0, CODES, (3, GRID * GRID), generator=torch.Generator().manual_seed(2))
    ours = vq.decode(codes, (GRID, GRID))
    theirs = hfvq.decode(codes, GRID, GRID)
    assert ours.shape == theirs.shape == (3, 3, 16, 16)
    assert ((ours.abs() < 0.999).float().mean() > 0.5), "decoded images mostly clamped: a weak comparison"
    assert torch.allclose(ours, theirs, atol=1e-4)
    with torch.no_grad():  # transformers' own decode path (native grid) and the encoder
        native = hfvq.vq.decode(codes).clamp(-1, 1)
        assert torch.allclose(ours, native, atol=1e-4)
        images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(3)) * 2 - 1
        z_ours = vq.encode_latents(images)
        z_theirs = hfvq.vq.quant_conv(hfvq.vq.encoder(images))
        assert torch.allclose(z_ours, z_theirs, atol=1e-4)


def test_refuses_non_empty_target_and_unrepresentable_vq(exported, tmp_path) -> None:
    model, spec, vq, tok = exported["model"], exported["spec"], exported["vq"], exported["tok"]
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    before = sorted(os.listdir(target))
    with pytest.raises(ValueError) as e:
        export_janus(model, spec, vq, tok, target)
    msg = str(e.value)
    assert "\n" not in msg and "overwrite" in msg
    assert sorted(os.listdir(target)) == before and (target / "keep.txt").read_text() == "mine"
    for bad, field in ((dict(norm_groups=16), "norm_groups"), (dict(decoder_ch_mult=[1, 1, 2]), "ch_mult"),
                       (dict(codebook_l2_norm=False), "codebook_l2_norm")):
        with pytest.raises(ValueError, match=field) as e:
            export_janus(model, spec, make_vq(**bad), tok, tmp_path / "never")
        assert "\n" not in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # nothing written, no temporary left
    # overwrite=True replaces the directory wholesale
    export_janus(model, spec, vq, tok, target, overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "config.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["taken"]
