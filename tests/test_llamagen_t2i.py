"""LlamaGen t2i (FoundationVision/LlamaGen) from files in the official formats: a tiny random GPT saved
as ``{"model": state_dict}`` under the official key names (``t2i_XL_stage1_256.pt``), a tiny LlamaGen
VQ (``vq_ds16_t2i.pt``) and a tiny flan-t5 in the Hugging Face layout (``t5-ckpt/flan-t5-xl``).

The reference is written here from the official code's conventions, independent of specvis's cache:
captions moved to the end of the 120-token prefix (left padding), the mask causal AND key-valid with
the diagonal on, the 2D RoPE table with the prefix at zero rotation and image token j at row 120 + j,
the null caption ``uncond_embedding`` under the same mask, CFG u + s (c - u)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from specvis.families.llamagen_t2i import clean_text  # noqa: E402
from specvis.models.base import Condition  # noqa: E402
from specvis.models.vq import VQConfig, VQModel  # noqa: E402

T = 120  # cls_token_num / flan-t5 max length, as released
CODES = 64
GRID = 16  # t2i_XL_stage1_256.pt: 256 px / 16
CAPTION_DIM = 16  # the tiny flan-t5's d_model
PROMPTS = ["a red apple on a wooden table", "a cat"]


# ---------------------------------------------------------------- fixtures in the official formats
def make_t5(path) -> None:
    """A tiny flan-t5 (T5ForConditionalGeneration, gated-gelu, as google/flan-t5-xl) and a character
    tokenizer that ends every text with </s> (pad 0, </s> 1, unk 2, as T5's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    names = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(5)
    cfg = T5Config(vocab_size=len(names), d_model=CAPTION_DIM, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=1,
                   num_heads=2, relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0,
                   eos_token_id=1, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # unit-scale states so captions differ clearly
            if p.dim() > 1:
                p.normal_(0, 1.0 if p.shape[0] == len(names) else p.shape[1] ** -0.5)
    model.save_pretrained(path)
    fast.save_pretrained(path)


def official_state_dict(seed: int, dim: int, n_layer: int, n_head: int, hidden: int) -> dict[str, torch.Tensor]:
    """Random tensors under the official t2i GPT's key names and shapes (autoregressive/models/gpt.py)."""
    g = torch.Generator().manual_seed(seed)
    w = lambda *shape: torch.randn(*shape, generator=g) * shape[-1] ** -0.5
    sd = {"cls_embedding.uncond_embedding": torch.randn(T, CAPTION_DIM, generator=g) / CAPTION_DIM ** 0.5,
          "cls_embedding.cap_proj.fc1.weight": w(dim, CAPTION_DIM) * 2,
          "cls_embedding.cap_proj.fc2.weight": w(dim, dim),
          "tok_embeddings.weight": torch.randn(CODES, dim, generator=g),
          "norm.weight": 1 + 0.1 * torch.randn(dim, generator=g),
          "output.weight": w(CODES, dim) * 3}
    for i in range(n_layer):
        p = f"layers.{i}."
        sd |= {p + "attention.wqkv.weight": w(3 * dim, dim) * 2, p + "attention.wo.weight": w(dim, dim),
               p + "feed_forward.w1.weight": w(hidden, dim), p + "feed_forward.w3.weight": w(hidden, dim),
               p + "feed_forward.w2.weight": w(dim, hidden),
               p + "attention_norm.weight": 1 + 0.1 * torch.randn(dim, generator=g),
               p + "ffn_norm.weight": 1 + 0.1 * torch.randn(dim, generator=g)}
    sd["_n_head"] = torch.tensor(n_head)  # test bookkeeping, removed before saving
    return sd


def ffn_hidden(dim: int) -> int:
    """The official FeedForward width: int(2 * 4 * dim / 3) rounded up to a multiple of 256."""
    h = int(2 * 4 * dim / 3)
    return -(-h // 256) * 256


def save_gpt(path, sd) -> None:
    torch.save({"model": {k: v for k, v in sd.items() if not k.startswith("_")}}, path)


def make_vq(path) -> None:
    torch.manual_seed(3)
    vq = VQModel(VQConfig(codebook_size=CODES, codebook_embed_dim=4, encoder_ch_mult=[1, 1], decoder_ch_mult=[1, 1],
                          z_channels=32, ch=32, num_res_blocks=1))
    torch.save({"model": vq.state_dict()}, path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("llamagen_t2i")
    models = root / "pretrained_models"  # the official scripts' folder
    models.mkdir()
    target = official_state_dict(0, dim=128, n_layer=2, n_head=2, hidden=ffn_hidden(128))  # head_dim 64, as GPT-XL
    save_gpt(models / "t2i_XL_stage1_256.pt", target)
    make_vq(models / "vq_ds16_t2i.pt")
    make_t5(models / "t5-ckpt" / "flan-t5-xl")
    draft = root / "draft"  # a draft needs only its GPT; this one is named through specvis.json
    draft.mkdir()
    draft_sd = official_state_dict(1, dim=64, n_layer=1, n_head=1, hidden=ffn_hidden(64))
    save_gpt(draft / "small.pt", draft_sd)
    (draft / "specvis.json").write_text(json.dumps({"gpt": "small.pt", "image_size": 256}))
    return {"dir": models, "target": target, "draft_dir": draft, "draft": draft_sd, "root": root}


# ---------------------------------------------------------------- the official computation, written out
def official_rope(grid: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T + grid^2, head_dim/2, 2): zeros for the caption prefix, then per grid cell the row angles in
    the first half of the pairs and the column angles in the second, frequencies base^(-2i/(head_dim/2))."""
    half = head_dim // 2
    freqs = 1.0 / base ** (torch.arange(0, half, 2)[: half // 2].float() / half)
    ang = torch.arange(grid).float()[:, None] * freqs  # (grid, head_dim/4)
    cells = torch.cat([ang[:, None, :].expand(grid, grid, -1), ang[None, :, :].expand(grid, grid, -1)], -1)
    table = torch.stack([cells.cos(), cells.sin()], -1).reshape(grid * grid, half, 2)
    return torch.cat([torch.zeros(T, half, 2), table])


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x (B, L, H, D), rope (L, D/2, 2): pairs (x[2i], x[2i+1]) rotated."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = rope[None, :, None, :, 0], rope[None, :, None, :, 1]
    return torch.stack([xs[..., 0] * c - xs[..., 1] * s, xs[..., 1] * c + xs[..., 0] * s], -1).flatten(3)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


@torch.no_grad()
def official_logits(sd, caps: torch.Tensor, emb_mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The official model's logits (B, t+1, V) after prefix position T-1 and each of the t tokens, for
    left-padded captions ``caps`` (B, T, C) with ``emb_mask`` (B, T): the mask is causal, keys of the
    prefix must be valid, and every position sees itself (generate.py's causal_mask edits)."""
    B, t = tokens.shape
    n_head = int(sd["_n_head"])
    dim = sd["tok_embeddings.weight"].shape[1]
    hd = dim // n_head
    cond = F.linear(F.gelu(F.linear(caps, sd["cls_embedding.cap_proj.fc1.weight"]), approximate="tanh"),
                    sd["cls_embedding.cap_proj.fc2.weight"])
    x = torch.cat([cond, sd["tok_embeddings.weight"][tokens]], 1)
    L = x.shape[1]
    rope = official_rope(GRID, hd)[:L]
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool))[None].repeat(B, 1, 1)
    mask[:, :, :T] &= emb_mask[:, None, :].bool()
    mask |= torch.eye(L, dtype=torch.bool)[None]
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    for i in range(layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "attention_norm.weight"])
        q, k, v = F.linear(h, sd[p + "attention.wqkv.weight"]).split(dim, -1)
        q, k = rotate(q.view(B, L, n_head, hd), rope), rotate(k.view(B, L, n_head, hd), rope)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.view(B, L, n_head, hd).transpose(1, 2),
                                           attn_mask=mask[:, None])
        x = x + F.linear(a.transpose(1, 2).reshape(B, L, dim), sd[p + "attention.wo.weight"])
        h = rms(x, sd[p + "ffn_norm.weight"])
        x = x + F.linear(F.silu(F.linear(h, sd[p + "feed_forward.w1.weight"])) * F.linear(h, sd[p + "feed_forward.w3.weight"]),
                         sd[p + "feed_forward.w2.weight"])
    return F.linear(rms(x, sd["norm.weight"]), sd["output.weight"])[:, T - 1:]


