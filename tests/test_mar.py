"""MAR (specvis.models.mar), its KL-VAE (specvis.models.kl_vae) and MAR directories (specvis.families.mar):
official file formats and names, strict loading, shapes, and MAR's own sampler (order, cosine mask
schedule, CFG schedule, per-sample seeds). Tiny random models, seconds on CPU."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specvis.models.continuous as continuous
from specvis.families import mar as mar_family
from specvis.pipeline import Pipeline
from specvis.models.kl_vae import KLVAE, KLVAEConfig
from specvis.models.mar import (MAR, MARConfig, cfg_scales, from_official_key, infer_config, load_mar_checkpoint,
                                mask_schedule, to_official_key)

TINY = dict(img_size=16, vae_stride=4, patch_size=1, encoder_embed_dim=32, encoder_depth=2, encoder_num_heads=2,
            decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4, vae_embed_dim=3, class_num=5, buffer_size=4,
            diffloss_d=2, diffloss_w=32, num_sampling_steps=4, num_train_steps=20, diffusion_batch_mul=2)


def mar_pipeline(*args, **kwargs) -> Pipeline:
    """The ``Pipeline`` of a MAR directory, as ``sv.load`` builds it from the family's fields."""
    return Pipeline(**mar_family.pipeline_fields(*args, **kwargs))


def tiny_mar(seed: int = 0, **overrides) -> MAR:
    """A tiny MAR whose every tensor is random (the official init zeroes the head's output)."""
    torch.manual_seed(seed)
    model = MAR(MARConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def tiny_vae(seed: int = 0) -> KLVAE:
    torch.manual_seed(seed)
    cfg = KLVAEConfig(embed_dim=3, ch=32, ch_mult=[1, 1, 2], num_res_blocks=1, resolution=16,
                      encoder_attn_resolutions=[4], decoder_attn_resolutions=[])
    vae = KLVAE(cfg).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return vae


def official_mar_keys(cfg: MARConfig) -> set[str]:
    """The state-dict names of LTH14/mar models/mar.py + models/diffloss.py + timm's ViT Block, written out."""
    keys = {"class_emb.weight", "fake_latent", "z_proj.weight", "z_proj.bias", "z_proj_ln.weight", "z_proj_ln.bias",
            "encoder_pos_embed_learned", "encoder_norm.weight", "encoder_norm.bias", "decoder_embed.weight",
            "decoder_embed.bias", "mask_token", "decoder_pos_embed_learned", "decoder_norm.weight",
            "decoder_norm.bias", "diffusion_pos_embed_learned"}
    block = ["norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"]
    for side, depth in (("encoder", cfg.encoder_depth), ("decoder", cfg.decoder_depth)):
        keys |= {f"{side}_blocks.{i}.{m}.{w}" for i in range(depth) for m in block for w in ("weight", "bias")}
    net = ["input_proj", "time_embed.mlp.0", "time_embed.mlp.2", "cond_embed", "final_layer.linear",
           "final_layer.adaLN_modulation.1"]
    net += [f"res_blocks.{i}.{m}" for i in range(cfg.diffloss_d) for m in ("in_ln", "mlp.0", "mlp.2", "adaLN_modulation.1")]
    keys |= {f"diffloss.net.{m}.{w}" for m in net for w in ("weight", "bias")}
    return keys


# ---------------------------------------------------------------- names and files

def test_state_dict_has_the_official_names_and_shapes():
    model = tiny_mar()
    sd = model.state_dict()
    assert set(sd) == official_mar_keys(model.config)
    E, Dd, L, C = 32, 32, 16, 3
    assert sd["encoder_pos_embed_learned"].shape == (1, L + 4, E)
    assert sd["diffusion_pos_embed_learned"].shape == (1, L, Dd)
    assert sd["diffloss.net.final_layer.linear.weight"].shape == (2 * C, 32)  # learned sigma: eps and v
    assert sd["diffloss.net.res_blocks.1.adaLN_modulation.1.weight"].shape == (3 * 32, 32)
    assert sd["diffloss.net.cond_embed.weight"].shape == (32, Dd)
    for key in sd:  # the rename table is a bijection on the head's names
        assert to_official_key(from_official_key(key)) == key


def test_checkpoint_roundtrip_model_and_ema(tmp_path):
    model, ema = tiny_mar(0), tiny_mar(1)
    path = tmp_path / "checkpoint-last.pth"
    model.save_checkpoint(path, ema_state_dict=ema.state_dict())
    raw = torch.load(path, weights_only=False)
    assert set(raw) >= {"model", "model_ema", "args"} and set(raw["model_ema"]) == official_mar_keys(model.config)
    for want, use_ema in ((ema, True), (model, False)):
        got = load_mar_checkpoint(path, ema=use_ema)
        assert got.config == model.config
        a, b = got.state_dict(), want.state_dict()
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), k
    got = load_mar_checkpoint(path)
    x = torch.randn(2, 16, 3)
    mask = torch.zeros(2, 16, dtype=torch.bool).scatter(1, torch.tensor([[0, 5], [3, 9]]), True)
    assert torch.allclose(got.features(x, mask, torch.tensor([1, 2])), ema.features(x, mask, torch.tensor([1, 2])))


