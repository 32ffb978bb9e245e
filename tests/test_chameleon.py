"""Chameleon-family checkpoints (Anole, Lumina-mGPT) in the transformers layout, on tiny random models
that transformers builds and saves: logits equal ChameleonModel + lm_head (query/key norms, swin norm),
and greedy decoding with each layout's CFG equals a plain reference loop over transformers' forward
(transformers itself cannot generate Chameleon images: its forward masks the image logits)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from specvis.families import load_decoder  # noqa: E402
from specvis.models.base import Condition, Prompts  # noqa: E402

CODES = 16
SPECIAL = ["<pad>", "<s>", "</s>", "<reserved08706>", "<racm3:break>", "<eoss>", "<reserved08799>"] + \
          [f"<reserved{8800 + n:05d}>" for n in range(1, 5)]


def img_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def make_chameleon(path, lumina: bool, swin: bool = False, seed: int = 0, codes: int = CODES,
                   max_positions: int = 256):
    """A tiny ChameleonForConditionalGeneration (Lumina-mGPT: architectures names the XLLMX class) with a
    character tokenizer holding the family's special tokens and image tokens; weights re-drawn at unit
    scale so greedy decoding is not degenerate."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)]
    names = SPECIAL + [img_name(c) for c in range(codes)] + chars
    vocab = {n: i for i, n in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[3:]})
    torch.manual_seed(seed)
    cfg = ChameleonConfig(vocab_size=len(names), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, swin_norm=swin, rope_theta=700.0,
                          rms_norm_eps=1e-6, max_position_embeddings=max_positions, vocabulary_map=vocab, image_token_id=3,
                          vq_config=dict(embed_dim=8, num_embeddings=codes, base_channels=32, channel_multiplier=[1, 1],
                                         num_res_blocks=1, attn_resolutions=[], resolution=32, latent_channels=8,
                                         in_channels=3, out_channels=3, double_latent=False))
    model = ChameleonForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vqmodel" in name:
                continue
            if p.dim() > 1:
                p.normal_(0, p.shape[1] ** -0.5 if "embed" not in name else 1.0)
            else:
                p.copy_((1.0 if "weight" in name else 0.0) + 0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    fast.save_pretrained(path)
    if lumina:
        import json

        c = json.loads((path / "config.json").read_text())
        c["architectures"] = ["ChameleonXLLMXForConditionalGeneration"]
        (path / "config.json").write_text(json.dumps(c))
    return path, model, fast


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Raw logits (L, V) of ChameleonModel + lm_head over one unpadded sequence."""
    h = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state
    return model.lm_head(h)[0]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("chameleon")
    return {"anole": make_chameleon(root / "anole", lumina=False),
            "lumina": make_chameleon(root / "lumina", lumina=True, swin=True)}


@pytest.mark.parametrize("name", ["anole", "lumina"])
def test_logits_equal_transformers(dirs, name: str) -> None:
    """Catches q/k norms not applied per head or not re-paired with the rotated rows, swin norm in the
    wrong place, image rows of lm_head out of code order, a row-end id that is not <reserved08799>."""
    path, hf, _ = dirs[name]
    H, W = 2, 4
    model = load_decoder(path, H, W)
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 40, 41, 42, 3, 4], [1, 50, 3, 4]]
    codes = torch.randint(0, CODES, (2, H * W), generator=g)
    stream = model.layout.forced().expand(2, -1).clone()
    stream[:, model.layout.image_index()] = codes
    ids = model.image_embed.token_map[stream]  # the same stream as text-vocabulary ids
    image_cols = model.image_embed.token_map[:CODES]
    ours = model.logits(Prompts.of(prompts), stream[:, :-1])
    for r, p in enumerate(prompts):
        ref = hf_logits(hf, p + ids[r, :-1].tolist())[len(p) - 1:, image_cols]
        assert (ours[r] - ref).abs().max() < 1e-4


@torch.no_grad()
def reference_greedy(hf, model, cond: list[int], uncond: list[int], H: int, W: int, cfg: float) -> list[int]:
    """Greedy CFG decoding with full recomputation through transformers' forward: guided = u + s (c - u)
    over the image tokens, the row-end token forced where the layout has one."""
    lay = model.layout
    forced = lay.forced()
    cols = model.image_embed.token_map[:CODES]
    c_ids, u_ids, codes = list(cond), list(uncond), []
    for pos in range(lay.stream_len):
        if forced[pos] >= 0:
            tok = int(model.image_embed.token_map[forced[pos]])
        else:
            c, u = hf_logits(hf, c_ids)[-1, cols], hf_logits(hf, u_ids)[-1, cols]
            code = int((u + cfg * (c - u)).argmax())
            codes.append(code)
            tok = int(cols[code])
        c_ids.append(tok)
        u_ids.append(tok)
    return codes


@pytest.mark.parametrize("name", ["anole", "lumina"])
def test_greedy_methods_equal_reference(dirs, name: str) -> None:
    """Text prompts through the layout's official template (tokenizer of the checkpoint) and its
    unconditional prompt; greedy AR, SJD, Jacobi and Speculative (draft: the same checkpoint) give the
    tokens of the reference loop over transformers' forward."""
    path, hf, _ = dirs[name]
    H, W = 2, 4
    pipe = sv.load(str(path))
    pipe.set_grid(H, W)  # the reference loop reads the layout from the model
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0)
    texts = ["a red apple", "cat"]
    cond = pipe.family.encode(pipe.processor, texts, H, W, pipe.target)
    uncond = pipe.family.negative(pipe.processor, 2, H, W, pipe.target)
    if name == "lumina":
        assert cond[0][-3:] == uncond[0] and len(uncond[0]) == 3  # begin-image, h, w: no text, no BOS
    else:
        assert uncond[0] == [1, 4] and cond[0][0] == 1 and cond[0][-2:] == [3, 4]
    ref = torch.tensor([reference_greedy(hf, pipe.target, c, u, H, W, 3.0) for c, u in zip(cond, uncond)])
    for method in (sv.AR(), sv.SJD(window=3, init="vertical-sample"), sv.Jacobi(window=3)):
        out = pipe(prompts=texts, method=method, sampling=greedy, decode=False, height=H, width=W)
        assert torch.equal(out.tokens, ref), method
    rows = Condition(Prompts.of(cond), Prompts.of(uncond))
    spec = sv.generate(pipe.target, rows, sv.Speculative(gamma=2), greedy, draft=load_decoder(path, H, W))
    assert torch.equal(spec.tokens, ref)


