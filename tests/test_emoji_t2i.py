"""The shipped text-to-image emoji bundle (``sv.load("emoji-t2i")``): its checkpoints are real Janus-Pro
checkpoints (transformers' own class loads them and generates specvis's greedy tokens), its VQ decoder
renders, every method runs on it, and prompts map to the classes the quality proxy scores."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from specvis.zoo import ASSETS, installed  # noqa: E402

pytestmark = pytest.mark.skipif(not installed("emoji-t2i"), reason="emoji-t2i bundle not installed")
PROMPTS = ["red apple", "smiling face with sunglasses"]
ROOT = ASSETS / "emoji_t2i"


@pytest.fixture(scope="module")
def pipe():
    return sv.load("emoji-t2i")


def test_bundle_parts_and_prompt_classes(pipe) -> None:
    assert pipe.name == "emoji-t2i" and pipe.draft is not None
    assert pipe.default_sampling.cfg_scale == 3.0  # from generation_config.json, as transformers reads it
    assert pipe.grid == (16, 16)
    assert pipe.prompt_class("red apple") == 0  # U+1F34E: sky_weather_plants_food
    assert pipe.prompt_class("smiling face with sunglasses") == 6  # U+1F60E: smileys
    assert pipe.prompt_class("not an emoji name") == -1


@pytest.mark.parametrize("part", ["target", "draft"])
def test_transformers_generate_equals_specvis_ar(pipe, part) -> None:
    """Proof of format: JanusForConditionalGeneration loads the shipped directory and its greedy CFG
    image generation gives the tokens of specvis's greedy AR for the same prompts (batch of two
    prompts of different lengths, left-padded by the processor)."""
    from transformers import AutoProcessor, JanusForConditionalGeneration

    directory = str(ROOT / part)
    hf = JanusForConditionalGeneration.from_pretrained(directory, dtype=torch.float32, local_files_only=True).eval()
    enc = AutoProcessor.from_pretrained(directory, local_files_only=True)(
        text=PROMPTS, generation_mode="image", padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                             generation_mode="image", do_sample=False, guidance_scale=3.0)
    ours = sv.load(directory)(prompts=PROMPTS, method=sv.AR(), sampling=sv.Sampling(temperature=0.0, cfg_scale=3.0),
                              decode=False).tokens
    assert ours.shape == (2, 256) and len(set(ours.flatten().tolist())) > 1  # not one repeated code
    assert torch.equal(ours.cpu(), theirs.long().cpu())


def test_vq_decoder_renders(pipe) -> None:
    """transformers' JanusVQVAE inside the checkpoint decodes as the emoji VQ it was exported from."""
    from specvis.models.vq import VQModel

    codes = torch.randint(0, 1024, (2, 256), generator=torch.Generator().manual_seed(0))
    ours = VQModel.from_pretrained(ASSETS / "emoji" / "vq").decode(codes, (16, 16))
    theirs = pipe.decoder.decode(codes, 16, 16)
    assert theirs.shape == (2, 3, 64, 64) and torch.allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize("spec", ["speculative:gamma=4", "sjd:window=16", "eagle:total_tokens=12", "adt:total_tokens=12",
                                  "static-tree:tree=chain", "speculative:gamma=4:accept=lantern:k=50:delta=0.3",
                                  "sjd:window=8:accept=gsd:group=4"])
def test_every_method_runs_and_lossless_ones_keep_greedy(pipe, spec) -> None:
    """Each method family on the bundle (draft model, Jacobi, trees with the shipped EAGLE head,
    relaxed rules): images come out; a lossless method at temperature 0 gives AR's greedy tokens."""
    from specvis.registry import build_method, parse_method_spec

    if spec.split(":")[0] in ("eagle", "adt", "static-tree") and pipe.drafter is None:
        pytest.skip("no EAGLE head shipped")
    method = build_method(*parse_method_spec(spec))
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0)
    out = pipe(prompts=PROMPTS[:1], method=method, sampling=greedy, seed=0)
    assert np.asarray(out.images[0]).shape == (64, 64, 3)
    if "accept=" not in spec:
        ar = pipe(prompts=PROMPTS[:1], method=sv.AR(), sampling=greedy, seed=0, decode=False).tokens
        assert torch.equal(out.tokens, ar)
