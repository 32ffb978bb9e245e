"""What a user does with a text-to-image checkpoint directory (Janus-Pro, Emu3 in the transformers
layout), from the command line and from Python, on the tiny random checkpoints of tests/hf_tiny.py:
generate with every kind of method (ar, sjd, speculative with a second checkpoint as draft, LANTERN and
GSD acceptance), bench with prompts, one-line errors (exit 2) for what a user gets wrong, Hub ids from
a fake huggingface_hub cache, and outputs that are never half-written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from hf_tiny import make_emu3, make_janus, prompt_ids, read_fixture  # noqa: E402
from specvis.cli import main  # noqa: E402
from specvis.families import emu3 as emu3_family  # noqa: E402

PROMPTS = ["a red apple", "a cat"]
OUTPUTS = ["000.png", "001.png", "grid.png", "heatmap.png", "stats.json"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")  # processor_config.json stays


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """janus/emu3 (seed 0), their drafts (seed 1), a sharded Janus, and emu3-native: the Emu3 checkpoint
    whose processor config sets ratio 4:3 and image_area 768 (= its 3x4 grid at 8 px a token)."""
    root = tmp_path_factory.mktemp("cli_families")
    d = {"janus": make_janus(root / "janus", seed=0), "janus-draft": make_janus(root / "janus-draft", seed=1),
         "emu3": make_emu3(root / "emu3", seed=0), "emu3-draft": make_emu3(root / "emu3-draft", seed=1),
         "janus-sharded": make_janus(root / "janus-sharded", seed=0, shards=True)}
    native = root / "emu3-native"
    shutil.copytree(d["emu3"], native)
    info = read_fixture(native)
    proc = json.loads((native / "processor_config.json").read_text())
    proc.update(ratio=info["ratio"], image_area=info["image_area"])
    (native / "processor_config.json").write_text(json.dumps(proc))
    d["emu3-native"] = native
    return d


def grid_args(d) -> list[str]:
    """--height/--width of the fixture's grid where the checkpoint's native grid is another one."""
    info = read_fixture(d)
    if sv.load(str(d)).grid == (info["height"], info["width"]):
        return []
    return ["--height", str(info["height"]), "--width", str(info["width"])]


def fails(capsys, args: list[str], needle: str) -> str:
    """``specvis ARGS`` exits 2 with one line on stderr containing ``needle``, no traceback."""
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("specvis: error: "), err
    assert needle in err, err
    return err


def no_temporaries(root: Path) -> None:
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------ native grid


def test_native_grid_is_the_processors_default_size(dirs):
    """Emu3: ratio and image_area from the processor config, through Emu3Processor.calculate_generate_size
    (factor 8); without them its class defaults 1:1 and 518400 give 90x90. Janus: num_image_tokens."""
    from transformers import Emu3Processor

    info = read_fixture(dirs["emu3"])
    assert sv.load(str(dirs["emu3-native"])).grid == (info["height"], info["width"]) == (3, 4)
    default = Emu3Processor.calculate_generate_size(None, Emu3Processor.ratio, Emu3Processor.image_area, 8)
    assert sv.load(str(dirs["emu3"])).grid == tuple(default) == (90, 90)
    assert sv.load(str(dirs["janus"])).grid == (4, 4)
    for ratio, area in (("16:9", 518400), ("3:7", 100000), ("1:2", 4096)):
        d = dirs["emu3-native"].parent / f"emu3-{ratio.replace(':', 'x')}"
        d.mkdir(exist_ok=True)
        (d / "processor_config.json").write_text(json.dumps({"ratio": ratio, "image_area": area}))
        assert emu3_family.native_grid(d) == tuple(Emu3Processor.calculate_generate_size(None, ratio, area, 8))


def test_native_grid_prompt_is_the_official_processors(dirs):
    """At the native grid, a text prompt is exactly what Emu3Processor(return_for_image_generation=True)
    builds with the same ratio and image_area (hf_tiny.prompt_ids), and the default negative prompt is
    the official one through it."""
    d = dirs["emu3-native"]
    pipe = sv.load(str(d))
    H, W = pipe.grid
    rows = prompt_ids(d, PROMPTS, negative_prompt=emu3_family.NEGATIVE)
    ours = pipe.family.encode(pipe.processor, PROMPTS, H, W)
    assert ours == [r[m.bool()].tolist() for r, m in zip(rows["input_ids"], rows["attention_mask"])]
    neg = pipe.family.negative(pipe.processor, len(PROMPTS), H, W)
    assert neg == [r[m.bool()].tolist() for r, m in zip(rows["uncond_input_ids"], rows["uncond_attention_mask"])]


# ------------------------------------------------------------------------------ generate


@pytest.mark.parametrize("name", ["janus", "emu3"])
def test_generate_sjd_writes_images_decoded_by_the_family_vq(dirs, tmp_path, name):
    d = dirs[name]
    out = tmp_path / "out"
    args = ["generate", "--model", str(d), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--method", "sjd",
            "--window", "4", "--out", str(out), *grid_args(d)]
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    stats = json.loads((out / "stats.json").read_text())
    info = read_fixture(d)
    assert stats["prompts"] == PROMPTS and stats["method"] == "sjd" and stats["config"]["window"] == 4
    assert (stats["height"], stats["width"]) == (info["height"], info["width"])
    assert stats["tokens"] == info["height"] * info["width"]
    assert np.asarray(stats["accept_map"]).shape == (2, info["height"], info["width"])
    # the same generation through the Python API: the PNGs are its images, decoded by the family's VQ
    from specvis.models.hf_vq import HFVQDecoder

    pipe = sv.load(str(d))
    gen = pipe(prompts=PROMPTS, method=sv.SJD(window=4), seed=0, height=info["height"], width=info["width"])
    assert isinstance(pipe.decoder, HFVQDecoder) and pipe.decoder.family == name
    pixels = pipe.decoder.decode(gen.tokens, info["height"], info["width"])
    f = pipe.decoder.downsample
    assert pixels.shape == (2, 3, info["height"] * f, info["width"] * f)
    for i, im in enumerate(gen.images):
        from PIL import Image

        saved = np.asarray(Image.open(out / f"{i:03d}.png").convert("RGB"))
        assert saved.shape == (info["height"] * f, info["width"] * f, 3)
        assert np.array_equal(saved, np.asarray(im.convert("RGB")))
    no_temporaries(tmp_path)


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("extra,method,rule", [
    (["--method", "ar"], "ar", "none"),
    # the default rule under keyed noise, the default noise
    (["--method", "speculative", "--gamma", "2", "--draft", "DRAFT"], "speculative", "coupled"),
    (["--method", "speculative", "--draft", "DRAFT", "--accept", "lantern"], "speculative", "lantern"),
    (["--method", "sjd", "--window", "4", "--accept", "lantern", "--lantern-k", "4"], "sjd", "lantern"),
    (["--method", "sjd", "--window", "4", "--accept", "gsd"], "sjd", "gsd"),
])
def test_generate_methods_and_rules(dirs, tmp_path, name, extra, method, rule):
    d = dirs[name]
    extra = [str(dirs[f"{name}-draft"]) if a == "DRAFT" else a for a in extra]
    args = ["generate", "--model", str(d), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--out", str(tmp_path),
            *grid_args(d), *extra]
    assert main(args) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["method"] == method and stats["acceptance"] == rule and stats["prompts"] == PROMPTS
    assert sorted(p.name for p in tmp_path.iterdir()) == OUTPUTS
    if method == "speculative":
        assert stats["draft"] == dirs[f"{name}-draft"].name and stats["draft_forwards"] > 0
    if method == "ar":
        assert stats["step_compression"] <= 1.0


def test_lantern_on_emu3_gives_row_ends_their_own_neighbourhood(dirs):
    """LANTERN binds to the VQ codebook; Emu3's forced row-end id (the law's last entry) is its own only
    neighbour and in no code's neighbourhood."""
    from specvis.generate import bind_rule

    pipe = sv.load(str(dirs["emu3-native"]))
    V = pipe.target.layout.vocab_size
    codebook = pipe.codebook
    assert codebook.shape[0] == V and torch.equal(codebook, pipe.decoder.vq.quantize.embedding.weight.detach())
    bound = bind_rule(sv.Lantern(k=4), codebook, pipe.target)
    assert bound.table.shape == (V + 1, 4)
    assert (bound.table[V] == V).all() and not (bound.table[:V] == V).any()