@pytest.mark.parametrize("name", ["anole", "lumina"])
def test_trees_lantern_and_images(dirs, name: str) -> None:
    """The rest of the methods on a Chameleon checkpoint with Meta's VQGAN files beside it: greedy
    EagleTree and ADTTree (a fresh EAGLE head on the target) give greedy AR's tokens (Lumina's row ends
    included), SJD with LANTERN over the VQGAN codebook runs, and images decode through the VQGAN."""
    from test_chameleon_vq import tiny_model, write_release

    path, _, _ = dirs[name]
    write_release(path / "tokenizer", tiny_model())
    H, W = 2, 4
    pipe = sv.load(str(path))
    pipe.set_grid(H, W)
    pipe.drafter = sv.models.EagleDrafter.from_target(pipe.target, seed=1).eval()
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0)
    texts = ["a red apple", "cat"]
    ar = pipe(prompts=texts, method=sv.AR(), sampling=greedy, decode=False, height=H, width=W).tokens
    for method in (sv.EagleTree(depth=3, top_k=2, total_tokens=6), sv.ADTTree(total_tokens=6)):
        assert torch.equal(pipe(prompts=texts, method=method, sampling=greedy, decode=False, height=H, width=W).tokens, ar)
    out = pipe(prompts=texts, method=sv.SJD(window=3, acceptance=sv.Lantern(k=3, delta=0.1)),
               sampling=sv.Sampling(cfg_scale=3.0), height=H, width=W)
    f = pipe.decoder.downsample  # pixels per token (16 in Meta's VQGAN, 2 in the tiny one)
    assert out.tokens.shape == (2, H * W) and [im.size for im in out.images] == [(f * W, f * H)] * 2