def test_bad_checkpoints_give_one_line_errors(tmp_path):
    model = tiny_mar()
    sd = model.state_dict()
    missing = dict(sd)
    del missing["diffloss.net.res_blocks.0.in_ln.weight"]
    path = tmp_path / "checkpoint-last.pth"
    torch.save({"model": sd, "model_ema": missing, "args": argparse.Namespace(**model.config_dict())}, path)
    with pytest.raises(ValueError, match=r"diffloss\.net\.res_blocks\.0\.in_ln\.weight") as e:
        load_mar_checkpoint(path, config=model.config)
    assert "\n" not in str(e.value)
    load_mar_checkpoint(path, ema=False, config=model.config)  # model itself is fine
    extra = dict(sd, **{"diffloss.net.res_blocks.9.in_ln.weight": torch.zeros(32)})
    torch.save({"model_ema": extra}, path)
    with pytest.raises(ValueError, match=r"unexpected.*res_blocks\.9\.in_ln\.weight"):
        load_mar_checkpoint(path, config=model.config)
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="unreadable MAR checkpoint") as e:
        load_mar_checkpoint(tmp_path / "junk.pth")
    assert "\n" not in str(e.value)
    torch.save({"model_ema": sd}, path)  # no args, width 32 is no preset: heads unknown
    with pytest.raises(ValueError, match="head count"):
        load_mar_checkpoint(path)


def test_presets_and_config_inference_at_full_size(monkeypatch):
    """mar_base/large/huge as in models/mar.py + the README's diffloss sizes: parameter counts are the
    README's 208M / 479M / 943M (rounded up), and the config is recovered from a state dict + official args."""
    def on_cpu(fn):
        def wrapped(*a, **k):
            with torch.device("cpu"):
                return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(continuous, "make_betas", on_cpu(continuous.make_betas))
    monkeypatch.setattr(continuous, "respace", on_cpu(continuous.respace))
    counts = {}
    for name in ("mar_base", "mar_large", "mar_huge"):
        with torch.device("meta"):
            model = MAR(MARConfig.preset(name))
        counts[name] = math.ceil(sum(p.numel() for p in model.parameters()) / 1e6)
        if name == "mar_base":
            args = argparse.Namespace(model="mar_base", num_sampling_steps="100", vae_embed_dim=16, patch_size=1)
            assert infer_config(model.state_dict(), args) == model.config
            assert model.seq_len == 256 and model.token_embed_dim == 16 and model.buffer_size == 64
    assert counts == {"mar_base": 208, "mar_large": 479, "mar_huge": 943}


