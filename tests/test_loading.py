"""Loading at the cost of the weights (``specvis.models.loading``): every loader equals the old
whole-dict one (tests/reference_loading.py), builds no initialised weights, puts every tensor in
the requested dtype and device, streams a sharded checkpoint one shard at a time, checks the keys
before reading data, and picks the default dtype by the stated rule."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

import reference_loading as ref  # noqa: E402
import specvis as sv  # noqa: E402
from hf_tiny import make_emu3, make_janus  # noqa: E402
from specvis import cpu_features  # noqa: E402
from specvis.families import load_decoder  # noqa: E402
from specvis.models import loading  # noqa: E402
from specvis.models.base import Captions, Prompts  # noqa: E402
from test_chameleon import make_chameleon  # noqa: E402

HF = ("janus", "emu3", "anole", "lumina")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loading")
    out = {"janus": make_janus(root / "janus", shards=True), "emu3": make_emu3(root / "emu3")}
    out["anole"] = make_chameleon(root / "anole", lumina=False)[0]
    out["lumina"] = make_chameleon(root / "lumina", lumina=True, swin=True)[0]
    return out


def assert_same_tensors(new: torch.nn.Module, old: torch.nn.Module) -> None:
    """Same parameters and buffers (persistent or not), bit for bit, same dtypes."""
    a = dict(new.named_parameters()) | dict(new.named_buffers())
    b = dict(old.named_parameters()) | dict(old.named_buffers())
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("name", HF)
def test_hf_families_equal_the_old_loader(dirs, name):
    """Logits of the streamed model equal the old whole-dict loader's (fp32) on a prompt and 7 image
    tokens. Catches: a q/k row interleave or a v slice misplaced in the fused wqkv, lm_head rows not
    the image codes, a q/k-norm reshape lost."""
    new = load_decoder(dirs[name], dtype="fp32")
    old = ref.hf_decoder(dirs[name])
    assert_same_tensors(new, old)
    g = torch.Generator().manual_seed(0)
    prompts = Prompts.of([[1, 5, 9, 12, 3], [2, 7, 4]])
    tokens = torch.randint(new.layout.vocab_size, (2, 7), generator=g)
    with torch.no_grad():
        diff = (new.logits(prompts, tokens) - old.logits(prompts, tokens)).abs().max()
    assert float(diff) <= 1e-6


def test_file_formats_equal_the_old_loaders(tmp_path):
    """LlamaGen t2i / c2i (.pt), its VQ (.pt), MAR + KL-16 (.pth / .ckpt), Chameleon's VQGAN (.ckpt),
    the transformers VQ decoders and the embedded emoji bundles (safetensors, fp16) load to the same
    tensors as the old loaders, and the same logits / images. Catches: a key dropped or renamed
    wrongly (MAR's official names), an fp16 file not widened, the EAGLE q/k/v rows misplaced."""
    from test_chameleon_vq import tiny_model, write_release
    from test_llamagen_t2i import ffn_hidden, make_vq, official_state_dict, save_gpt
    from test_mar import tiny_mar, tiny_vae

    from specvis.models.chameleon_vq import ChameleonVQ, load_chameleon_vq, read_vqgan_state_dict
    from specvis.models.kl_vae import KLVAE
    from specvis.models.llamagen import LlamaGen, LlamaGenConfig, LlamaGenT2I
    from specvis.models.mar import MAR, load_mar_checkpoint
    from specvis.models.vq import VQModel

    sd = official_state_dict(0, dim=128, n_layer=2, n_head=2, hidden=ffn_hidden(128))
    save_gpt(tmp_path / "t2i_XL_stage1_256.pt", sd)
    new = LlamaGenT2I.from_checkpoint(tmp_path / "t2i_XL_stage1_256.pt")
    old = ref.same_class_loaded(new, ref.whole_state_dict(tmp_path / "t2i_XL_stage1_256.pt"),
                                lambda: LlamaGenT2I(new.config))
    assert_same_tensors(new, old)
    caps = Captions.of([torch.randn(5, new.config.caption_dim), torch.randn(3, new.config.caption_dim)])
    toks = torch.randint(new.layout.vocab_size, (2, 6))
    with torch.no_grad():
        assert float((new.forward_train(caps, toks)[0] - old.forward_train(caps, toks)[0]).abs().max()) <= 1e-6

    c2i = LlamaGen(LlamaGenConfig(dim=64, n_layer=2, n_head=4, vocab_size=32, num_classes=5, block_size=16,
                                  multiple_of=32, initializer_range=0.3))
    torch.save({"model": c2i.state_dict()}, tmp_path / "c2i.pt")
    new = LlamaGen.from_checkpoint(tmp_path / "c2i.pt", block_size=16, multiple_of=32)
    old = ref.same_class_loaded(new, ref.whole_state_dict(tmp_path / "c2i.pt"), lambda: LlamaGen(new.config))
    assert_same_tensors(new, old)
    labels, toks = torch.tensor([0, 3]), torch.randint(32, (2, 9))
    with torch.no_grad():
        assert float((new.logits(labels, toks) - old.logits(labels, toks)).abs().max()) <= 1e-6

    make_vq(tmp_path / "vq.pt")
    new = VQModel.from_checkpoint(tmp_path / "vq.pt")
    assert_same_tensors(new, ref.same_class_loaded(new, ref.whole_state_dict(tmp_path / "vq.pt", ("model",)),
                                                   lambda: VQModel(new.config)))

    mar = tiny_mar()
    mar.save_checkpoint(tmp_path / "checkpoint-last.pth")
    new = load_mar_checkpoint(tmp_path / "checkpoint-last.pth")
    old = ref.same_class_loaded(new, ref.whole_state_dict(tmp_path / "checkpoint-last.pth", ("model_ema",)),
                                lambda: MAR(new.config))
    assert_same_tensors(new, old)
    vae = tiny_vae()
    vae.save_checkpoint(tmp_path / "kl16.ckpt")
    new = KLVAE.from_checkpoint(tmp_path / "kl16.ckpt")
    assert_same_tensors(new, ref.same_class_loaded(new, ref.whole_state_dict(tmp_path / "kl16.ckpt", ("model",)),
                                                   lambda: KLVAE(new.config)))

    write_release(tmp_path / "tokenizer", tiny_model())
    new = load_chameleon_vq(tmp_path / "tokenizer")
    old_sd = read_vqgan_state_dict(tmp_path / "tokenizer" / "vqgan.ckpt")
    assert_same_tensors(new, ref.same_class_loaded(new, old_sd, lambda: ChameleonVQ(new.config, None)))


@pytest.mark.parametrize("name", ["janus", "emu3"])
def test_hf_vq_decoders_equal_the_old_loader(dirs, name):
    """The VQ decoder of a transformers checkpoint (only its prefix read, from the shards holding it)
    equals transformers' model filled from the whole dict by ``load_state_dict``, and decodes alike."""
    import transformers

    from specvis.models.hf_vq import _FAMILIES, load_hf_vq, read_vq_state_dict

    new = load_hf_vq(dirs[name])
    cfg = json.loads((dirs[name] / "config.json").read_text())
    model_name, config_name = _FAMILIES[cfg["model_type"]]
    old = getattr(transformers, model_name)(getattr(transformers, config_name).from_dict(cfg["vq_config"]))
    old.load_state_dict(read_vq_state_dict(dirs[name]))
    assert_same_tensors(new.vq, old.eval())


def test_bundles_equal_the_old_loaders():
    """The embedded emoji bundles (fp16 safetensors) load to the fp32 tensors the old loaders gave
    (``from_pretrained`` = whole file + ``load_state_dict``; the EAGLE head through
    ``load_eagle_state_dict``)."""
    from safetensors.torch import load_file

    from specvis.models.continuous import ContinuousAR
    from specvis.models.drafter import DrafterConfig, EagleDrafter
    from specvis.models.llamagen import LlamaGen
    from specvis.models.vq import VQConfig, VQModel
    from specvis.zoo import ASSETS

    pipe = sv.load("emoji")
    root = ASSETS / "emoji"
    assert_same_tensors(pipe.target, ref.pretrained(root / "target", LlamaGen.from_config_dict))
    assert_same_tensors(pipe.draft, ref.pretrained(root / "draft", LlamaGen.from_config_dict))
    assert_same_tensors(pipe.tokenizer, ref.pretrained(root / "vq", lambda c: VQModel(VQConfig(**c))))
    assert_same_tensors(pipe.continuous.target, ref.pretrained(root / "continuous_target", ContinuousAR.from_config_dict))
    raw = json.loads((root / "drafter" / "config.json").read_text())
    sd = load_file(str(root / "drafter" / "model.safetensors"))
    old = EagleDrafter(DrafterConfig.from_json(raw, own_embeddings="embed_tokens.weight" in sd, fc_bias="fc.bias" in sd,
                                               first_input_norm="layers.0.input_layernorm.weight" in sd))
    old.load_eagle_state_dict(sd)
    assert_same_tensors(pipe.drafter, old.eval())
    assert pipe.dtype == torch.float32 and pipe.extras["dtype"] == "fp32"


class InitCounter:
    """Counts the calls of the in-place initialisers every ``nn.init`` function ends in, on tensors
    that hold memory (not meta)."""

    NAMES = ("normal_", "uniform_", "zero_", "fill_", "bernoulli_", "exponential_")

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def wrapped(t, *a, _name=name, _orig=original, **kw):
                if not t.is_meta:
                    self.calls.append((_name, tuple(t.shape)))
                return _orig(t, *a, **kw)

            monkeypatch.setattr(torch.Tensor, name, wrapped)


@pytest.mark.parametrize("name", ["janus", "emoji"])
def test_loading_initialises_no_weights(dirs, monkeypatch, name):
    """``sv.load`` runs no initialiser on a tensor that holds memory: modules are built on the meta
    device and every parameter comes from the file. Catches: parameters built for real (a random
    init of every weight, then a copy: the old loader's cost)."""
    counter = InitCounter(monkeypatch)
    pipe = sv.load(str(dirs[name]) if name in dirs else name)
    assert counter.calls == []
    assert not any(p.is_meta for m in (pipe.target, pipe.draft, pipe.drafter) if m is not None for p in m.parameters())


def test_the_counter_sees_an_initialised_build(monkeypatch):
    """The counter of the test above does see an ordinary (initialising) build."""
    from specvis.models.llamagen import LlamaGen, LlamaGenConfig

    counter = InitCounter(monkeypatch)
    LlamaGen(LlamaGenConfig(dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=2, block_size=4, multiple_of=32))
    assert len(counter.calls) >= 4


def expected_dtype(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """What a tensor of a model loaded in ``dtype`` holds: floating tensors ``dtype``, RoPE tables
    fp32 (``Float32Rope``: an angle table in bf16 would round every cos/sin to 8 bits), integer
    tensors their own."""
    if not t.is_floating_point():
        return t.dtype
    return torch.float32 if name.split(".")[-1] == "rope" else dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_tensor_in_the_requested_dtype_and_device(dirs, dtype):
    """Target, draft and EAGLE head of a Janus-layout checkpoint directory (emoji-t2i) and of the emoji bundle: every
    parameter and buffer in the requested dtype (RoPE tables fp32) on the requested device, and no
    fp32 copy made of a bf16 load (the weights' bytes are those of the dtype)."""
    for pipe in (sv.load("emoji-t2i", dtype=dtype), sv.load("emoji", dtype=dtype)):
        for model in (pipe.target, pipe.draft, pipe.drafter):
            for name, t in list(model.named_parameters()) + list(model.named_buffers()):
                assert t.dtype == expected_dtype(name, t, dtype), (name, t.dtype)
                assert t.device.type == "cpu"
        assert pipe.extras["dtype_source"] == "requested"


def test_sharded_checkpoint_streams_one_shard_at_a_time(dirs, monkeypatch):
    """Through the loader's own reading order: shards are opened one at a time, each closed before
    the next opens, every tensor read belongs to the shard open at that moment, each tensor's pages
    are handed back after its copy, and shards holding only tensors the model does not use (vision
    tower, VQ) are never opened. Catches: all shards opened up front (the whole checkpoint mapped at
    once), a shard read twice."""
    d = dirs["janus"]
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    load_decoder(d, dtype="bf16")
    opened, current = [], None
    for event, what in trace:
        if event == "open":
            assert current is None, "a shard opened while another is open"
            current = what
            opened.append(what)
        elif event == "close":
            assert what == current
            current = None
        else:
            assert current is not None and weight_map[what] == current.rsplit("/", 1)[-1], (event, what)
    assert current is None and len(opened) == len(set(opened)) >= 2
    reads = [w for e, w in trace if e == "read"]
    drops = [w for e, w in trace if e == "drop"]
    for i, (event, what) in enumerate(trace):  # a tensor's pages go back before the next tensor is read
        if event == "drop":
            assert trace[i - 1] == ("read", what)
    index = loading.safetensors_index(loading.safetensors_files(d))
    big = [k for k in reads if index[k][2] and torch.Size(index[k][2]).numel() * 4 >= 2 * loading._PAGE]
    assert big and set(big) <= set(drops)  # any tensor spanning a whole page (fp32 file) is handed back
    used = {weight_map[k] for k in reads}
    assert {p.rsplit("/", 1)[-1] for p in opened} == used
    assert len(used) < len(set(weight_map.values())), "the fixture should have shards the decoder does not need"


def test_keys_are_checked_before_any_data_is_read(dirs, tmp_path, monkeypatch):
    """A checkpoint lacking a tensor, or holding an unexpected one, fails in one line before any
    tensor is read (the check runs on the headers)."""
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "emu3"
    shutil.copytree(dirs["emu3"], d)
    sd = load_file(str(d / "model.safetensors"))
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    save_file({k: v for k, v in sd.items() if "layers.1.mlp.up_proj" not in k}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 tensors, e.g. 'layers.1.feed_forward.w3.weight'") as e:
        load_decoder(d)
    assert "\n" not in str(e.value) and not [t for t in trace if t[0] == "read"]
    save_file(dict(sd, **{"model.text_model.norm.extra": torch.zeros(3)}), str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"1 unexpected tensors, e.g. 'model.text_model.norm.extra'"):
        load_decoder(d)
    bad = dict(sd)
    key = next(k for k in sd if k.endswith("layers.0.mlp.down_proj.weight"))
    bad[key] = torch.zeros(3, 3)
    save_file(bad, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"shape mismatch for '{key}'"):
        load_decoder(d)


@pytest.mark.parametrize("stored, device, flags, want", [
    (torch.bfloat16, "cpu", {"avx512_bf16"}, torch.bfloat16),
    (torch.bfloat16, "cpu", {"avx2"}, torch.float32),
    (torch.bfloat16, "cpu", None, torch.float32),
    (torch.float16, "cpu", {"avx512_bf16"}, torch.float32),
    (torch.float16, "cpu", {"avx512_fp16"}, torch.float16),
    (torch.float32, "cpu", {"avx2"}, torch.float32),
    (torch.bfloat16, "cuda", {"avx2"}, torch.bfloat16),
    (torch.float16, "cuda", None, torch.float16),
])
def test_default_dtype_rule(monkeypatch, stored, device, flags, want):
    """The checkpoint's own dtype on CUDA; on a CPU its own where the CPU has dot products in it,
    else fp32 (and the reason says which). Catches: bf16 run emulated on an AVX2 CPU, or fp32 forced
    on a CPU that has bf16."""
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: None if flags is None else frozenset(flags))
    dt, why = loading.default_dtype(stored, torch.device(device))
    assert dt == want
    assert ("own" in why) == (dt == stored)


def test_default_dtype_of_a_checkpoint_and_why(dirs, tmp_path, monkeypatch):
    """A bf16 checkpoint (config.json's dtype, else the stored tensors') loads in bf16 on a CPU with
    bf16 dot products and in fp32 on one without; the pipeline says which and why."""
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "emu3"
    shutil.copytree(dirs["emu3"], d)
    sd = load_file(str(d / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, str(d / "model.safetensors"))
    config = json.loads((d / "config.json").read_text())
    config.pop("dtype", None), config.pop("torch_dtype", None)
    (d / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    pipe = sv.load(str(d))
    assert pipe.dtype == torch.bfloat16 and pipe.extras["dtype"] == "bf16"
    assert "own (bf16)" in pipe.extras["dtype_source"]
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2"}))
    pipe = sv.load(str(d))
    assert pipe.dtype == torch.float32 and "emulate" in pipe.extras["dtype_source"]
    (d / "config.json").write_text(json.dumps(dict(config, torch_dtype="float32")))
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert sv.load(str(d)).dtype == torch.float32  # config.json's dtype wins over the stored one