def test_cli_generate_on_a_chameleon_checkpoint(dirs, tmp_path) -> None:
    """`specvis generate --model DIR --prompt ...` on the Lumina-mGPT layout writes images, grid,
    heatmap and stats; a classes flag is refused with exit 2."""
    from test_chameleon_vq import tiny_model, write_release

    from specvis.cli import main

    path, _, _ = dirs["lumina"]
    write_release(path / "tokenizer", tiny_model())
    out = tmp_path / "out"
    assert main(["generate", "--model", str(path), "--prompt", "a red apple", "--prompt", "cat", "--height", "2",
                 "--width", "4", "--method", "sjd", "--window", "3", "--out", str(out)]) == 0
    assert {"000.png", "001.png", "grid.png", "heatmap.png", "stats.json"} <= {p.name for p in out.iterdir()}
    assert main(["generate", "--model", str(path), "--class", "1", "--out", str(tmp_path / "x")]) == 2


LUMINA_RELEASE = Path(__file__).parent / "fixtures" / "lumina_mgpt"


@pytest.mark.parametrize("mp", [1, 2])
def test_lumina_release_layout_reproduces_the_official_logits(mp: int) -> None:
    """Checkpoints written by Lumina-mGPT's own ``ChameleonXLLMXForConditionalGeneration`` (query/key
    norms of shape (model_parallel_size, head_dim); mp = 1 plain, mp = 2 with swin norm; made once from
    the official code, see the fixture's README): specvis loads them and its logits over the image codes
    equal those of Lumina's inference class on the same sequence (fp32). Catches the shard rows tiled
    over the heads instead of repeat-interleaved, a shard's row applied to one head only, and the load
    refusing the layout (the shape mismatch this replaces)."""
    import json

    path = LUMINA_RELEASE / f"mp{mp}"
    ref = json.loads((path / "reference_logits.json").read_text())
    model = load_decoder(path, ref["height"], ref["width"])
    assert model.chameleon_ids["lumina"]
    token_map = model.image_embed.token_map.tolist()
    stream = torch.tensor([[token_map.index(t) for t in ref["stream_ids"]]])
    assert torch.equal(stream[0][model.layout.forced() >= 0], model.layout.forced()[model.layout.forced() >= 0])
    ours = model.logits(Prompts.of([ref["prompt_ids"]]), stream[:, :-1])[0]
    P = len(ref["prompt_ids"])
    want = torch.tensor(ref["logits"])[P - 1:-1][:, token_map[:CODES]]
    assert ours.shape == want.shape and (ours - want).abs().max() < 1e-5


def test_query_key_norm_layouts_and_bad_shapes() -> None:
    """Per-head rows pass unchanged (transformers' layout); per-shard rows are repeat-interleaved over
    each shard's consecutive heads; a row count that does not divide the heads is one line naming the
    tensor."""
    from specvis.families.chameleon import per_head_norm

    key = "hf_layers.0.self_attn.q_norm.weight"
    per_head = torch.randn(4, 8)
    assert torch.equal(per_head_norm(key, per_head, 4, 2, 8, "d"), per_head)
    shards = torch.randn(2, 8)
    assert torch.equal(per_head_norm(key, shards, 4, 2, 8, "d"), shards[[0, 0, 1, 1]])
    assert torch.equal(per_head_norm(key.replace("q_norm", "k_norm"), shards, 4, 2, 8, "d"), shards)
    other = torch.randn(3, 8)
    assert per_head_norm("hf_layers.0.mlp.up_proj.weight", other, 4, 2, 8, "d") is other
    for bad in (torch.randn(3, 8), torch.randn(4, 6), torch.randn(0, 8)):
        with pytest.raises(ValueError, match="q_norm.weight has shape"):
            per_head_norm(key, bad, 4, 2, 8, "d")


