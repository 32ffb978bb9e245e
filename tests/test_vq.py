"""VQ tokenizer: official key layout, checkpoint round trips, shapes, quantiser behaviour."""
from __future__ import annotations

import argparse
import json

import pytest
import torch
import torch.nn.functional as F

from specvis.models.vq import VQConfig, VQModel, _infer_config

# Tensor names and shapes of the official LlamaGen VQ-16 tokenizer (vq_ds16_c2i.pt, 343 tensors + the
# quantize.codebook_used buffer), checked against the reference implementation's layout.
OFFICIAL_VQ16 = {
    "encoder.conv_in.weight": (128, 3, 3, 3),
    "encoder.conv_blocks.2.res.0.nin_shortcut.bias": (256,),
    "encoder.conv_blocks.3.downsample.conv.weight": (256, 256, 3, 3),
    "encoder.conv_blocks.4.attn.1.proj_out.weight": (512, 512, 1, 1),
    "encoder.mid.1.q.bias": (512,),
    "encoder.mid.2.conv2.weight": (512, 512, 3, 3),
    "encoder.norm_out.weight": (512,),
    "encoder.conv_out.weight": (256, 512, 3, 3),
    "quant_conv.weight": (8, 256, 1, 1),
    "quantize.embedding.weight": (16384, 8),
    "post_quant_conv.bias": (256,),
    "decoder.conv_in.weight": (512, 256, 3, 3),
    "decoder.conv_blocks.0.attn.2.v.weight": (512, 512, 1, 1),
    "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
    "decoder.conv_blocks.3.upsample.conv.bias": (128,),
    "decoder.conv_out.weight": (3, 128, 3, 3),
}

TINY = dict(codebook_size=64, codebook_embed_dim=4, encoder_ch_mult=[1, 2, 2], decoder_ch_mult=[1, 2, 2],
            z_channels=16, ch=8, num_res_blocks=1, norm_groups=4)


def tiny(seed: int = 0, **kw) -> VQModel:
    torch.manual_seed(seed)
    model = VQModel(VQConfig(**{**TINY, **kw}))
    with torch.no_grad():  # spread the codebook so codes differ between inputs
        model.quantize.embedding.weight.normal_()
    return model.eval()


