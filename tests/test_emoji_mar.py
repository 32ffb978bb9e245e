"""The emoji MAR pair in the bundle: ``bundle --add mar_target mar_draft`` keeps MAR's official
checkpoint layout slimmed to fp16 EMA weights, ``sv.load("emoji-mar")`` builds MAR's pipeline over the
bundle's VQ (``SphereLatentDecoder``), ``--num-iter`` sets MAR's sampler steps and is refused where it
does not apply. Tiny random models in a temporary bundle; the shipped pair is checked when installed."""

from __future__ import annotations

import json

import pytest
import torch

import specvis as sv
from specvis import zoo
from specvis.cli import main as cli
from specvis.families.mar import SphereLatentDecoder
from specvis.methods.cspd import CSpD
from specvis.models.mar import CHECKPOINT_NAME, MAR, MARConfig, load_mar_checkpoint
from specvis.models.vq import VQConfig, VQModel
from specvis.train import bundle

TINY = dict(img_size=16, vae_stride=4, patch_size=1, encoder_embed_dim=16, encoder_depth=1, encoder_num_heads=2,
            decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2, vae_embed_dim=4, class_num=3, buffer_size=2,
            diffloss_d=1, diffloss_w=16, num_sampling_steps=4, num_train_steps=16, diffusion_batch_mul=1,
            clip_denoised=2.0)


def tiny_mar(seed: int, **overrides) -> MAR:
    torch.manual_seed(seed)
    return MAR(MARConfig(**{**TINY, **overrides})).eval()


@pytest.fixture(scope="module")
def emoji_root(tmp_path_factory):
    """runs/ with two train_mar-like runs (EMA weights != raw weights) and a bundle holding a tiny VQ."""
    base = tmp_path_factory.mktemp("emoji_mar")
    runs, root = base / "runs", base / "assets" / "emoji"
    for run, seed in (("mar_emoji", 0), ("mar_emoji_draft", 1)):
        model = tiny_mar(seed, **({"decoder_depth": 2} if seed == 0 else {}))
        ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in model.state_dict().items()}
        (runs / run).mkdir(parents=True)
        model.save_checkpoint(runs / run / CHECKPOINT_NAME, ema_state_dict=ema)
        (runs / run / "report.json").write_text(json.dumps({"steps": 7 + seed}))
    torch.manual_seed(0)
    VQModel(VQConfig(codebook_size=32, codebook_embed_dim=4, encoder_ch_mult=[1, 2, 2], decoder_ch_mult=[1, 2, 2],
                     z_channels=8, ch=8, num_res_blocks=1, norm_groups=4)).save_pretrained(root / "vq")
    (root / "bundle.json").write_text(json.dumps({"name": "emoji", "class_names": ["a", "b", "c"], "components": ["vq"],
                                                  "bytes": {}, "training": {}}))
    meta = bundle.add_parts(runs, root, ["mar_target", "mar_draft"])
    assert meta["training"]["mar_draft"] == {"steps": 8} and meta["components"] == ["mar_draft", "mar_target", "vq"]
    return runs, base / "assets"


def test_bundle_keeps_the_official_layout_with_fp16_ema_weights(emoji_root):
    runs, assets = emoji_root
    path = assets / "emoji" / "mar_target" / CHECKPOINT_NAME
    with torch.serialization.safe_globals([__import__("argparse").Namespace]):
        raw = torch.load(str(path), weights_only=True)
    assert sorted(raw) == ["args", "epoch", "model_ema"]  # the raw weights are not shipped
    assert all(v.dtype == torch.float16 for v in raw["model_ema"].values() if v.is_floating_point())
    shipped = load_mar_checkpoint(path)
    ema = load_mar_checkpoint(runs / "mar_emoji" / CHECKPOINT_NAME)
    assert shipped.config == ema.config
    for (k, a), b in zip(shipped.state_dict().items(), ema.state_dict().values()):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3, msg=k)  # the EMA weights, not the raw ones


def test_zoo_emoji_mar_runs_ar_and_cspd_and_decodes_with_the_vq(emoji_root, monkeypatch):
    monkeypatch.setattr(zoo, "ASSETS", emoji_root[1])
    assert zoo.installed("emoji-mar")
    pipe = sv.load("emoji-mar")
    assert pipe.name == "emoji-mar" and pipe.class_names == ["a", "b", "c"] and isinstance(pipe.vae, SphereLatentDecoder)
    assert pipe.target.config.decoder_depth == 2 and pipe.draft.config.decoder_depth == 1
    out = pipe(classes=[0, 2], seed=0, num_iter=3)
    assert out.stats.target_forwards == 3 and out.latents.shape == (2, 16, 4) and out.images[0].size == (16, 16)
    # the VQ decodes the normalised latents: a token and twice it give the same image
    torch.testing.assert_close(pipe.vae.decode(out.latents.transpose(1, 2).reshape(2, 4, 4, 4)),
                               pipe.vae.decode(2 * out.latents.transpose(1, 2).reshape(2, 4, 4, 4)))
    c = pipe(classes=[1], method=CSpD(gamma=2, prefill=0.0, ratio="trajectory"), seed=0, num_iter=4)
    # step 0 is the target's (the authors' code verifies after draft steps s != 0), then steps 1-2 and 3
    assert c.stats.target_forwards == 3 and len(pipe.images_of(c)) == 1


def test_cli_num_iter(emoji_root, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(zoo, "ASSETS", emoji_root[1])
    assert cli(["generate", "--model", "emoji-mar", "--num-iter", "5", "--class", "1", "--num", "1",
                "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "stats.json").read_text())["target_forwards"] == 5
    capsys.readouterr()
    for argv in (["--model", "emoji-mar", "--num-iter", "0"], ["--model", "random-tiny", "--num-iter", "4"]):
        assert cli(["generate", *argv, "--class", "0", "--num", "1", "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip()
        assert "--num-iter" in err and "\n" not in err, err


@pytest.mark.skipif(not zoo.installed("emoji-mar"), reason="the emoji MAR pair is not in the bundle")
def test_shipped_emoji_mar_pair_loads_and_samples():
    pipe = sv.load("emoji-mar")
    assert pipe.target.seq_len == 256 and pipe.target.token_embed_dim == 8 and pipe.num_classes == 11
    out = pipe(classes=[3], method=CSpD(gamma=4), seed=0, num_iter=8)
    assert torch.isfinite(out.latents).all() and out.images[0].size == (64, 64)


def test_bench_runs_mar_and_keys_num_iter(emoji_root, monkeypatch, tmp_path):
    from specvis.bench.quality import can_decode
    from specvis.bench.runner import Bench, run_bench
    from specvis.job import Job

    monkeypatch.setattr(zoo, "ASSETS", emoji_root[1])
    pipe = sv.load("emoji-mar")
    pipe.num_iter = 4
    assert can_decode(pipe)  # the quality proxy decodes MAR's tokens through its VAE
    path = tmp_path / "b.json"
    rep = run_bench(pipe, Job(num=2, batch_size=2, out=path), Bench(specs=("ar", "cspd:gamma=2:prefill=0")),
                    progress=False)
    assert rep["num_iter"] == 4 and [r["target_forwards"] for r in rep["runs"]] == [4, 3]
    pipe.num_iter = 5  # another sampler length is another run, not a resumed one
    again = run_bench(pipe, Job(num=2, batch_size=2, out=path), Bench(specs=("ar",)), progress=False)
    assert again["runs"][0]["target_forwards"] == 5