@pytest.mark.parametrize("where,grid", [
    ("Lumina-mGPT-7B-512", (32, 32)), ("Lumina-mGPT-7B-768", (48, 48)), ("Lumina-mGPT-7B-1024", (64, 64)),
    ("hub/models--Alpha-VLLM--Lumina-mGPT-7B-1024/snapshots/0123abc", (64, 64)),
    ("Lumina-mGPT-7B-768-Omni", (48, 48)), ("lumina-mgpt-34b-512/weights", (32, 32)),
    ("my-lumina", (48, 48))])
def test_lumina_native_grid_is_the_releases_target_size(tmp_path, where: str, grid: tuple[int, int]) -> None:
    """The official inference runs at the checkpoint's target size (7B-512: 32x32 tokens, 7B-768: 48x48,
    7B-1024: 64x64), which only the release's name says: a directory named after it (or the Hub cache's
    models--Alpha-VLLM--<name> above the snapshot) sets the default grid and the size in the prompt's
    text; a name that tells nothing falls back to the official demo's 768 px. Anole stays 32x32."""
    import json
    import shutil

    d = tmp_path / where
    shutil.copytree(LUMINA_RELEASE / "mp1", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 10240}))
    model = load_decoder(d)
    assert (model.layout.height, model.layout.width) == grid
    anole = tmp_path / "Lumina-mGPT-7B-1024-anole"
    anole.mkdir()
    del cfg["z_loss_weight"]
    cfg["architectures"] = ["ChameleonForConditionalGeneration"]
    (anole / "config.json").write_text(json.dumps(cfg))
    shutil.copy(d / "model.safetensors", anole)
    assert (load_decoder(anole).layout.height, load_decoder(anole).layout.width) == (32, 32)


def test_lumina_release_name_with_an_unusable_size_is_one_line(tmp_path) -> None:
    import shutil

    d = tmp_path / "Lumina-mGPT-7B-500"
    shutil.copytree(LUMINA_RELEASE / "mp1", d)
    with pytest.raises(ValueError, match="500 px, not a multiple of Lumina-mGPT's 32-px patches; pass height="):
        load_decoder(d)
    assert load_decoder(d, 2, 4).layout.height == 2


@pytest.mark.parametrize("kind", ["lumina", "anole"])
def test_token_id_prompts_with_cfg_need_no_tokenizer(tmp_path, kind: str) -> None:
    """A checkpoint directory without tokenizer files (the Lumina release fixture; an Anole copy of it):
    token-id prompts under CFG get the family's official unconditional rows from config ids alone
    (Lumina-mGPT: the prompt from its begin-image on, i.e. [begin-image, h, w]; Anole: [BOS,
    begin-image]) and generate exactly what the same rows given as negative prompts generate. A
    Lumina prompt without begin-image is one line."""
    import json
    import shutil

    d = tmp_path / kind
    shutil.copytree(LUMINA_RELEASE / "mp1", d)
    if kind == "anole":
        cfg = json.loads((d / "config.json").read_text())
        del cfg["z_loss_weight"]
        cfg["architectures"] = ["ChameleonForConditionalGeneration"]
        (d / "config.json").write_text(json.dumps(cfg))
    ref = json.loads((d / "reference_logits.json").read_text())
    pipe = sv.load(str(d))
    prompts = [ref["prompt_ids"], ref["prompt_ids"][:2] + ref["prompt_ids"][4:]]
    want = [[4, 7, 8]] * 2 if kind == "lumina" else [[1, 4]] * 2
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0)
    cond = pipe.conditions(prompts, None, greedy, 2, 4)
    assert [cond.uncond.ids[r, : int(cond.uncond.lengths[r])].tolist() for r in range(2)] == want
    assert pipe._processor is None  # no tokenizer was loaded
    out = pipe(prompts=prompts, method=sv.AR(), sampling=greedy, decode=False, height=2, width=4)
    same = pipe(prompts=prompts, negative_prompts=want, method=sv.AR(), sampling=greedy, decode=False, height=2, width=4)
    assert torch.equal(out.tokens, same.tokens)
    if kind == "lumina":
        with pytest.raises(ValueError, match="lacks token 4, where this model's unconditional prompt starts"):
            pipe(prompts=[[1, 26, 27]], sampling=greedy, decode=False, height=2, width=4)