# ------------------------------------------------------------------------------ bench


@pytest.mark.parametrize("name", ["janus", "emu3"])
def test_bench_with_prompts_file(dirs, tmp_path, capsys, name):
    d = dirs[name]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red apple\n\na cat\nsunset\n")
    js, md = tmp_path / "r" / "bench.json", tmp_path / "r" / "bench.md"
    args = ["bench", "--model", str(d), "--prompts", str(prompts), "--methods", "ar,sjd:window=4,speculative:gamma=2",
            "--num", "4", "--batch-size", "2", "--json", str(js), "--md", str(md), "--draft", str(dirs[f"{name}-draft"]),
            *grid_args(d)]
    assert main(args) == 0
    report = json.loads(js.read_text())
    info = read_fixture(d)
    assert report["prompts"] == ["a red apple", "a cat", "sunset"]
    assert (report["height"], report["width"]) == (info["height"], info["width"])
    assert report["draft"] == dirs[f"{name}-draft"].name and report["model"] == d.name
    assert [r["method"] for r in report["runs"]] == ["ar", "sjd", "speculative"]
    assert report["runs"][0]["speedup"] == 1.0
    for run in report["runs"]:
        assert run["speedup"] > 0 and run["n_images"] == 4 and run["tokens"] == 4 * info["height"] * info["width"]
        assert set(run["accept_map_per_class"]) == {"0", "1", "2"}  # per prompt
    assert "| sjd |" in md.read_text() and "| speculative |" in md.read_text()
    no_temporaries(tmp_path)
    capsys.readouterr()
    # rerun on other prompts: nothing of the first report is reused
    prompts.write_text("one\ntwo\n")
    assert main(["bench", "--model", str(d), "--prompts", str(prompts), "--methods", "ar", "--num", "2",
                 "--json", str(js), *grid_args(d)]) == 0
    assert "starting afresh" in capsys.readouterr().err
    report = json.loads(js.read_text())
    assert report["prompts"] == ["one", "two"] and [r["method"] for r in report["runs"]] == ["ar"]


