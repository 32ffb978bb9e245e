"""specvis.models.chameleon_vq: Meta's Chameleon VQGAN (Anole, Lumina-mGPT) from files written in Meta's
formats (vqgan.yaml, vqgan.ckpt with a state_dict, text_tokenizer.json). Encoder + quantiser codes equal
transformers' ChameleonVQVAE on the same weights; the decoder equals taming's Decoder forward assembled
from transformers' Chameleon blocks; tokenizer-folder layouts; one-line errors for bad files."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

yaml = pytest.importorskip("yaml")

from specvis.models.chameleon_vq import (  # noqa: E402
    ChameleonVQ,
    ChameleonVQConfig,
    find_tokenizer_dir,
    image_token_ids,
    load_chameleon_vq,
)

V, D = 16, 8  # codebook size, code vector size
DDCONFIG = dict(double_z=False, z_channels=16, resolution=16, in_channels=3, out_ch=3, ch=32, ch_mult=[1, 2],
                num_res_blocks=1, attn_resolutions=[8], dropout=0.0)


def yaml_doc(n_embed: int = V, **dd) -> dict:
    """vqgan.yaml as Meta's release lays it out (model.target / model.params with ckpt_path, ddconfig, lossconfig)."""
    return {"model": {"base_learning_rate": 4.5e-06, "target": "taming.models.vqgan.VQModel",
                      "params": {"embed_dim": D, "n_embed": n_embed, "ckpt_path": "/checkpoint/vqgan.ckpt",
                                 "ddconfig": {**DDCONFIG, **dd},
                                 "lossconfig": {"target": "taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator",
                                                "params": {"disc_start": 0, "codebook_weight": 1.0}}}}}


def img_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def text_tokenizer(n_codes: int = V, seed: int = 0) -> tuple[dict, list[int]]:
    """A tokenizers JSON (BPE model) whose vocabulary holds special, text and image tokens, the image
    tokens at shuffled ids; returns (document, BPE id of each code in code order)."""
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<racm3:break>", "<eoss>", "<reserved08706>"]
    perm = torch.randperm(n_codes, generator=torch.Generator().manual_seed(seed)).tolist()
    names = specials + [img_name(c) for c in perm] + list("abcdefgh")
    vocab = {n: i for i, n in enumerate(names)}
    doc = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for s in specials],
           "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": vocab, "merges": []}}
    return doc, [vocab[img_name(c)] for c in range(n_codes)]


def tiny_model(seed: int = 0) -> ChameleonVQ:
    """Random weights; codebook rows are encoder latents of random images (plus noise) so that codes
    of other random images spread over the codebook."""
    torch.manual_seed(seed)
    model = ChameleonVQ(ChameleonVQConfig.from_dict(yaml_doc()))
    with torch.no_grad():
        z = model.quant_conv(model.encoder(images(4, 16, 16, seed=100 + seed)))
        rows = z.permute(0, 2, 3, 1).reshape(-1, D)
        pick = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(seed))[:V]
        model.quantize.embedding.weight.copy_(rows[pick] + 0.01 * torch.randn(V, D))
    return model.eval()