def test_kl_vae_official_names_roundtrip_and_errors(tmp_path):
    vae = tiny_vae()
    sd = vae.state_dict()
    for key in ("encoder.down.2.attn.0.q.weight", "encoder.down.1.downsample.conv.weight",
                "encoder.down.2.block.0.nin_shortcut.weight",
                "encoder.mid.attn_1.proj_out.weight", "decoder.up.0.block.1.conv2.weight",
                "decoder.up.2.upsample.conv.weight", "decoder.mid.block_2.norm1.weight", "quant_conv.weight",
                "post_quant_conv.weight", "encoder.conv_out.weight", "decoder.conv_in.weight"):
        assert key in sd, key
    assert not any(k.startswith("decoder.up.") and ".attn." in k for k in sd)  # KL-16 decoder: mid attention only
    assert "decoder.up.0.upsample.conv.weight" not in sd and "encoder.down.2.downsample.conv.weight" not in sd
    assert sd["encoder.conv_out.weight"].shape[0] == 2 * 3 and sd["quant_conv.weight"].shape[:2] == (6, 6)
    # the official layout {"model": sd} and LDM's {"state_dict": sd + loss.*}, config inferred from the tensors
    path = tmp_path / "kl16.ckpt"
    vae.save_checkpoint(path)
    ldm = tmp_path / "ldm.ckpt"
    torch.save({"state_dict": {**sd, "loss.logvar": torch.zeros(())}, "global_step": 3}, ldm)
    for p in (path, ldm):
        got = KLVAE.from_checkpoint(p)
        assert set(got.state_dict()) == set(sd)
        for k, v in got.state_dict().items():
            assert torch.equal(v, sd[k]), k
    z = torch.randn(2, 3, 4, 4)
    assert torch.allclose(got.decode(z), vae.decode(z))
    broken = dict(sd)
    del broken["decoder.up.1.block.0.conv1.weight"]
    torch.save({"model": broken}, path)
    with pytest.raises(ValueError, match=r"decoder\.up\.1\.block\.0\.conv1\.weight") as e:
        KLVAE.from_checkpoint(path, config=vae.config)
    assert "\n" not in str(e.value)
    (tmp_path / "junk.ckpt").write_text("junk")
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        KLVAE.from_checkpoint(tmp_path / "junk.ckpt")


def test_kl_vae_shapes_and_mar_scale():
    vae = tiny_vae()
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    mean, logvar = vae.encode_moments(images)
    assert mean.shape == logvar.shape == (2, 3, 4, 4)
    assert torch.allclose(vae.encode(images), mean * 0.2325)
    g = torch.Generator().manual_seed(0)
    sample = vae.encode(images, sample=True, generator=g)
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(sample, (mean + torch.exp(0.5 * logvar) * eps) * 0.2325)
    z = torch.randn(2, 3, 4, 4)
    out = vae.decode(z)
    assert out.shape == (2, 3, 16, 16) and out.abs().max() <= 1
    assert torch.allclose(out, vae.decode_raw(z / 0.2325).clamp(-1, 1))


# ---------------------------------------------------------------- model

FIXTURES = Path(__file__).parent / "fixtures" / "mar_diffusion"


def _digest(steps: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, steps)).encode()).hexdigest()[:16]


def test_respacing_keeps_the_official_steps_for_every_count_and_form():
    """Against the official ``space_timesteps`` (LTH14/mar diffusion/respace.py, run once: the fixture's
    README): every K in 1..1000 at T = 1000 (int and digit string), section lists and "ddimN". Catches
    linspace(0, T-1, K).round() (282 counts differ, e.g. K = 21 keeps 499, not 500), a rounding other
    than Python's half-to-even on the accumulated stride, and section sizes split the wrong way."""
    from specvis.diffusion import space_timesteps

    ref = json.loads((FIXTURES / "space_timesteps.json").read_text())
    T = ref["num_timesteps"]
    for K in range(1, T + 1):
        assert _digest(space_timesteps(T, K)) == ref["counts"][str(K)], K
    for K, steps in ref["full"].items():
        assert space_timesteps(T, K) == steps
        assert torch.linspace(0, T - 1, int(K), dtype=torch.float64).round().long().tolist() != steps  # the old rule
    for case in ref["strings"]:
        if "error" in case:
            with pytest.raises(ValueError, match="num_sampling_steps"):
                space_timesteps(case["num_timesteps"], case["spec"])
        else:
            assert space_timesteps(case["num_timesteps"], case["spec"]) == case["steps"], case["spec"]


def test_mar_config_takes_the_official_step_forms_and_refuses_others_in_one_line():
    """MARConfig.num_sampling_steps as main_mar.py passes it (a string): counts, section lists and
    "ddimN" reach the DiffLoss sampler; anything else is one line naming the field and the forms."""
    from specvis.diffusion import space_timesteps

    for spec in ("21", 21, "10,15,20", "ddim25"):
        model = MAR(MARConfig(**{**TINY, "num_train_steps": 1000, "num_sampling_steps": spec}))
        assert model.diffloss.sampler.timesteps.tolist() == space_timesteps(1000, spec)
        assert model.diffloss.train_diffusion.num_steps == 1000
    for bad in ("ddim1", "abc", "0", 1001, "-5", "10,,5", True, 2.5, "1,999"):
        with pytest.raises(ValueError, match="MARConfig.num_sampling_steps") as e:
            MARConfig(**{**TINY, "num_train_steps": 1000, "num_sampling_steps": bad})
        assert "\n" not in str(e.value)


