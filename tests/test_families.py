"""Real checkpoint directories (Janus-Pro, Emu3) imported into specvis's decoder, against transformers
on tiny random checkpoints in the official Hugging Face layout (tests/hf_tiny.py): the same logits for
the same inputs, and greedy AR with CFG gives the image tokens transformers' own ``generate`` gives."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from hf_tiny import hf_greedy_image_tokens, hf_logits, image_stream_ids, make_emu3, make_janus, prompt_ids, read_fixture  # noqa: E402
from specvis.families import load_decoder  # noqa: E402
from specvis.models.base import Prompts  # noqa: E402

PROMPTS = ["a red apple", "a cat on a mat", "sunset", "two blue birds in a tree"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {"janus": make_janus(root / "janus", seed=0), "emu3": make_emu3(root / "emu3", seed=0),
            "janus-sharded": make_janus(root / "janus-sharded", seed=0, shards=True),
            "emu3-sharded": make_emu3(root / "emu3-sharded", seed=0, shards=True)}


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def grid_of(d) -> tuple[int, int]:
    info = read_fixture(d)
    return info["height"], info["width"]


@pytest.mark.parametrize("name", ["janus", "emu3", "janus-sharded", "emu3-sharded"])
def test_logits_equal_transformers(dirs, name: str) -> None:
    """Prompts of different lengths then an image stream (Emu3: row ends included): our teacher-forced
    and cached logits over the image vocabulary equal transformers' (fp32, max abs diff <= 1e-4).
    Catches a wrong key mapping, q/k rows not re-interleaved for RoPE, a RoPE theta or norm eps not
    read from the config, head rows that are not the visual tokens in code order."""
    d = dirs[name]
    H, W = grid_of(d)
    model = load_decoder(d, H, W)
    rows = prompt_ids(d, PROMPTS[:3])
    ids, mask = rows["input_ids"], rows["attention_mask"]
    B, P = ids.shape
    codes = torch.randint(0, model.layout.vocab_size, (B, H * W), generator=torch.Generator().manual_seed(0))
    stream_hf = image_stream_ids(d, codes)
    forced = model.layout.forced()
    stream = forced.expand(B, -1).clone()
    stream[:, model.layout.image_index()] = codes
    full = torch.cat([ids, stream_hf], 1)
    ref = hf_logits(d, full, image_start=P, attention_mask=torch.cat([mask, torch.ones_like(stream_hf)], 1))
    ref = ref[:, P - 1: P - 1 + stream.shape[1]]  # predicting stream tokens 0 .. S-1
    if read_fixture(d)["family"] == "emu3":
        ref = ref[..., torch.tensor(read_fixture(d)["visual_token_ids"])]
    prompts = Prompts.of(unpadded(ids, mask))
    ours = model.logits(prompts, stream[:, :-1])
    assert (ours - ref).abs().max() < 1e-4
    model.setup_cache(B, 2)
    first, _ = model.prefill(prompts)
    rest, _ = model.forward_tokens(stream[:, :-1], torch.arange(stream.shape[1] - 1)[None].expand(B, -1))
    assert (torch.cat([first[:, None], rest], 1) - ref).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_ar_with_cfg_equals_transformers_generate(dirs, name: str, batch: int) -> None:
    """sv.load(dir) and text prompts through the family's official template: greedy AR with CFG
    (Janus: the pad-prompt unconditional row; Emu3: a negative prompt, row ends forced) gives the codes
    of transformers' generate, batch 1 and 4."""
    d = dirs[name]
    H, W = grid_of(d)
    pipe = sv.load(str(d))
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0)
    neg = {"negative_prompts": [""] * len(PROMPTS)} if name == "emu3" else {}
    ours = torch.cat([pipe(prompts=PROMPTS[i:i + batch], method=sv.AR(), sampling=greedy, decode=False,
                           height=H, width=W, **({k: v[i:i + batch] for k, v in neg.items()})).tokens
                      for i in range(0, len(PROMPTS), batch)])
    suffix = pipe.with_positive_suffix([""], True)[0]  # Emu3's official scripts append it; Janus has none
    ref = hf_greedy_image_tokens(d, [p + suffix for p in PROMPTS], 3.0, batch_size=batch, negative_prompt="")
    assert torch.equal(ours, ref)
    for method in (sv.SJD(window=4, init="vertical-sample"), sv.Jacobi(window=4)):  # exact methods, same tokens
        out = pipe(prompts=PROMPTS, method=method, sampling=greedy, decode=False, height=H, width=W,
                   **({"negative_prompts": [""] * len(PROMPTS)} if name == "emu3" else {}))
        assert torch.equal(out.tokens, ref)