def images(b: int = 2, h: int = 16, w: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_official_key_layout_vq16():
    with torch.device("meta"):
        model = VQModel(VQConfig())  # defaults = VQ-16: ch 128, ch_mult [1,1,2,2,4], 2 res blocks
    sd = model.state_dict()
    assert len(sd) == 343
    for key, shape in OFFICIAL_VQ16.items():
        assert key in sd, key
        assert tuple(sd[key].shape) == shape, key
    inferred = _infer_config(sd, "meta")
    assert VQConfig(**inferred) == VQConfig()


@pytest.mark.parametrize("wrap", ["model", "ema", "raw", "compiled", "ddp", "training"])
def test_from_checkpoint_round_trip(tmp_path, wrap):
    model = tiny()
    sd = model.state_dict()
    if wrap == "compiled":
        sd = {f"_orig_mod.{k}": v for k, v in sd.items()}
    if wrap == "ddp":
        sd = {f"module.{k}": v for k, v in sd.items()}
    sd["quantize.codebook_used"] = torch.zeros(65536)  # official training buffer: ignored
    blob = sd if wrap == "raw" else {("ema" if wrap == "ema" else "model"): sd, "steps": 3}
    if wrap == "training":  # LlamaGen's vq_train.py also stores optimizer state and its argparse args
        opt = torch.optim.Adam(model.parameters())
        blob.update(optimizer=opt.state_dict(), args=argparse.Namespace(vq_model="VQ-16", lr=1e-4))
    path = tmp_path / "vq.pt"
    torch.save(blob, path)
    loaded = VQModel.from_checkpoint(path, norm_groups=4)
    assert loaded.config == model.config
    x = images()
    codes = model.encode(x)
    assert torch.equal(loaded.encode(x), codes)
    assert torch.equal(loaded.decode(codes), model.decode(codes))


def test_asymmetric_decoder_inferred(tmp_path):
    model = tiny(decoder_ch_mult=[1, 1, 2], num_res_blocks=2)
    torch.save({"model": model.state_dict()}, tmp_path / "a.pt")
    loaded = VQModel.from_checkpoint(tmp_path / "a.pt", norm_groups=4)
    assert loaded.config.decoder_ch_mult == [1, 1, 2] and loaded.config.num_res_blocks == 2
    codes = model.encode(images())
    assert torch.equal(loaded.decode(codes), model.decode(codes))


def test_save_pretrained_round_trip(tmp_path):
    model = tiny(codebook_l2_norm=False)
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["codebook_l2_norm"] is False
    loaded = VQModel.from_pretrained(tmp_path / "m")
    x = images()
    assert loaded.config == model.config
    assert torch.equal(loaded.encode(x), model.encode(x))
    assert not list((tmp_path / "m").glob("*.tmp"))


def test_encode_decode_shapes():
    model = tiny()
    codes = model.encode(images(3, 16, 16))
    assert codes.dtype == torch.long and codes.shape == (3, 16)  # 16x16 / 4 -> 4x4 tokens
    assert int(codes.min()) >= 0 and int(codes.max()) < 64
    out = model.decode(codes)
    assert out.shape == (3, 3, 16, 16) and float(out.abs().max()) <= 1.0
    wide = model.encode(images(1, 8, 16))
    assert wide.shape == (1, 8)
    assert model.decode(wide, size=(2, 4)).shape == (1, 3, 8, 16)
    assert model.encode_latents(images()).shape == (2, 4, 4, 4)


def test_codebook_is_what_the_quantiser_uses():
    model = tiny()
    cb = model.codebook
    assert cb.shape == (64, 4)
    assert torch.allclose(cb.norm(dim=1), torch.ones(64), atol=1e-6)
    z = model.encode_latents(images(), normalized=True)
    flat = z.permute(0, 2, 3, 1).reshape(-1, 4)
    brute = torch.cdist(flat, cb).argmin(1).view(2, -1)
    assert torch.equal(brute, model.encode(images()))
    lat = model.codes_to_latents(brute)
    assert torch.equal(model.decode_latents(lat), model.decode(brute))
    raw = tiny(codebook_l2_norm=False)
    assert torch.equal(raw.codebook, raw.quantize.embedding.weight)


def test_straight_through_gradients():
    model = tiny().train()
    recon, losses = model(images())
    assert recon.shape == (2, 3, 16, 16) and set(losses) == {"codebook", "commit"}
    (recon.square().mean() + losses["codebook"] + losses["commit"]).backward()
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0  # through the quantiser
    assert model.quantize.embedding.weight.grad.abs().sum() > 0  # codebook loss
    model.zero_grad()
    recon, _ = model(images())
    recon.mean().backward()  # reconstruction alone must reach the encoder
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0


def test_attention_matches_explicit_formula():
    block = tiny().encoder.mid[1]
    x = torch.randn(2, 16, 4, 4)
    y = block.norm(x)
    q, k, v = (m(y).flatten(2) for m in (block.q, block.k, block.v))  # (B, C, hw)
    w = torch.softmax(torch.bmm(q.transpose(1, 2), k) * 16 ** -0.5, dim=2)  # (B, hw_q, hw_k)
    h = torch.bmm(v, w.transpose(1, 2)).reshape(2, 16, 4, 4)
    assert torch.allclose(block(x), x + block.proj_out(h), atol=1e-5)


def test_downsampling_levels():
    assert VQConfig(**TINY).downsample == 4
    assert VQConfig().downsample == 16


@pytest.mark.parametrize("kw,field", [({"ch": 0}, "ch"), ({"norm_groups": 3}, "norm_groups"),
                                      ({"encoder_ch_mult": []}, "encoder_ch_mult"),
                                      ({"decoder_ch_mult": [1, 2]}, "decoder_ch_mult")])
def test_bad_config(kw, field):
    with pytest.raises(ValueError, match=field):
        VQConfig(**{**TINY, **kw})


def test_bad_inputs(tmp_path):
    model = tiny()
    with pytest.raises(ValueError, match="images"):
        model.encode(torch.rand(1, 1, 16, 16))
    with pytest.raises(ValueError, match="multiples"):
        model.encode(torch.rand(1, 3, 10, 16))
    with pytest.raises(ValueError, match="codes"):
        model.decode(torch.full((1, 16), 64))
    with pytest.raises(ValueError, match="square"):
        model.decode(torch.zeros(1, 8, dtype=torch.long))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="unreadable checkpoint") as err:
        VQModel.from_checkpoint(junk)
    assert "\n" not in str(err.value)
    sd = model.state_dict()
    del sd["decoder.conv_out.bias"]
    torch.save({"model": sd}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="decoder.conv_out.bias"):
        VQModel.from_checkpoint(tmp_path / "partial.pt", norm_groups=4)
    torch.save({"model": {"foo": torch.zeros(1)}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a LlamaGen VQ checkpoint"):
        VQModel.from_checkpoint(tmp_path / "other.pt")
    torch.save({"model": model.state_dict()}, tmp_path / "ok.pt")
    with pytest.raises(ValueError, match="unknown VQConfig field"):
        VQModel.from_checkpoint(tmp_path / "ok.pt", bogus=1)
    with pytest.raises(ValueError, match="cannot read model directory"):
        VQModel.from_pretrained(tmp_path / "missing")


def test_l2_quantiser_loss_values():
    model = tiny().train()
    z = torch.randn(2, 4, 3, 3)
    zq, codes, losses = model.quantize(z)
    zn = F.normalize(z, dim=1)
    target = model.codebook[codes.view(2, 3, 3)].permute(0, 3, 1, 2)
    assert torch.allclose(zq, target, atol=1e-6)
    mse = F.mse_loss(zn, target)
    assert torch.allclose(losses["codebook"], mse) and torch.allclose(losses["commit"], 0.25 * mse)