def test_learned_variance_is_the_official_unclamped_interpolation():
    """p(x_{t-1} | x_t) against the official ``p_mean_variance`` (LTH14/mar gaussian_diffusion.py, learned
    range, respaced to "21", run once: the fixture's README) on network outputs with |v| up to 3: log
    variance f log beta_t + (1 - f) log beta_tilde_t with f = (v + 1) / 2 unclamped. Clamping v to
    [-1, 1] is off by 1.78 at |v| = 2.03; the respacing rule shows in the step the net is queried at."""
    from specvis.diffusion import GaussianDiffusion, make_betas, respace

    ref = json.loads((FIXTURES / "p_mean_variance.json").read_text())
    d = GaussianDiffusion(*respace(make_betas(ref["noise_schedule"], ref["num_train_steps"]), ref["respacing"]))
    x, eps, v = (torch.tensor(ref[k], dtype=torch.float64) for k in ("x", "eps", "v"))
    i = torch.tensor(ref["step_index"])
    assert d.timesteps[i].tolist() == ref["model_timesteps"]
    mean, logvar = d.p_mean_logvar(torch.cat([eps, v], 1), x, i)
    want_lv, want_mean = torch.tensor(ref["log_variance"], dtype=torch.float64), torch.tensor(ref["mean"], dtype=torch.float64)
    assert (logvar - want_lv).abs().max() < 1e-4
    assert (mean - want_mean).abs().max() < 1e-4 * (1 + want_mean.abs().max())
    hi = torch.maximum(d.log_betas[i], d.posterior_log_variance[i]).double()[:, None]
    lo = torch.minimum(d.log_betas[i], d.posterior_log_variance[i]).double()[:, None]
    assert ((want_lv > hi + 0.5) | (want_lv < lo - 0.5)).sum() >= 8  # rows where a clamp of v would be off


def _ln(x, sd, name, eps=1e-6):
    return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], eps)


def _lin(x, sd, name):
    return F.linear(x, sd[name + ".weight"], sd[name + ".bias"])


def reference_diffloss_net(sd, x, t, c, depth):
    """SimpleMLPAdaLN.forward of models/diffloss.py, from the official-named tensors."""
    p = "diffloss.net."
    half = 128
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    temb = _lin(F.silu(_lin(torch.cat([torch.cos(args), torch.sin(args)], -1), sd, p + "time_embed.mlp.0")), sd,
                p + "time_embed.mlp.2")
    y = temb + _lin(c, sd, p + "cond_embed")
    h = _lin(x, sd, p + "input_proj")
    for i in range(depth):
        b = f"{p}res_blocks.{i}."
        shift, scale, gate = _lin(F.silu(y), sd, b + "adaLN_modulation.1").chunk(3, -1)
        hh = _ln(h, sd, b + "in_ln") * (1 + scale) + shift
        h = h + gate * _lin(F.silu(_lin(hh, sd, b + "mlp.0")), sd, b + "mlp.2")
    shift, scale = _lin(F.silu(y), sd, p + "final_layer.adaLN_modulation.1").chunk(2, -1)
    return _lin(F.layer_norm(h, h.shape[-1:], eps=1e-6) * (1 + scale) + shift, sd, p + "final_layer.linear")