def test_families_are_declared(dirs, tmp_path) -> None:
    """Each family is one ``Family`` instance that declares what it provides (conditioning, tokens,
    prompt processor, positive suffix, official sampling); the pipeline holds the family and the model
    knows nothing of it. Catches Janus ignoring generation_config.json's guidance_scale, Lumina-mGPT
    given Anole's sampling, and a family attached to the model after construction."""
    import json
    import shutil

    from specvis.families import FAMILIES, chameleon, detect, emu3, janus, llamagen_t2i, mar
    from specvis.families.base import Family

    assert [f.name for f in FAMILIES] == ["janus", "emu3", "chameleon", "llamagen-t2i", "mar"]
    assert all(isinstance(f, Family) for f in FAMILIES)
    assert [(f.conditioning, f.tokens) for f in FAMILIES] == [
        ("text", "discrete"), ("text", "discrete"), ("text", "discrete"), ("caption", "discrete"), ("class", "continuous")]
    assert (janus.FAMILY.prompt_processor, chameleon.FAMILY.prompt_processor) == ("AutoProcessor", "AutoTokenizer")
    assert (emu3.FAMILY.positive_suffix, janus.FAMILY.positive_suffix) == (emu3.POSITIVE_SUFFIX, "")
    assert detect(dirs["janus"])[0] is janus.FAMILY and detect(dirs["emu3"])[0] is emu3.FAMILY

    gen = json.loads((dirs["janus"] / "generation_config.json").read_text())
    for scale, want in ((7.25, 7.25), (None, janus.DEFAULT_SAMPLING["cfg_scale"])):
        d = tmp_path / f"janus-{scale}"
        d.mkdir()
        shutil.copy(dirs["janus"] / "config.json", d / "config.json")
        (d / "generation_config.json").write_text(json.dumps({**{k: v for k, v in gen.items() if k != "guidance_scale"},
                                                              **({"guidance_scale": scale} if scale else {})}))
        assert janus.FAMILY.sampling(d, None) == {**janus.DEFAULT_SAMPLING, "cfg_scale": want}
    assert chameleon.FAMILY.sampling(tmp_path, {"z_loss_weight": 1e-5}) == chameleon.LUMINA_SAMPLING
    assert chameleon.FAMILY.sampling(tmp_path, {"model_type": "chameleon"}) == chameleon.DEFAULT_SAMPLING
    assert llamagen_t2i.FAMILY.sampling(tmp_path, None) == llamagen_t2i.DEFAULT_SAMPLING
    assert not mar.FAMILY.matches({"model_type": "mar"}) and not janus.FAMILY.matches_dir(dirs["janus"])

    pipe = sv.load(str(dirs["janus"]))
    assert pipe.family is janus.FAMILY and (pipe.conditioning, pipe.tokens, pipe.kv_cache) == ("text", "discrete", True)
    assert pipe.default_sampling.cfg_scale == gen["guidance_scale"] and pipe.num_iter is None
    assert "family" not in vars(pipe.target)
    for name in ("janus", "emu3"):  # the declared native grid is the grid a pipeline loads at
        family, config = detect(dirs[name])
        assert sv.load(str(dirs[name])).grid == family.native_grid(dirs[name], config)


def test_rotate_half_rotary_is_the_interleaved_one_on_reordered_dims() -> None:
    """``apply_rope_half`` on a head in the Hugging Face row order (pairs (i, i + d/2)) gives, bit for
    bit, what ``apply_rope`` gives on the same head with its dims re-paired as (2i, 2i + 1), and a
    real rotation (not the identity). Catches: the rotate-half pairing offset wrong (pairs of
    adjacent dims), the output left in a third order (q.k would still match, the cache would not
    equal the interleaved layout's)."""
    from specvis.models.decoder import apply_rope, apply_rope_half, rope_1d

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 16, generator=g)
    rope = rope_1d(torch.arange(5)[None].expand(2, -1) * 7, 16, 100.0)
    interleaved = x.unflatten(-1, (2, 8)).transpose(-1, -2).flatten(-2)  # dims 0, 8, 1, 9, ...
    assert torch.equal(apply_rope_half(x, rope), apply_rope(interleaved, rope))
    assert not torch.allclose(apply_rope_half(x, rope), interleaved, atol=1e-3)
