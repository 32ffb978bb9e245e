"""specvis.models.hf_vq against transformers' own VQ decoding, on the tiny checkpoints of tests/hf_tiny.py
(single-file and sharded safetensors); plus the sanity of those checkpoints themselves (offline
AutoProcessor, reference generation, reference logits) that decoder-import parity tests rely on."""

from __future__ import annotations

import builtins
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specvis.models.hf_vq import HFVQDecoder, load_hf_vq, read_vq_state_dict  # noqa: E402

import hf_tiny  # noqa: E402  (tests/ is on sys.path, see conftest.py)

FAMILIES = ("janus", "emu3")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(family, sharded) -> checkpoint directory; the sharded one has the same weights (same seed)."""
    root = tmp_path_factory.mktemp("hf_tiny")
    make = {"janus": hf_tiny.make_janus, "emu3": hf_tiny.make_emu3}
    return {(fam, shards): make[fam](root / f"{fam}{'-sharded' if shards else ''}", seed=0, shards=shards)
            for fam in FAMILIES for shards in (False, True)}


def _codes(n_rows: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, hf_tiny.CODEBOOK, (n_rows, n), generator=torch.Generator().manual_seed(seed))


def _reference_images(path, codes: torch.Tensor) -> torch.Tensor:
    """transformers' own decode of the full model loaded with from_pretrained, as (B, 3, H, W) in [-1, 1]."""
    info = hf_tiny.read_fixture(path)
    model = hf_tiny.load_hf_model(path)
    with torch.no_grad():
        if info["family"] == "janus":
            images = model.decode_image_tokens(codes).permute(0, 3, 1, 2)  # (B, H, W, 3) -> (B, 3, H, W)
        else:
            h, w = info["height"], info["width"]
            stream = hf_tiny.image_stream_ids(path, codes)
            tail = torch.tensor([info["token_ids"][k] for k in ("eof", "eoi", "eos")]).expand(codes.shape[0], 3)
            images = model.decode_image_tokens(image_tokens=torch.cat([stream, tail], 1), height=h, width=w)
    return images.clamp(-1, 1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shards", [False, True])
def test_decode_matches_transformers(ckpt, family, shards):
    path = ckpt[family, shards]
    info = hf_tiny.read_fixture(path)
    h, w = info["height"], info["width"]
    vq = load_hf_vq(path)
    assert isinstance(vq, HFVQDecoder) and vq.family == family and vq.codebook_size == hf_tiny.CODEBOOK
    codes = _codes(3, h * w)
    ours = vq.decode(codes, h, w)
    ref = _reference_images(path, codes)
    f = vq.downsample
    assert ours.shape == ref.shape == (3, 3, h * f, w * f)
    assert ours.dtype == torch.float32 and ours.min() >= -1 and ours.max() <= 1
    assert float(ours.std()) > 1e-3  # not a constant image: the comparison means something
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_sharded_checkpoint_layout_and_same_weights(ckpt):
    for family in FAMILIES:
        single, sharded = ckpt[family, False], ckpt[family, True]
        assert (single / "model.safetensors").is_file() and not (single / "model.safetensors.index.json").exists()
        index = json.loads((sharded / "model.safetensors.index.json").read_text())
        files = set(index["weight_map"].values())
        assert len(files) > 1 and all((sharded / f).is_file() for f in files)
        a, b = read_vq_state_dict(single), read_vq_state_dict(sharded)
        assert a.keys() == b.keys() and a
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", FAMILIES)
def test_codebook_is_what_decoding_looks_up(ckpt, family):
    path = ckpt[family, False]
    vq = load_hf_vq(path)
    cb = vq.codebook
    weight = read_vq_state_dict(path)["quantize.embedding.weight"]
    assert cb.shape == weight.shape == (hf_tiny.CODEBOOK, weight.shape[1])
    assert not cb.requires_grad
    if family == "janus":  # LlamaGen VQ-16: l2-normalised code vectors
        torch.testing.assert_close(cb.norm(dim=1), torch.ones(hf_tiny.CODEBOOK))
        torch.testing.assert_close(cb, weight / weight.norm(dim=1, keepdim=True))
    else:
        torch.testing.assert_close(cb, weight, atol=0, rtol=0)
    # decoding a code depends on it only through its codebook row: two codes with one row decode alike
    info = hf_tiny.read_fixture(path)
    h, w = info["height"], info["width"]
    codes = _codes(1, h * w, seed=3)
    codes2 = codes.clone()
    codes2[0, 0] = (int(codes[0, 0]) + 1) % hf_tiny.CODEBOOK
    with torch.no_grad():
        vq.vq.quantize.embedding.weight[int(codes2[0, 0])] = vq.vq.quantize.embedding.weight[int(codes[0, 0])]
    torch.testing.assert_close(vq.decode(codes, h, w), vq.decode(codes2, h, w), atol=0, rtol=0)


def test_default_grid_and_other_grids(ckpt):
    janus = load_hf_vq(ckpt["janus", False])
    assert janus.grid == hf_tiny.JANUS_GRID
    codes = _codes(2, 16)
    torch.testing.assert_close(janus.decode(codes), janus.decode(codes, 4, 4))
    assert janus.decode(_codes(2, 6), 2, 3).shape == (2, 3, 2 * janus.downsample, 3 * janus.downsample)
    emu3 = load_hf_vq(ckpt["emu3", False], grid=hf_tiny.EMU3_GRID)
    assert emu3.decode(_codes(1, 12)).shape == (1, 3, 3 * emu3.downsample, 4 * emu3.downsample)
    assert load_hf_vq(ckpt["emu3", False]).decode(_codes(1, 9)).shape[-2:] == (3 * emu3.downsample,) * 2


def test_decode_rejects_bad_codes(ckpt):
    vq = load_hf_vq(ckpt["janus", False])
    with pytest.raises(ValueError, match="lie in"):
        vq.decode(torch.full((1, 16), hf_tiny.CODEBOOK))
    with pytest.raises(ValueError, match="lie in"):
        vq.decode(torch.full((1, 16), -1))
    with pytest.raises(ValueError, match="does not match"):
        vq.decode(_codes(1, 16), 3, 4)
    with pytest.raises(ValueError, match="integer"):
        vq.decode(torch.zeros(1, 16))
    with pytest.raises(ValueError, match="not a square"):
        load_hf_vq(ckpt["emu3", False]).decode(_codes(1, 12))


def test_dtype_and_missing_files(ckpt, tmp_path):
    vq = load_hf_vq(ckpt["emu3", False], dtype=torch.float64)
    assert vq.codebook.dtype == torch.float64
    assert vq.decode(_codes(1, 12), 3, 4).dtype == torch.float64
    with pytest.raises(FileNotFoundError):
        load_hf_vq(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type"):
        load_hf_vq(tmp_path)


def test_missing_transformers_message(ckpt, monkeypatch):
    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(ImportError, match=r"pip install specvis\[hf\]"):
        load_hf_vq(ckpt["janus", False])


# --------------------------------------------------------------------------- the fixtures themselves


@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_is_an_offline_hf_repository(ckpt, family):
    path = ckpt[family, False]
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (path / name).is_file(), name
    proc = transformers.AutoProcessor.from_pretrained(path)  # a plain call: no network needed
    assert type(proc).__name__ == {"janus": "JanusProcessor", "emu3": "Emu3Processor"}[family]
    rows = hf_tiny.prompt_ids(path, ["a red cube", "sky"])
    ids, mask = rows["input_ids"], rows["attention_mask"]
    assert ids.shape == mask.shape and ids.shape[0] == 2
    assert mask[1, 0] == 0 and mask[0].all()  # left padded
    info = hf_tiny.read_fixture(path)
    tid = info["token_ids"]
    text = proc.tokenizer.decode(ids[0])
    if family == "janus":
        assert text == f"{hf_tiny.JANUS_TOKENS['bos']}<|User|>: a red cube\n\n<|Assistant|>:<begin_of_image>"
        unc = rows["uncond_input_ids"][0]
        assert unc[0] == tid["bos"] and unc[-1] == tid["boi"] and (unc[1:-1] == tid["pad"]).all()
    else:
        assert text == "<|extra_203|>a red cube<|image start|>3*4<|image token|>"
        assert proc.tokenizer.decode(rows["uncond_input_ids"][0]) == "<|extra_203|><|image start|>3*4<|image token|>"


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_generation_is_valid_and_follows_its_logits(ckpt, family):
    path = ckpt[family, False]
    info = hf_tiny.read_fixture(path)
    h, w = info["height"], info["width"]
    prompts = ["a red cube", "sky", "two birds"]
    scale = 3.0
    codes = hf_tiny.hf_greedy_image_tokens(path, prompts, scale)
    assert codes.shape == (3, h * w) and codes.dtype == torch.long
    assert codes.min() >= 0 and codes.max() < hf_tiny.CODEBOOK
    assert len({tuple(c) for c in codes.tolist()}) > 1  # prompts matter
    assert len(set(codes[0].tolist())) > 1  # not a constant image
    # teacher-forced reference logits reproduce every greedy choice, one prompt at a time (no padding)
    for b, prompt in enumerate(prompts):
        rows = hf_tiny.prompt_ids(path, [prompt])
        stream = hf_tiny.image_stream_ids(path, codes[b:b + 1])
        P = rows["input_ids"].shape[1]
        cond = hf_tiny.hf_logits(path, torch.cat([rows["input_ids"], stream], 1), image_start=P)
        unc = hf_tiny.hf_logits(path, torch.cat([rows["uncond_input_ids"], stream], 1),
                                image_start=rows["uncond_input_ids"].shape[1])
        Pu = rows["uncond_input_ids"].shape[1]
        if family == "janus":
            c, u = cond[0, P - 1:-1], unc[0, Pu - 1:-1]
            guided = u + scale * (c - u)
            torch.testing.assert_close(guided.argmax(-1), codes[b])
        else:
            c = torch.log_softmax(cond[0, P - 1:-1], -1)
            u = torch.log_softmax(unc[0, Pu - 1:-1], -1)
            guided = scale * (c - u) + u
            pos = [r * (w + 1) + j for r in range(h) for j in range(w)]
            visual = torch.tensor(info["visual_token_ids"])
            choice = guided[pos][:, visual].argmax(-1)  # constraint: only visual tokens at image slots
            torch.testing.assert_close(choice, codes[b])


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_generation_batching(ckpt, family):
    """Batch size does not change greedy codes for equal-length prompts (no padding)."""
    path = ckpt[family, False]
    prompts = ["abc", "xyz", "cat"]
    together = hf_tiny.hf_greedy_image_tokens(path, prompts, 2.5)
    alone = hf_tiny.hf_greedy_image_tokens(path, prompts, 2.5, batch_size=1)
    torch.testing.assert_close(together, alone)


def test_emu3_forced_tokens():
    info = {"height": 3, "width": 4, "visual_token_ids": list(range(100, 132)),
            "token_ids": {"eol": 1, "eof": 2, "eoi": 3, "eos": 4, "pad": 5}}
    forced = [hf_tiny.emu3_allowed_tokens(info, k) for k in range(1, 20)]
    single = [a[0] if len(a) == 1 else "v" for a in forced]
    assert single == ["v"] * 4 + [1] + ["v"] * 4 + [1] + ["v"] * 4 + [1] + [2, 3, 4] + [5]