# ------------------------------------------------------------------------------ errors


@pytest.fixture(scope="module")
def broken(dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    (root / "empty").mkdir()
    (root / "gpt2").mkdir()
    (root / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    (root / "noweights").mkdir()
    for f in ("config.json", "generation_config.json"):
        shutil.copy(dirs["janus"] / f, root / "noweights" / f)
    shutil.copytree(dirs["janus-sharded"], root / "missing-shard")
    shard = sorted((root / "missing-shard").glob("model-*.safetensors"))[1]
    shard.unlink()
    return {"empty": root / "empty", "gpt2": root / "gpt2", "noweights": root / "noweights",
            "missing-shard": root / "missing-shard", "missing-shard-name": shard.name, "root": root}


def test_checkpoint_errors(dirs, broken, capsys, tmp_path):
    gen = ["generate", "--prompt", "a cat", "--out", str(tmp_path / "out")]
    fails(capsys, [*gen, "--model", str(broken["empty"])], "missing config.json")
    fails(capsys, [*gen, "--model", str(broken["gpt2"])], "model_type 'gpt2' is not supported")
    fails(capsys, [*gen, "--model", str(broken["noweights"])], "no weights (model.safetensors or")
    fails(capsys, [*gen, "--model", str(broken["missing-shard"])], broken["missing-shard-name"])
    fails(capsys, [*gen, "--model", str(dirs["janus"]), "--draft", str(dirs["emu3"]), "--method", "speculative"],
          "must be a checkpoint of the target's family")
    fails(capsys, [*gen, "--model", str(dirs["janus"]), "--draft", str(broken["empty"])], "missing config.json")
    assert not (tmp_path / "out").exists()


def test_usage_errors(dirs, capsys, tmp_path):
    out = tmp_path / "out"
    janus = ["generate", "--model", str(dirs["janus"]), "--out", str(out)]
    info = read_fixture(dirs["janus"])
    too_long = "a" * 300  # character-level tokenizer: > max_position_embeddings (256) tokens
    assert json.loads((dirs["janus"] / "config.json").read_text())["text_config"]["max_position_embeddings"] < 300
    fails(capsys, [*janus, "--prompt", too_long], "longer than model janus allows")
    fails(capsys, [*janus, "--prompt", "a cat", "--negative-prompt", too_long], "negative_prompts[0] is")
    fails(capsys, [*janus, "--class", "1"], "give --prompt, not --class")
    fails(capsys, [*janus], "give --prompt")
    fails(capsys, [*janus, "--prompt", "a", "--prompt", "b", "--prompt", "c", "--negative-prompt", "x",
                   "--negative-prompt", "y"], "--negative-prompt: give one, or one per --prompt (3), got 2")
    fails(capsys, [*janus, "--prompt", "a cat", "--method", "speculative"], "give --draft DIR")
    fails(capsys, [*janus, "--prompt", "a cat", "--height", "0"], "height must be an integer >= 1")
    fails(capsys, ["generate", "--model", str(dirs["emu3"]), "--prompt", "a cat", "--out", str(out)],
          "pass height= and width= (--height/--width)")
    fails(capsys, ["generate", "--model", str(dirs["janus"]), "--prompt", "a cat", "--out", str(dirs["janus"] / "config.json")],
          "not a directory")
    assert not out.exists()
    bench = ["bench", "--model", str(dirs["janus"]), "--num", "2", "--methods", "ar"]
    fails(capsys, [*bench, "--prompts", str(tmp_path / "missing.txt")], "no such file")
    (tmp_path / "empty.txt").write_text("\n \n")
    fails(capsys, [*bench, "--prompts", str(tmp_path / "empty.txt")], "no prompts")
    fails(capsys, bench, "text-to-image, give --prompts FILE")
    (tmp_path / "p.txt").write_text("a cat\n")
    fails(capsys, [*bench, "--prompts", str(tmp_path / "p.txt"), "--methods", "ar,speculative"], "give --draft DIR")
    assert info["height"] == 4


def test_prompt_to_class_model(capsys, tmp_path):
    model = "emoji" if sv.zoo.installed("emoji") else "random-tiny"
    fails(capsys, ["generate", "--model", model, "--prompt", "a cat", "--out", str(tmp_path / "o")],
          f"model {model} is class-conditional")
    fails(capsys, ["bench", "--model", "random-tiny", "--prompts", __file__, "--num", "1"], "--prompts does not apply")


# ------------------------------------------------------------------------------ Hub ids


@pytest.fixture
def hf_home(hf_home):
    """conftest's offline home; these CLI runs need huggingface_hub (test_hub's lookups do not)."""
    pytest.importorskip("huggingface_hub")
    return hf_home


def cache_repo(hf_home: Path, repo_id: str, source: Path, commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """``source``'s files laid out as huggingface_hub caches ``repo_id``: blobs/<sha256>, snapshots/<commit>/<file>
    -> relative symlink to the blob, refs/main."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in sorted(source.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_unknown_hub_id_offline(hf_home, capsys, tmp_path):
    err = fails(capsys, ["generate", "--model", "BAAI/Emu3-Gen", "--prompt", "a cat", "--out", str(tmp_path / "o")],
                "BAAI/Emu3-Gen: neither a local directory nor in the Hugging Face cache")
    assert str(hf_home / "hub") in err and "HF_HUB_OFFLINE" in err
    with pytest.raises(ValueError, match="neither a local directory nor in the Hugging Face cache"):
        sv.load("deepseek-ai/Janus-Pro-1B")


def test_cached_hub_id_loads(dirs, hf_home, capsys, tmp_path):
    cache_repo(hf_home, "deepseek-ai/Janus-Pro-1B", dirs["janus"])
    cache_repo(hf_home, "someone/Janus-Pro-tiny-draft", dirs["janus-draft"])
    pipe = sv.load("deepseek-ai/Janus-Pro-1B", draft="someone/Janus-Pro-tiny-draft")
    assert pipe.name == "deepseek-ai/Janus-Pro-1B" and pipe.extras["draft"] == "someone/Janus-Pro-tiny-draft"
    out = pipe(prompts=PROMPTS, method=sv.Speculative(gamma=2), seed=0)
    assert len(out.images) == 2 and out.images[0].size == (16, 16)
    ref = sv.load(str(dirs["janus"]), draft=str(dirs["janus-draft"]))(prompts=PROMPTS, method=sv.Speculative(gamma=2),
                                                                       seed=0, decode=False)
    assert torch.equal(out.tokens, ref.tokens)
    assert main(["generate", "--model", "deepseek-ai/Janus-Pro-1B", "--prompt", "a cat", "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["model"] == "deepseek-ai/Janus-Pro-1B"


# ------------------------------------------------------------------------------ Python API


@pytest.mark.parametrize("name", ["janus", "emu3-native"])
def test_python_pipeline(dirs, name):
    pipe = sv.load(str(dirs[name]))
    info = read_fixture(dirs[name])
    out = pipe(prompts=PROMPTS, decode=True)
    f = pipe.decoder.downsample
    assert len(out.images) == 2 and out.images[0].size == (info["width"] * f, info["height"] * f)
    assert out.tokens.shape == (2, info["height"] * info["width"])
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < info["codebook"]
    with pytest.raises(ValueError, match=r"give prompts=, not classes="):
        pipe(classes=[0, 1])
    with pytest.raises(ValueError, match=r"give prompts=, not classes="):
        pipe([0, 1])
    with pytest.raises(ValueError, match=r"negative_prompts: 1 given for 2 prompts"):
        pipe(prompts=PROMPTS, negative_prompts=["x"])


def without_processor(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*TOKENIZER_FILES))
    return dst


@pytest.mark.parametrize("name", ["janus", "emu3-native"])
def test_token_id_prompts_need_no_processor(dirs, tmp_path, name):
    """Token-id prompts run with decode=False on a copy of the checkpoint with no tokenizer or processor
    files, and give the tokens of the same prompts as text."""
    full = sv.load(str(dirs[name]))
    H, W = full.grid
    ids = full.family.encode(full.processor, full.with_positive_suffix(PROMPTS, True), H, W)
    kw = dict(method=sv.SJD(window=4), seed=3, decode=False)
    neg = {}
    if name.startswith("emu3"):  # its default negative prompt is text: give it as ids too
        neg = {"negative_prompts": full.family.negative(full.processor, len(PROMPTS), H, W)}
    ref = full(prompts=PROMPTS, **kw)
    bare = sv.load(str(without_processor(dirs[name], tmp_path / name)))
    got = bare(prompts=ids, **neg, **kw)
    assert bare._processor is None and bare.vq is None
    assert torch.equal(got.tokens, ref.tokens)
    if name.startswith("emu3"):
        with pytest.raises(ValueError, match="cannot load the checkpoint's AutoProcessor"):
            bare(prompts=ids, **kw)  # the default negative prompt needs the tokenizer: one-line error
    with pytest.raises(ValueError, match=r"token ids must be in 0\.\."):
        bare(prompts=[[10 ** 6]], **kw)


def test_default_negative_prompts(dirs):
    """cfg_scale != 1 and negative_prompts=None: Janus uses its pad prompt (the prompt with every token but
    BOS and begin-of-image replaced by pad), Emu3 the official negative prompt through its template; both
    as transformers' reference rows (hf_tiny.prompt_ids) build them."""
    sampling = sv.Sampling(cfg_scale=4.0)
    for name in ("janus", "emu3-native"):
        d = dirs[name]
        pipe = sv.load(str(d))
        rows = prompt_ids(d, PROMPTS, negative_prompt=emu3_family.NEGATIVE)
        uncond = [r[m.bool()].tolist() for r, m in zip(rows["uncond_input_ids"], rows["uncond_attention_mask"])]
        kw = dict(method=sv.AR(), sampling=sampling, seed=1, decode=False)
        default = pipe(prompts=PROMPTS, **kw).tokens
        assert torch.equal(default, pipe(prompts=PROMPTS, negative_prompts=uncond, **kw).tokens)
        other = pipe(prompts=PROMPTS, negative_prompts=["something else"] * 2, **kw).tokens
        assert not torch.equal(default, other)  # the negative prompt matters at this scale
        if name.startswith("emu3"):  # the same as the official negative prompt given as text
            assert torch.equal(default, pipe(prompts=PROMPTS, negative_prompts=[emu3_family.NEGATIVE] * 2, **kw).tokens)


def test_emu3_positive_suffix_by_default_and_off(dirs, tmp_path):
    """Emu3's official scripts send prompt + " masterpiece, film grained, best quality." and the negative
    prompt without it: the default conditional rows are Emu3Processor's rows of the suffixed text
    (hf_tiny.prompt_ids), the unconditional rows the plain negative prompt's; positive_suffix=False
    (Python) and --no-positive-suffix (CLI) send the text as given; token-id prompts never change;
    Janus has no suffix. Catches the suffix missing, misspelt, added to the negative prompt or kept
    when turned off."""
    d = dirs["emu3-native"]
    pipe = sv.load(str(d))
    assert emu3_family.POSITIVE_SUFFIX == " masterpiece, film grained, best quality."
    rows = lambda texts: [r[m.bool()].tolist() for r, m in zip(texts["input_ids"], texts["attention_mask"])]  # noqa: E731
    cfg = sv.Sampling(cfg_scale=3.0)
    on = pipe.conditions(PROMPTS, None, cfg, None, None)
    off = pipe.conditions(PROMPTS, None, cfg, None, None, positive_suffix=False)
    official = prompt_ids(d, [p + emu3_family.POSITIVE_SUFFIX for p in PROMPTS], negative_prompt=emu3_family.NEGATIVE)
    as_given = prompt_ids(d, PROMPTS, negative_prompt=emu3_family.NEGATIVE)
    listed = lambda p: [p.ids[r, : int(p.lengths[r])].tolist() for r in range(len(p))]  # noqa: E731
    assert listed(on.cond) == rows(official) and listed(off.cond) == rows(as_given)
    neg = [r[m.bool()].tolist() for r, m in zip(official["uncond_input_ids"], official["uncond_attention_mask"])]
    assert listed(on.uncond) == listed(off.uncond) == neg
    ids = rows(as_given)
    assert listed(pipe.conditions(ids, None, cfg, None, None).cond) == ids
    greedy = dict(method=sv.AR(), sampling=sv.Sampling(temperature=0.0, cfg_scale=3.0), decode=False)
    plain = pipe(prompts=PROMPTS, positive_suffix=False, **greedy).tokens
    assert torch.equal(plain, pipe(prompts=ids, **greedy).tokens)
    suffixed = pipe(prompts=PROMPTS, **greedy).tokens
    assert torch.equal(suffixed, pipe(prompts=rows(official), **greedy).tokens) and not torch.equal(suffixed, plain)
    with pytest.raises(ValueError, match="positive_suffix must be True or False"):
        pipe(prompts=PROMPTS, positive_suffix="no", **greedy)
    janus = sv.load(str(dirs["janus"]))
    assert janus.with_positive_suffix(PROMPTS, True) == PROMPTS
    # the CLI flag: stats.json says which suffix was sent, and the PNGs are the plain prompts' images
    for flag, suffix in (([], emu3_family.POSITIVE_SUFFIX), (["--no-positive-suffix"], "")):
        out = tmp_path / f"out{len(flag)}"
        assert main(["generate", "--model", str(d), "--method", "ar", "--temperature", "0", "--cfg-scale", "3",
                     "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--out", str(out), *flag]) == 0
        assert json.loads((out / "stats.json").read_text())["positive_suffix"] == suffix
    images = pipe(prompts=PROMPTS, positive_suffix=False, **{**greedy, "decode": True}).images
    from PIL import Image

    for i, im in enumerate(images):
        assert np.array_equal(np.asarray(Image.open(tmp_path / "out1" / f"{i:03d}.png").convert("RGB")),
                              np.asarray(im.convert("RGB")))


# ------------------------------------------------------------------------------ atomic outputs


def test_failed_write_leaves_nothing_half_written(dirs, tmp_path, capsys, monkeypatch):
    """A PNG write that dies half-way (disk full) exits 2 with one line; the file it was writing is not
    there under its name, no temporary is left, and files written before it are whole."""
    from PIL import Image

    real_save = Image.Image.save
    calls = []

    def flaky_save(self, fp, *args, **kwargs):
        calls.append(fp)
        if len(calls) == 2:
            with open(fp, "wb") as f:
                f.write(b"\x89PNG half")
            raise OSError(28, "No space left on device")
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", flaky_save)
    out = tmp_path / "out"
    fails(capsys, ["generate", "--model", str(dirs["janus"]), "--prompt", "a", "--prompt", "b", "--out", str(out)],
          "No space left on device")
    assert sorted(p.name for p in out.iterdir()) == ["000.png"]
    monkeypatch.setattr(Image.Image, "save", real_save)
    Image.open(out / "000.png").load()
    no_temporaries(tmp_path)