@torch.no_grad()
def official_captions(t5_dir, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """language/t5.py + sample_t2i.py: T5 states padded to T, then the valid ones moved to the end
    (left padding) and the padding zeroed; returns (caps (B, T, C), emb_mask (B, T))."""
    from transformers import AutoTokenizer, T5EncoderModel

    tok = AutoTokenizer.from_pretrained(str(t5_dir))
    enc = T5EncoderModel.from_pretrained(str(t5_dir)).eval()
    batch = tok([t.lower().strip() for t in texts], max_length=T, padding="max_length", truncation=True,
                add_special_tokens=True, return_tensors="pt")
    embs = enc(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"]
    moved = torch.stack([torch.cat([e[int(m.sum()):], e[:int(m.sum())]]) for e, m in zip(embs, mask)])
    flipped = torch.flip(mask, dims=[-1])
    return moved * flipped[:, :, None], flipped


def official_uncond(sd, B: int) -> torch.Tensor:
    return torch.zeros(B, T, CAPTION_DIM) + sd["cls_embedding.uncond_embedding"]


@torch.no_grad()
def official_greedy(sd, caps, emb_mask, cfg_scale: float, n: int) -> torch.Tensor:
    """generate.py with CFG (rows: captions, then the null caption under the same mask), greedy, as a
    plain loop over the full forward (no cache)."""
    B = caps.shape[0]
    rows, masks = torch.cat([caps, official_uncond(sd, B)]), torch.cat([emb_mask, emb_mask])
    seq = torch.zeros(B, 0, dtype=torch.long)
    for _ in range(n):
        logits = official_logits(sd, rows, masks, torch.cat([seq, seq]))[:, -1]
        c, u = logits.chunk(2)
        seq = torch.cat([seq, (u + cfg_scale * (c - u)).argmax(-1, keepdim=True)], 1)
    return seq


# ---------------------------------------------------------------- tests
def test_directory_loads_as_the_official_release(files):
    pipe = sv.load(str(files["dir"]))
    m = pipe.target
    assert pipe.conditioning == "caption" and pipe.family.name == "llamagen-t2i"
    assert (m.layout.height, m.layout.width, m.layout.vocab_size) == (GRID, GRID, CODES)
    assert (m.config.cls_token_num, m.config.caption_dim, m.config.n_head) == (T, CAPTION_DIM, 2)
    assert pipe.default_sampling == sv.Sampling(cfg_scale=7.5, top_k=1000)
    assert pipe.num_classes == 0
    assert torch.equal(m.cls_embedding.uncond_embedding, files["target"]["cls_embedding.uncond_embedding"])


def test_captions_are_the_t5_states(files):
    pipe = sv.load(str(files["dir"]))
    caps = pipe.prefix(PROMPTS)
    ref, mask = official_captions(files["dir"] / "t5-ckpt" / "flan-t5-xl", PROMPTS)
    n = mask.sum(1)
    assert caps.lengths.tolist() == n.tolist() == [len(p) + 1 for p in PROMPTS]  # characters + </s>
    for r in range(len(PROMPTS)):
        assert torch.allclose(caps.embeddings[r, : n[r]], ref[r, T - n[r]:], atol=1e-5)
    ids = pipe.processor.ids(PROMPTS[:1])  # a token-id prompt is flan-t5 input ids
    assert torch.allclose(pipe.prefix([ids[0]]).embeddings[0], caps.embeddings[0, : n[0]], atol=1e-6)
    assert clean_text("  A Red\n apple ") == "a red apple"


def test_cached_logits_equal_official_left_padded_forward(files):
    """Conditional and null-caption rows of ragged lengths; the cache is fed 1, 3, then 5 tokens a call."""
    pipe = sv.load(str(files["dir"]))
    m, sd = pipe.target, files["target"]
    cond = pipe.prefix(PROMPTS)
    caps, emb_mask = official_captions(files["dir"] / "t5-ckpt" / "flan-t5-xl", PROMPTS)
    rows = Condition(cond, m.unconditional(cond)).rows(True)
    ref_rows, ref_mask = torch.cat([caps, official_uncond(sd, 2)]), torch.cat([emb_mask, emb_mask])
    toks = torch.randint(0, CODES, (4, 9), generator=torch.Generator().manual_seed(0))
    ref = official_logits(sd, ref_rows, ref_mask, toks)  # (4, 10, V)
    assert torch.allclose(m.logits(rows, toks), ref, atol=1e-4)  # specvis's uncached forward
    m.setup_cache(4, extra=8)
    first, _ = m.prefill(rows)
    assert torch.allclose(first, ref[:, 0], atol=1e-4)
    fed = 0
    for n in (1, 3, 5):
        logits, _ = m.forward_tokens(toks[:, fed: fed + n], (fed + torch.arange(n))[None].expand(4, -1))
        assert torch.allclose(logits, ref[:, fed + 1: fed + 1 + n], atol=1e-4)
        fed += n
        m.set_committed(torch.full((4,), fed))


def test_methods_equal_official_greedy_cfg(files):
    pipe = sv.load(str(files["dir"]), draft=str(files["draft_dir"]))
    assert pipe.draft.config.dim == 64 and pipe.extras["draft"] == "draft"
    caps, emb_mask = official_captions(files["dir"] / "t5-ckpt" / "flan-t5-xl", PROMPTS)
    ref = official_greedy(files["target"], caps, emb_mask, 4.0, GRID * GRID)
    assert len(set(ref[0].tolist())) > 8  # not a degenerate constant image
    sampling = sv.Sampling(temperature=0, cfg_scale=4)
    pipe.drafter = sv.models.EagleDrafter.from_target(pipe.target, seed=1).eval()  # a fresh head: trees stay exact
    for method in (sv.AR(), sv.SJD(window=8), sv.Jacobi(window=8), sv.Speculative(gamma=3),
                   sv.EagleTree(depth=3, top_k=2, total_tokens=6), sv.ADTTree(total_tokens=6)):
        out = pipe(prompts=PROMPTS, method=method, sampling=sampling, decode=False)
        assert torch.equal(out.tokens, ref), type(method).__name__
    seen = []  # the demo's progress callback, as for every other pipeline
    out = pipe(prompts=PROMPTS, method=sv.AR(), sampling=sampling, progress=seen.append)  # VQ decode of the t2i tokenizer file
    assert len(out.images) == 2 and out.images[0].size == (2 * GRID, 2 * GRID)
    assert torch.equal(out.tokens, ref) and seen and seen[-1] == 1.0


def test_draft_uses_its_own_null_caption(files):
    """Each model fills null rows from its own uncond_embedding (the last n rows, n = the caption's length)."""
    pipe = sv.load(str(files["dir"]), draft=str(files["draft_dir"]))
    null = pipe.target.unconditional(pipe.prefix(PROMPTS))
    for model, sd in ((pipe.target, files["target"]), (pipe.draft, files["draft"])):
        x = model.embed_captions(null)
        want = official_uncond(sd, 2)
        for r, n in enumerate(null.lengths.tolist()):
            proj = F.linear(F.gelu(F.linear(want[r, T - n:], sd["cls_embedding.cap_proj.fc1.weight"]), approximate="tanh"),
                            sd["cls_embedding.cap_proj.fc2.weight"])
            assert torch.allclose(x[r, :n], proj, atol=1e-5)


def test_sampled_speculative_runs_and_c2i_is_untouched(files):
    pipe = sv.load(str(files["dir"]), draft=str(files["draft_dir"]))
    out = pipe(prompts=PROMPTS, method=sv.Speculative(gamma=3), sampling=sv.Sampling(cfg_scale=3, top_k=20),
               seed=1, decode=False)
    assert out.tokens.shape == (2, GRID * GRID) and int(out.tokens.max()) < CODES
    c2i = sv.models.LlamaGen(sv.models.LlamaGenConfig(vocab_size=8, dim=64, n_layer=1, n_head=1, num_classes=3, block_size=4))
    assert c2i.num_conditions == 3 and c2i.null_condition == 3 and type(c2i.cls_embedding).__name__ == "LabelEmbedder"


def one_line_error(fn, match: str) -> str:
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_bad_directories_give_one_line_errors(files, tmp_path):
    import shutil

    src = files["dir"]

    def copy(name, skip=()):
        d = tmp_path / name
        d.mkdir()
        for p in src.iterdir():
            if p.name not in skip:
                (shutil.copytree if p.is_dir() else shutil.copy)(p, d / p.name)
        return d

    one_line_error(lambda: sv.load(str(copy("novq", skip={"vq_ds16_t2i.pt"}))), "vq_ds16_t2i.pt")
    one_line_error(lambda: sv.load(str(copy("not5", skip={"t5-ckpt"}))), "flan-t5")
    d = copy("two")
    shutil.copy(d / "t2i_XL_stage1_256.pt", d / "t2i_XL_stage2_512.pt")
    one_line_error(lambda: sv.load(str(d)), "2 t2i GPT files.*specvis.json")
    d = copy("garbage", skip={"t2i_XL_stage1_256.pt"})
    (d / "t2i_XL_stage1_256.pt").write_bytes(b"not a checkpoint")
    one_line_error(lambda: sv.load(str(d)), "unreadable checkpoint")
    d = copy("c2i", skip={"t2i_XL_stage1_256.pt"})
    c2i = sv.models.LlamaGen(sv.models.LlamaGenConfig(vocab_size=CODES, dim=64, n_layer=1, n_head=1, num_classes=3))
    torch.save({"model": c2i.state_dict()}, d / "t2i_XL_stage1_256.pt")
    one_line_error(lambda: sv.load(str(d)), "c2i")
    d = copy("partial", skip={"t2i_XL_stage1_256.pt"})
    sd = {k: v for k, v in files["target"].items() if k != "layers.1.ffn_norm.weight"}
    save_gpt(d / "t2i_XL_stage1_256.pt", sd)
    one_line_error(lambda: sv.load(str(d)), "layers.1.ffn_norm.weight")
    d = copy("nosize", skip={"t2i_XL_stage1_256.pt"})
    shutil.copy(src / "t2i_XL_stage1_256.pt", d / "t2i_XL.pt")
    one_line_error(lambda: sv.load(str(d)), "image size")
    (d / "specvis.json").write_text(json.dumps({"gpt": "t2i_missing.pt"}))
    one_line_error(lambda: sv.load(str(d)), "t2i_missing.pt")
    (d / "specvis.json").write_text(json.dumps({"gpt": "t2i_XL.pt", "image_size": 128}))
    assert sv.load(str(d)).target.layout.height == 8  # the manifest names the file and the size
    pipe = sv.load(str(src))
    one_line_error(lambda: pipe(classes=[1]), "text-conditioned")
    one_line_error(lambda: pipe(prompts=PROMPTS, height=8, width=8, decode=False), "16x16")
    one_line_error(lambda: pipe(prompts=[[5] * (T + 1)], decode=False), "at most 120")  # str prompts are truncated
    one_line_error(lambda: pipe(prompts=[[5, 10 ** 6]], decode=False), "token ids")
    other = copy("wide", skip={"t2i_XL_stage1_256.pt", "t5-ckpt", "vq_ds16_t2i.pt"})
    wide = dict(files["draft"])
    wide["cls_embedding.uncond_embedding"] = torch.zeros(T, 2 * CAPTION_DIM)
    wide["cls_embedding.cap_proj.fc1.weight"] = torch.zeros(64, 2 * CAPTION_DIM)
    save_gpt(other / "t2i_small_256.pt", wide)
    one_line_error(lambda: sv.load(str(src), draft=str(other)), "same text encoder")
    one_line_error(lambda: sv.load(str(src), draft=str(files["root"])), "not a directory|config.json|t2i")


def test_caption_cleaning_is_the_official_clean_caption():
    """specvis's cleaning against LlamaGen's own ``T5Embedder.text_preprocessing`` (language/t5.py:
    clean_caption twice; run once on these prompts, see the fixture's README): URLs, HTML and entities,
    brackets, slashes, 1024x768 sizes, ids and hashes, file names, punctuation runs, nicknames, CJK,
    dashes and quotes, percent-encoding, mojibake, '-'/'_'-joined words and the four prompts of
    sample_t2i.py. Catches a rule dropped or misordered, a single pass instead of two, and the old
    lower-casing (which differs on 41 of the 54)."""
    import json
    from pathlib import Path

    ref = json.loads((Path(__file__).parent / "fixtures" / "llamagen_captions" / "clean_caption.json").read_text())
    got = {c["prompt"]: clean_text(c["prompt"]) for c in ref["cases"]}
    assert [c["prompt"] for c in ref["cases"] if got[c["prompt"]] != c["cleaned"]] == []
    assert sum(" ".join(c["prompt"].split()).lower() != c["cleaned"] for c in ref["cases"]) >= 40


def test_prompts_are_cleaned_before_flan_t5(files):
    """The caption of a prompt is the caption of its cleaned text (the tokenizer sees clean_caption's
    output): a URL, markup and a size are gone before tokenising."""
    pipe = sv.load(str(files["dir"]))
    raw = "A <b>Red</b> apple, 1024x768, see https://example.com/a.png now"
    assert clean_text(raw) == "a red apple, , see now"  # the official function's output for this prompt
    tok = pipe.processor.tokenizer
    assert pipe.processor.ids([raw]) == [tok("a red apple, , see now")["input_ids"]] != [tok(raw.lower())["input_ids"]]