def images(b: int = 2, h: int = 16, w: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def write_release(folder, model: ChameleonVQ, doc: dict | None = None, extra: dict | None = None,
                  vocab_doc: dict | None = None) -> None:
    """Meta's tokenizer folder: vqgan.yaml, vqgan.ckpt ({"state_dict": ...} + trainer fields), text_tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(yaml.safe_dump(doc or yaml_doc()))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd.update(extra or {})
    torch.save({"state_dict": sd, "epoch": 3, "global_step": 1200}, folder / "vqgan.ckpt")
    (folder / "text_tokenizer.json").write_text(json.dumps(vocab_doc or text_tokenizer()[0]))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("chameleon_vq")
    model = tiny_model()
    write_release(root / "tokenizer", model)
    return root / "tokenizer", model


def one_line_error(fn, match: str) -> str:
    with pytest.raises(ValueError, match=match) as info:
        fn()
    text = str(info.value)
    assert "\n" not in text, text
    return text


# --------------------------------------------------------------------------- layout and transformers parity


def test_key_layout_full_size_matches_transformers():
    """Chameleon's real VQGAN (transformers' ChameleonVQVAEConfig defaults = vqgan.yaml's sizes): the
    non-decoder tensors have transformers' names and shapes; the decoder has taming's up/mid layout."""
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ours = ChameleonVQ().state_dict()
        theirs = transformers.ChameleonVQVAE(transformers.ChameleonVQVAEConfig()).state_dict()
    enc = {k: tuple(v.shape) for k, v in ours.items() if not k.startswith("decoder.")}
    assert enc == {k: tuple(v.shape) for k, v in theirs.items()}
    dec = {k: tuple(v.shape) for k, v in ours.items() if k.startswith("decoder.")}
    assert len(dec) == 164  # conv_in 2 + mid 26 + 5 levels x 3 blocks x 8 + 2 shortcuts + 4 upsamplers + out 4
    assert dec["decoder.conv_in.weight"] == (512, 256, 3, 3)
    assert dec["decoder.up.4.upsample.conv.weight"] == (512, 512, 3, 3)
    assert dec["decoder.up.3.block.0.nin_shortcut.weight"] == (256, 512, 1, 1)
    assert dec["decoder.up.1.block.0.nin_shortcut.weight"] == (128, 256, 1, 1)
    assert dec["decoder.up.0.block.2.conv2.weight"] == (128, 128, 3, 3)
    assert "decoder.up.0.upsample.conv.weight" not in dec and "decoder.mid.attn_1.q.weight" in dec
    assert dec["decoder.conv_out.weight"] == (3, 128, 3, 3)


def hf_vqvae(folder):
    """transformers' ChameleonVQVAE from the same files: vqgan.yaml renamed as transformers' conversion
    script renames it, the checkpoint's non-decoder tensors under their own names (test-only)."""
    transformers = pytest.importorskip("transformers")
    params = yaml.safe_load((folder / "vqgan.yaml").read_text())["model"]["params"]
    dd = params["ddconfig"]
    cfg = transformers.ChameleonVQVAEConfig(
        embed_dim=params["embed_dim"], num_embeddings=params["n_embed"], double_latent=dd["double_z"],
        latent_channels=dd["z_channels"], resolution=dd["resolution"], in_channels=dd["in_channels"],
        out_channels=dd["out_ch"], base_channels=dd["ch"], channel_multiplier=dd["ch_mult"],
        num_res_blocks=dd["num_res_blocks"], attn_resolutions=dd["attn_resolutions"], dropout=dd["dropout"])
    sd = torch.load(folder / "vqgan.ckpt", weights_only=True)["state_dict"]
    vq = transformers.ChameleonVQVAE(cfg)
    vq.load_state_dict({k: v for k, v in sd.items() if not k.startswith("decoder.")}, strict=True)
    return vq.eval()


@pytest.mark.parametrize("shape", [(3, 16, 16), (2, 32, 48)])
def test_encode_equals_transformers(release, shape):
    folder, _ = release
    ours = load_chameleon_vq(folder)
    theirs = hf_vqvae(folder)
    b, h, w = shape
    x = images(b, h, w, seed=7)
    codes = ours.encode(x)
    with torch.no_grad():
        out = theirs.encode(x)
    f = ours.downsample
    assert codes.shape == (b, (h // f) * (w // f)) and codes.dtype == torch.long
    assert torch.equal(codes, out.image_tokens.view(b, -1))
    assert codes.unique().numel() >= V // 2  # the comparison is not between constant maps
    latents = ours.codebook[codes].view(b, h // f, w // f, D).permute(0, 3, 1, 2)
    assert torch.allclose(latents, out.quantized_last_hidden_state, atol=1e-6)


@torch.no_grad()
def reference_decode(sd: dict, codes: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """taming's Decoder.forward (conv_in, mid block/attn/block, levels from the deepest: num_res_blocks + 1
    blocks each followed by attention where the level's resolution is listed, nearest x2 + conv between
    levels, GroupNorm-swish-conv_out) on transformers' Chameleon ResnetBlock / AttnBlock, which are the
    same taming blocks; every decoder tensor of the checkpoint must be consumed, each block loaded strictly."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.chameleon import modeling_chameleon as mc

    hc = transformers.ChameleonVQVAEConfig(dropout=0.0)
    used: set[str] = set()

    def sub(prefix):
        out = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        used.update(prefix + k for k in out)
        return out

    def res(prefix, cin, cout):
        block = mc.ChameleonVQVAEEncoderResnetBlock(hc, cin, cout)
        block.load_state_dict(sub(prefix), strict=True)
        return block.eval()

    def attn(prefix, c):
        block = mc.ChameleonVQVAEEncoderAttnBlock(c)
        block.load_state_dict(sub(prefix), strict=True)
        return block.eval()

    def conv(prefix, x, padding):
        p = sub(prefix)
        return F.conv2d(x, p["weight"], p["bias"], padding=padding)

    ch, mult, nrb = DDCONFIG["ch"], DDCONFIG["ch_mult"], DDCONFIG["num_res_blocks"]
    z = sd["quantize.embedding.weight"][codes].view(codes.shape[0], h, w, D).permute(0, 3, 1, 2)
    x = conv("post_quant_conv.", z, 0)
    c = ch * mult[-1]
    r = DDCONFIG["resolution"] // 2 ** (len(mult) - 1)
    x = conv("decoder.conv_in.", x, 1)
    x = res("decoder.mid.block_2.", c, c)(attn("decoder.mid.attn_1.", c)(res("decoder.mid.block_1.", c, c)(x)))
    for i in reversed(range(len(mult))):
        for j in range(nrb + 1):
            x = res(f"decoder.up.{i}.block.{j}.", c, ch * mult[i])(x)
            c = ch * mult[i]
            if r in DDCONFIG["attn_resolutions"]:
                x = attn(f"decoder.up.{i}.attn.{j}.", c)(x)
        if i:
            x = conv(f"decoder.up.{i}.upsample.conv.", F.interpolate(x, scale_factor=2.0, mode="nearest"), 1)
            r *= 2
    norm = sub("decoder.norm_out.")
    x = F.group_norm(x, 32, norm["weight"], norm["bias"], eps=1e-6)
    x = conv("decoder.conv_out.", x * torch.sigmoid(x), 1)
    assert used == {k for k in sd if k.startswith(("decoder.", "post_quant_conv."))}
    return x.clamp(-1, 1)


def test_decode_equals_taming_reference(release):
    folder, _ = release
    vq = load_chameleon_vq(folder)
    sd = torch.load(folder / "vqgan.ckpt", weights_only=True)["state_dict"]
    codes = torch.randint(0, V, (2, 3 * 5), generator=torch.Generator().manual_seed(3))
    ours = vq.decode(codes, 3, 5)
    assert ours.shape == (2, 3, 6, 10)
    assert (ours - reference_decode(sd, codes, 3, 5)).abs().max() < 1e-5


def test_decode_shapes_range_and_interface(release):
    folder, model = release
    vq = load_chameleon_vq(folder)
    assert vq.codebook.shape == (V, D) and torch.equal(vq.codebook, model.quantize.embedding.weight)
    assert not vq.codebook.requires_grad and vq.codebook_size == V and vq.downsample == 2
    codes = torch.randint(0, V, (3, 4 * 6), generator=torch.Generator().manual_seed(0))
    out = vq.decode(codes, 4, 6)
    assert out.shape == (3, 3, 8, 12) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1 and out.std() > 0
    assert vq.decode(codes[:, :16]).shape == (3, 3, 8, 8)  # square grid without height/width
    x = images(2, 16, 16)
    assert vq.decode(vq.encode(x), 8, 8).shape == x.shape  # round trip keeps the image size
    assert torch.equal(load_chameleon_vq(folder, grid=(4, 6)).decode(codes), out)
    assert torch.equal(vq.decode(codes.int(), 4, 6), out)
    for bad, msg in [(lambda: vq.decode(codes), "not a square"),
                     (lambda: vq.decode(codes, 4, 5), "does not match"),
                     (lambda: vq.decode(codes + V, 4, 6), r"\[0, 16\)"),
                     (lambda: vq.decode(codes.float(), 4, 6), "integer"),
                     (lambda: vq.decode(codes, 4), "both"),
                     (lambda: vq.encode(images(1, 15, 16)), "multiples of 2"),
                     (lambda: vq.encode(torch.zeros(1, 1, 16, 16)), r"\(B, 3, H, W\)")]:
        one_line_error(bad, msg)
    # the same interface as the transformers-backed decoder, so the pipeline can use either
    from specvis.models.hf_vq import HFVQDecoder

    for name in ("decode", "codebook", "codebook_size", "downsample"):
        assert hasattr(HFVQDecoder, name) and hasattr(vq, name)


def test_dtype_and_loss_tensors_ignored(tmp_path):
    model = tiny_model(seed=1)
    write_release(tmp_path, model, extra={"loss.discriminator.main.0.weight": torch.zeros(4, 3, 4, 4),
                                          "loss.perceptual_loss.lin0.model.1.weight": torch.zeros(1, 64, 1, 1)})
    vq = load_chameleon_vq(tmp_path, dtype=torch.float64)
    assert vq.codebook.dtype == torch.float64
    codes = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(1))
    assert (vq.decode(codes).float() - model.decode(codes)).abs().max() < 1e-5


# --------------------------------------------------------------------------- BPE <-> code mapping


def test_image_token_ids_from_text_tokenizer(tmp_path):
    doc, expected = text_tokenizer(n_codes=123, seed=5)  # multi-digit codes, shuffled ids
    path = tmp_path / "text_tokenizer.json"
    path.write_text(json.dumps(doc))
    ids = image_token_ids(path)
    assert ids == expected
    assert image_token_ids(doc["model"]["vocab"]) == expected
    tokenizers = pytest.importorskip("tokenizers")
    assert tokenizers.Tokenizer.from_file(str(path)).token_to_id(img_name(42)) == ids[42]  # a real tokenizer file
    transformers = pytest.importorskip("transformers")
    mapping = transformers.models.chameleon.modeling_chameleon.ChameleonImageVocabularyMapping(doc["model"]["vocab"])
    assert ids == [mapping.img2bpe[c] for c in range(123)]
    assert all(mapping.bpe2img[b] == c for c, b in enumerate(ids))


def test_loader_attaches_mapping(release):
    folder, _ = release
    assert load_chameleon_vq(folder).image_token_ids == text_tokenizer()[1]


@pytest.mark.parametrize("bad,msg", [
    ("{not json", "unreadable text tokenizer"),
    (json.dumps({"model": {"type": "BPE"}}), "model.vocab"),
    (json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}), "no IMGIMG"),
    (json.dumps({"model": {"vocab": {img_name(0): 4, img_name(2): 5}}}), "no code 1"),
    (json.dumps({"model": {"vocab": {img_name(0): 4, "IMGIMGAAZ": 5}}}), "two image tokens"),
    (json.dumps({"model": {"vocab": {"IMGIMGxyZ": 4}}}), "does not spell"),
])
def test_image_token_ids_errors(tmp_path, bad, msg):
    path = tmp_path / "text_tokenizer.json"
    path.write_text(bad)
    one_line_error(lambda: image_token_ids(path), msg)


# --------------------------------------------------------------------------- folder layouts


@pytest.mark.parametrize("layout,given,tokenizer", [
    ("tokenizer folder itself", ".", "."),
    ("Meta / Anole repo root", ".", "tokenizer"),
    ("Meta / Anole models/7b", "models/7b", "tokenizer"),
    ("converted checkpoint next to tokenizer/", "anole-hf", "tokenizer"),
    ("Lumina-mGPT ckpts/", "ckpts", "ckpts/chameleon/tokenizer"),
    ("Lumina-mGPT ckpts/<model>", "ckpts/Lumina-mGPT-7B-768", "ckpts/chameleon/tokenizer"),
])
def test_layouts(release, tmp_path, layout, given, tokenizer):
    folder, model = release
    shutil.copytree(folder, tmp_path / tokenizer, dirs_exist_ok=True)
    (tmp_path / given).mkdir(parents=True, exist_ok=True)
    (tmp_path / given / "config.json").write_text("{}")
    assert find_tokenizer_dir(tmp_path / given).resolve() == (tmp_path / tokenizer).resolve()
    vq = load_chameleon_vq(tmp_path / given)
    assert torch.equal(vq.codebook, model.codebook)


# --------------------------------------------------------------------------- bad files


def test_bad_files(release, tmp_path):
    folder, model = release
    one_line_error(lambda: load_chameleon_vq(tmp_path / "missing"), "not a directory")
    (tmp_path / "empty").mkdir()
    one_line_error(lambda: load_chameleon_vq(tmp_path / "empty"), "no Chameleon VQGAN tokenizer")

    def case(name, edit):
        d = tmp_path / name
        shutil.copytree(folder, d)
        edit(d)
        return d

    d = case("no_ckpt", lambda d: (d / "vqgan.ckpt").unlink())
    one_line_error(lambda: load_chameleon_vq(d), "has vqgan.yaml but no vqgan.ckpt")
    d = case("no_yaml", lambda d: (d / "vqgan.yaml").unlink())
    one_line_error(lambda: load_chameleon_vq(d), "has vqgan.ckpt but no vqgan.yaml")
    d = case("bad_yaml", lambda d: (d / "vqgan.yaml").write_text("model: [unclosed\n  params: {"))
    one_line_error(lambda: load_chameleon_vq(d), "unreadable VQGAN config")
    no_dd = yaml.safe_dump({"model": {"params": {"embed_dim": 8}}})
    d = case("no_ddconfig", lambda d: (d / "vqgan.yaml").write_text(no_dd))
    one_line_error(lambda: load_chameleon_vq(d), "expected model.params")
    d = case("double_z", lambda d: (d / "vqgan.yaml").write_text(yaml.safe_dump(yaml_doc(double_z=True))))
    one_line_error(lambda: load_chameleon_vq(d), "double_z=True is not supported")
    d = case("groups", lambda d: (d / "vqgan.yaml").write_text(yaml.safe_dump(yaml_doc(ch=24))))
    one_line_error(lambda: load_chameleon_vq(d), "multiple of the 32 GroupNorm groups")
    d = case("garbage_ckpt", lambda d: (d / "vqgan.ckpt").write_bytes(b"not a checkpoint at all"))
    one_line_error(lambda: load_chameleon_vq(d), "unreadable VQGAN checkpoint")
    blob = {"state_dict": model.state_dict(), "hparams": argparse.Namespace(a=1)}  # e.g. a trainer's saved args
    d = case("pickled_object", lambda d: torch.save(blob, d / "vqgan.ckpt"))
    one_line_error(lambda: load_chameleon_vq(d), "weights_only torch.load refuses the Python object argparse.Namespace")

    def save(d, sd):
        torch.save({"state_dict": sd}, d / "vqgan.ckpt")

    sd = model.state_dict()
    d = case("missing_key", lambda d: save(d, {k: v for k, v in sd.items() if k != "decoder.conv_out.bias"}))
    one_line_error(lambda: load_chameleon_vq(d), "lacks 1 tensors, e.g. 'decoder.conv_out.bias'")
    d = case("extra_key", lambda d: save(d, {**sd, "decoder.up.0.attn.0.q.weight": torch.zeros(32, 32, 1, 1)}))
    one_line_error(lambda: load_chameleon_vq(d), "1 unexpected tensors")
    d = case("not_tensor", lambda d: save(d, {**sd, "quantize.embedding.weight": [1, 2]}))
    one_line_error(lambda: load_chameleon_vq(d), "is not a tensor")
    d = case("n_embed", lambda d: (d / "vqgan.yaml").write_text(yaml.safe_dump(yaml_doc(n_embed=32))))
    one_line_error(lambda: load_chameleon_vq(d), "shape mismatch for 'quantize.embedding.weight'")
    d = case("vocab_size", lambda d: (d / "text_tokenizer.json").write_text(json.dumps(text_tokenizer(n_codes=12)[0])))
    one_line_error(lambda: load_chameleon_vq(d), "12 image tokens for a codebook of 16")
    d = case("bad_vocab", lambda d: (d / "text_tokenizer.json").write_text("]"))
    one_line_error(lambda: load_chameleon_vq(d), "unreadable text tokenizer")
    d = case("no_vocab", lambda d: (d / "text_tokenizer.json").unlink())
    assert load_chameleon_vq(d).image_token_ids is None  # the mapping is optional for decoding