def reference_features(sd, cfg, tokens, mask, class_embedding):
    """forward_mae_encoder + forward_mae_decoder of models/mar.py (timm Block: fused qkv, heads), from the
    official-named tensors."""
    def block(x, pre, heads):
        B, N, D = x.shape
        q, k, v = _lin(_ln(x, sd, pre + "norm1"), sd, pre + "attn.qkv").reshape(B, N, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) * (D // heads) ** -0.5, -1) @ v
        x = x + _lin(att.transpose(1, 2).reshape(B, N, D), sd, pre + "attn.proj")
        return x + _lin(F.gelu(_lin(_ln(x, sd, pre + "norm2"), sd, pre + "mlp.fc1")), sd, pre + "mlp.fc2")

    B, L, _ = tokens.shape
    nb = cfg.buffer_size
    x = _lin(tokens, sd, "z_proj")
    x = torch.cat([torch.zeros(B, nb, x.shape[-1]), x], 1)
    x[:, :nb] = class_embedding[:, None]
    x = _ln(x + sd["encoder_pos_embed_learned"], sd, "z_proj_ln")
    keep = torch.cat([torch.zeros(B, nb), mask.float()], 1) == 0
    x = x[keep].reshape(B, -1, x.shape[-1])
    for i in range(cfg.encoder_depth):
        x = block(x, f"encoder_blocks.{i}.", cfg.encoder_num_heads)
    x = _lin(_ln(x, sd, "encoder_norm"), sd, "decoder_embed")
    full = sd["mask_token"].repeat(B, L + nb, 1)
    full[keep] = x.reshape(-1, x.shape[-1])
    x = full + sd["decoder_pos_embed_learned"]
    for i in range(cfg.decoder_depth):
        x = block(x, f"decoder_blocks.{i}.", cfg.decoder_num_heads)
    return _ln(x, sd, "decoder_norm")[:, nb:] + sd["diffusion_pos_embed_learned"]


def test_model_computes_the_official_functions_from_official_names():
    model = tiny_mar()
    sd = model.state_dict()
    x, t, c = torch.randn(5, 3), torch.tensor([0, 3, 7, 12, 19]), torch.randn(5, 32)
    assert torch.allclose(model.diffloss.net(x, t, c), reference_diffloss_net(sd, x, t, c, 2), atol=1e-5)
    tokens = torch.randn(2, 16, 3)
    mask = torch.zeros(2, 16, dtype=torch.bool).scatter(1, torch.tensor([[0, 4, 9, 15], [1, 2, 3, 8]]), True)
    labels = torch.tensor([3, -1])
    cls = torch.stack([sd["class_emb.weight"][3], sd["fake_latent"][0]])
    got = model.features(tokens, mask, labels)
    assert torch.allclose(got, reference_features(sd, model.config, tokens, mask, cls), atol=1e-4)


def test_patchify_matches_the_official_layout():
    model = tiny_mar(patch_size=2, img_size=32, vae_embed_dim=2)  # seq 4x4, token dim 2*2*2
    x = torch.randn(3, 2, 8, 8)
    tokens = model.patchify(x)
    assert tokens.shape == (3, 16, 8)
    ref = torch.einsum("nchpwq->nhwcpq", x.reshape(3, 2, 4, 2, 4, 2)).reshape(3, 16, 8)  # official patchify
    assert torch.equal(tokens, ref)
    assert torch.equal(model.unpatchify(tokens), x)


def test_forward_shapes_masking_and_training_loss():
    model = tiny_mar()
    x = torch.randn(2, 16, 3)
    mask = torch.zeros(2, 16, dtype=torch.bool).scatter(1, torch.tensor([[0, 1, 2], [5, 6, 7]]), True)
    enc = model.forward_mae_encoder(x, mask, model.class_embedding(torch.tensor([0, 1]), 2))
    assert enc.shape == (2, 4 + 13, 32)
    z = model.forward_mae_decoder(enc, mask)
    assert z.shape == (2, 16, 32)
    # a masked token's value never reaches the network; a known one does
    y = x.clone()
    y[0, 0] += 5.0
    assert torch.equal(model.features(y, mask, torch.tensor([0, 1])), model.features(x, mask, torch.tensor([0, 1])))
    y[0, 3] += 5.0
    assert not torch.allclose(model.features(y, mask, torch.tensor([0, 1]))[0], z[0])
    # label -1 / None is the fake latent
    assert torch.equal(model.class_embedding(torch.tensor([-1, 2]), 2)[0], model.fake_latent[0])
    model.train()
    g = torch.Generator().manual_seed(0)
    loss = model.forward_train(model.unpatchify(x), torch.tensor([0, 4]), g)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    for name in ("diffloss.net.input_proj.weight", "z_proj.weight", "encoder_blocks.0.attn.qkv.weight", "mask_token"):
        assert dict(model.named_parameters())[from_official_key(name)].grad.abs().sum() > 0, name
    assert all(model.sample_mask_ratio(g) >= 0.7 for _ in range(50))


def test_training_loss_averages_the_masked_tokens_only(monkeypatch):
    """Official forward_loss/DiffLoss.forward: every token repeated diffusion_batch_mul times, the
    per-token loss averaged over the masked ones (the first ceil(L * ratio) of the order)."""
    model = tiny_mar()
    monkeypatch.setattr(model, "sample_mask_ratio", lambda generator=None: 0.45)  # ceil(16 * 0.45) = 8
    monkeypatch.setattr(model, "sample_orders", lambda batch, gens: torch.arange(16).flip(0).expand(batch, -1))
    seen = {}

    def per_token(z, x0, generator=None):
        seen["rows"] = z.shape[0]
        return x0[:, 0]

    monkeypatch.setattr(model.diffloss, "loss", per_token)
    x = torch.randn(2, 16, 3)
    loss = model.forward_train(x, torch.tensor([0, 1]))
    assert seen["rows"] == 2 * 16 * 2
    assert torch.allclose(loss, x[:, 8:, 0].mean())  # masked: the order's first 8 = positions 15..8


# ---------------------------------------------------------------- sampler

def test_mask_schedule_matches_the_official_cosine_counts():
    # L = 16, 4 steps: floor(16 cos(pi/8)) = 14, floor(16 cos(pi/4)) = 11, floor(16 cos(3pi/8)) = 6, then 1
    assert mask_schedule(16, 4) == ([14, 11, 6, 1], [2, 3, 5, 6])
    assert mask_schedule(256, 64)[1][0] == 256 - math.floor(256 * math.cos(math.pi / 128))
    lens, reveals = mask_schedule(4, 6)  # more steps than tokens: at least one left masked until the end
    assert sum(reveals) == 4 and lens == [3, 2, 1, 1, 1, 1] and reveals == [1, 1, 1, 0, 0, 1]
    for L, n in ((256, 64), (256, 256), (16, 1), (9, 5)):
        assert sum(mask_schedule(L, n)[1]) == L
    assert cfg_scales(3.0, "linear", 16, [14, 11, 6, 1]) == [1 + 2 * 2 / 16, 1 + 2 * 5 / 16, 1 + 2 * 10 / 16, 1 + 2 * 15 / 16]
    assert cfg_scales(3.0, "constant", 16, [14, 1]) == [3.0, 3.0]
    with pytest.raises(ValueError, match="cfg_schedule"):
        cfg_scales(3.0, "cosine", 16, [1])


def test_sampler_reveals_every_token_once_following_the_schedule(monkeypatch):
    model = tiny_mar()
    out = model.sample(torch.tensor([1, 3]), num_iter=4, cfg=2.0, seed=0)
    assert out.tokens.shape == (2, 16, 3) and out.order.shape == (2, 16)
    assert out.reveals == [2, 3, 5, 6] and [s.shape[1] for s in out.steps] == [2, 3, 5, 6]
    allpos = torch.cat(out.steps, 1)
    assert torch.equal(allpos.sort(1).values, torch.arange(16).expand(2, -1))  # each position exactly once
    end = 16
    for s, m in enumerate(out.mask_lens):  # step s reveals the order's slice after the tokens left masked
        lo = 0 if s == 3 else m
        assert torch.equal(out.steps[s].sort(1).values, out.order[:, lo:end].sort(1).values)
        end = lo
    # what is written where: each revealed token is its own step's draw, never overwritten
    calls = []

    def marked(z, z_uncond=None, cfg_scale=1.0, temperature=1.0, generator=None, x_T=None, noise=None):
        calls.append((z.shape[0], cfg_scale))
        assert temperature == 0.9 and z_uncond is not None and z_uncond.shape == z.shape
        assert x_T.abs().min() > 0 and noise[:, -1].abs().max() == 0 and noise[:, :-1].abs().min() > 0  # p_sample: no noise at t=0
        N = z.shape[0]
        x = torch.full((N, 1, 3), float(len(calls)))
        return continuous.Trajectory(x.expand(N, 2, 3), x, x, x)

    monkeypatch.setattr(model.diffloss, "sample_trajectory", marked)
    out = model.sample(torch.tensor([1, 3]), num_iter=4, cfg=2.0, seed=0, temperature=0.9)
    assert torch.equal(out.tokens[..., 0], out.step_of.float() + 1)
    assert [c[0] for c in calls] == [2 * n for n in [2, 3, 5, 6]]
    assert [c[1] for c in calls] == out.cfg_scales == [1 + (16 - m) / 16 for m in [14, 11, 6, 1]]


def test_sampler_is_reproducible_and_batch_invariant():
    model = tiny_mar()
    labels = torch.tensor([1, 3])
    a = model.sample(labels, num_iter=4, cfg=2.5, seed=7)
    b = model.sample(labels, num_iter=4, cfg=2.5, seed=7)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.order, b.order)
    c = model.sample(labels, num_iter=4, cfg=2.5, seed=8)
    assert not torch.allclose(a.tokens, c.tokens)
    assert torch.isfinite(a.tokens).all()
    # batch 2 with seeds (7, 8) == two batch-1 runs with seeds 7 and 8
    for i in range(2):
        one = model.sample(labels[i:i + 1], num_iter=4, cfg=2.5, seed=7 + i)
        assert torch.equal(one.order[0], a.order[i])
        assert torch.allclose(one.tokens[0], a.tokens[i], rtol=1e-4, atol=1e-4 * a.tokens.abs().max().item())
    gens = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)]
    assert torch.equal(model.sample(labels, num_iter=4, cfg=2.5, generator=gens).tokens, a.tokens)


def test_cfg_scale_one_equals_no_cfg_and_null_class_is_fake_latent():
    model = tiny_mar()
    labels = torch.tensor([0, 2])
    plain = model.sample(labels, num_iter=3, cfg=1.0, seed=3)
    guided = model.sample(labels, num_iter=3, cfg=1.0, seed=3, guidance=True)
    assert torch.equal(plain.order, guided.order)
    tol = 1e-4 * plain.tokens.abs().max().item()
    assert torch.allclose(plain.tokens, guided.tokens, rtol=1e-4, atol=tol)
    # guidance does act ...
    strong = model.sample(labels, num_iter=3, cfg=4.0, cfg_schedule="constant", seed=3)
    assert not torch.allclose(plain.tokens, strong.tokens, rtol=1e-3, atol=tol)
    # ... and its unconditional half is the fake latent: at scale 0, with the head's variance output
    # zeroed (so both halves share it), the guided sample is the unconditional one
    with torch.no_grad():
        lin = model.diffloss.net.output
        lin.weight[3:] = 0
        lin.bias[3:] = 0
    zero = model.sample(labels, num_iter=3, cfg=0.0, cfg_schedule="constant", seed=3)
    uncond = model.sample(None, batch=2, num_iter=3, cfg=1.0, seed=3)
    assert torch.allclose(zero.tokens, uncond.tokens, rtol=1e-4, atol=1e-4 * uncond.tokens.abs().max().item())


# ---------------------------------------------------------------- MAR directories

def test_mar_directory_pipeline(tmp_path):
    model, vae = tiny_mar(), tiny_vae()
    d = tmp_path / "pretrained_models" / "mar" / "mar_tiny"
    d.mkdir(parents=True)
    (tmp_path / "pretrained_models" / "vae").mkdir()
    model.save_checkpoint(d / "checkpoint-last.pth")
    vae.save_checkpoint(tmp_path / "pretrained_models" / "vae" / "kl16.ckpt")
    assert mar_family.matches_dir(d) and not mar_family.matches_dir(tmp_path)
    pipe = mar_pipeline(str(d), d)
    from specvis.sampling import Sampling

    out = pipe(classes=[0, 4], sampling=Sampling(cfg_scale=2.0), seed=5, num_iter=4)
    assert len(out.images) == 2 and out.images[0].size == (16, 16)
    assert out.latents.shape == (2, 16, 3) and out.stats.target_forwards == 4
    assert out.stats.accept_map.sum().item() == sum(n * n for n in [2, 3, 5, 6]) * 2
    # MAR's own sampler through generate: one generator for the batch, seeded with the call's seed
    ref = model.sample(torch.tensor([0, 4]), num_iter=4, cfg=2.0, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(out.latents, ref.tokens) and out.tokens is None
    with pytest.raises(ValueError, match="class ids"):
        pipe(classes=[5], seed=0)
    (tmp_path / "pretrained_models" / "vae" / "kl16.ckpt").unlink()
    with pytest.raises(ValueError, match="kl16.ckpt"):
        mar_pipeline(str(d), d)
