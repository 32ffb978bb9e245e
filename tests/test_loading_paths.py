"""Loading, the paths ``tests/test_loading.py`` does not walk: a LlamaGen t2i and a MAR directory
with ``draft=`` (their own pipelines), the image decoders of every family (LlamaGen's VQ, MAR's
KL-16, the transformers VQ decoders, Chameleon's VQGAN), and on the CPU the weights left in the
file's private mapping (``models.loading.maps_in_place``) when the file stores the load dtype."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import specvis as sv  # noqa: E402
from hf_tiny import make_janus  # noqa: E402
from specvis.families import load_decoder  # noqa: E402
from specvis.models import loading, weight_layout  # noqa: E402
from test_llamagen_t2i import files  # noqa: E402,F401  (the fixture: a LlamaGen t2i release + draft)
from test_loading import InitCounter, assert_same_tensors, expected_dtype  # noqa: E402
from test_mar import tiny_mar, tiny_vae  # noqa: E402


def floating_dtypes(model: torch.nn.Module) -> dict[str, torch.dtype]:
    return {n: t.dtype for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_floating_point()}


def assert_loaded_as(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every parameter and buffer of ``model`` in ``dtype`` (RoPE tables fp32, integers their own), on the CPU, none meta."""
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.dtype == expected_dtype(name, t, dtype), (name, t.dtype)
        assert t.device.type == "cpu" and not t.is_meta, name


def test_llamagen_t2i_draft_and_vq_stream_in_the_requested_dtype(files, monkeypatch):  # noqa: F811
    """``sv.load(dir, draft=..., dtype="bf16")`` of a LlamaGen t2i release: target and draft GPTs in
    bf16 (the draft follows the target), the VQ decoder in fp32 on the pipeline's device, and no
    initialiser ran on any of them. Catches: the draft loaded in the checkpoint's fp32, or a
    decoder built with random initialisation before its file is read."""
    counter = InitCounter(monkeypatch)
    pipe = sv.load(str(files["dir"]), draft=str(files["draft_dir"]), dtype="bf16")
    assert_loaded_as(pipe.target, torch.bfloat16)
    assert_loaded_as(pipe.draft, torch.bfloat16)
    vq = pipe.decoder
    assert set(floating_dtypes(vq).values()) == {torch.float32}
    assert all(t.device == pipe.device for t in vq.parameters())
    assert counter.calls == []


def test_mar_draft_and_kl16_stream_in_the_requested_dtype(tmp_path, monkeypatch):
    """``sv.load(dir, draft=..., dtype="bf16")`` of a MAR directory (official tree: KL-16 two levels
    up): every parameter of target and draft MAR in bf16, equal to the files' tensors rounded to bf16; the KL-16 VAE in
    fp32; no initialiser ran. Catches: the draft left in fp32, a key of the draft not read."""
    root = tmp_path / "pretrained_models"
    target_dir, draft_dir = root / "mar" / "mar_tiny", root / "mar" / "mar_draft"
    for d in (target_dir, draft_dir, root / "vae"):
        d.mkdir(parents=True)
    target, draft = tiny_mar(0), tiny_mar(1)
    target.save_checkpoint(target_dir / "checkpoint-last.pth")
    draft.save_checkpoint(draft_dir / "checkpoint-last.pth")
    tiny_vae().save_checkpoint(root / "vae" / "kl16.ckpt")
    counter = InitCounter(monkeypatch)
    pipe = sv.load(str(target_dir), draft=str(draft_dir), dtype="bf16")
    assert counter.calls == []
    for loaded, made in ((pipe.target, target), (pipe.draft, draft)):  # (diffusion schedules: fp32 buffers)
        got, want = dict(loaded.named_parameters()), dict(made.named_parameters())
        assert sorted(got) == sorted(want) and {t.dtype for t in got.values()} == {torch.bfloat16}
        assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in want)
    assert set(floating_dtypes(pipe.vae).values()) == {torch.float32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_vq_decoder_streams_into_the_dtype_asked(tmp_path, monkeypatch, dtype):
    """The transformers VQ decoder loader (``load_hf_vq``) puts every tensor in the dtype it is asked
    for (its pipelines ask for fp32), builds nothing initialised, and reads only the VQ's keys."""
    from specvis.models.hf_vq import load_hf_vq

    d = make_janus(tmp_path / "janus")
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    counter = InitCounter(monkeypatch)
    vq = load_hf_vq(d, dtype=dtype)
    assert counter.calls == []
    assert set(floating_dtypes(vq.vq).values()) == {dtype}
    reads = [k for e, k in trace if e == "read"]
    assert reads and all(k.startswith(("model.vqmodel.", "vqmodel.", "model.vq")) for k in reads), reads[:3]


# ---------------------------------------------------------------- weights left in the file mapping
def bf16_copy(src, dst):
    """The checkpoint directory ``src`` with every floating tensor of its safetensors stored in bf16."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        sd = load_file(str(f))
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}, str(f),
                  metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def janus_bf16(tmp_path_factory):
    root = tmp_path_factory.mktemp("mapped")
    return bf16_copy(make_janus(root / "fp32", shards=True), root / "bf16")


def mapping_of(t: torch.Tensor) -> str | None:
    """What /proc/self/maps names the mapping holding ``t``'s first byte by (a file's path, [heap], or None)."""
    addr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5] if len(parts) > 5 else None
    return None


def in_a_file(t: torch.Tensor) -> bool:
    return (mapping_of(t) or "").endswith(".safetensors")


def test_bf16_weights_stay_in_the_private_file_mapping(janus_bf16, monkeypatch):
    """A bf16 checkpoint loaded in bf16 on the CPU: the whole tensors (MLP, q/k/v and o projections,
    norms, embeddings) are the file's own bytes in its mapping (traced ``keep``, never dropped), the
    head's selected rows are copied; the model equals the one loaded with every tensor copied; a write
    to a mapped weight leaves the file as it was (a private mapping). Catches: a tensor with a
    transform or rows kept as stored, a mapped weight's pages dropped, a shared mapping (the write
    would reach the checkpoint)."""
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    monkeypatch.setattr(loading, "MAPPED_FILES", set())
    mapped = load_decoder(janus_bf16, dtype="bf16")
    kept = {k for e, k in trace if e == "keep"}
    assert not kept & {k for e, k in trace if e == "drop"}
    assert any("mlp.down_proj" in k for k in kept) and any("q_proj" in k for k in kept)
    w = mapped.layers[0].feed_forward.w2.weight
    where = mapping_of(w)
    assert where is not None and where.endswith(".safetensors") and where in loading.MAPPED_FILES
    a = mapped.layers[0].attention
    assert all(in_a_file(p.weight) for p in a.projections())  # q, k, v: the file's rows, as stored
    assert loading.mapped_weight_bytes() >= w.numel() * w.element_size() // 2

    monkeypatch.setattr(loading, "MAPPED_DTYPES", ())
    copied = load_decoder(janus_bf16, dtype="bf16")
    assert not in_a_file(copied.layers[0].feed_forward.w2.weight)
    assert_same_tensors(mapped, copied)
    g = torch.Generator().manual_seed(0)
    from specvis.models.base import Prompts

    prompts = Prompts.of([[1, 5, 9, 12, 3]])
    tokens = torch.randint(mapped.layout.vocab_size, (1, 5), generator=g)
    with torch.no_grad():
        assert torch.equal(mapped.logits(prompts, tokens), copied.logits(prompts, tokens))

    before = (janus_bf16 / where.rsplit("/", 1)[-1]).read_bytes()
    with torch.no_grad():
        w.add_(1.0)
    assert (janus_bf16 / where.rsplit("/", 1)[-1]).read_bytes() == before
    assert not torch.equal(w, copied.layers[0].feed_forward.w2.weight)


@pytest.mark.parametrize("norms", ["per head", "per shard"])
def test_chameleon_attention_stays_in_the_file_mapping(tmp_path, monkeypatch, norms):
    """A Chameleon checkpoint (transformers' layout: q/k/v_proj apart, rows in rotate-half order,
    per-head q/k norms) in bf16, loaded in bf16 on the CPU: every q/k/v projection and, in the
    per-head layout, every q/k norm weight and bias is a view of the file's mapping (traced ``keep``;
    the loader's own ``maps_in_place`` decision); Lumina-mGPT's per-shard norms (one row per
    model-parallel shard) are expanded over the heads into fresh memory, the projections still
    mapped. Logits equal a load that copies every tensor. Catches: q/k/v still fused or reordered
    into fresh memory, a per-head norm copied, a per-shard norm mapped unexpanded."""
    from safetensors.torch import load_file, save_file
    from test_chameleon import make_chameleon

    from specvis.models.base import Prompts

    d = bf16_copy(make_chameleon(tmp_path / "fp32", lumina=norms == "per shard")[0], tmp_path / "bf16")
    if norms == "per shard":  # Lumina-mGPT's mp = 2 layout: a query-norm row per shard of two heads (the key
        for f in d.glob("*.safetensors"):  # norm, one head a shard, is per head either way)
            sd = load_file(str(f))
            sd = {k: v[::2].clone() if "self_attn.q_norm." in k else v for k, v in sd.items()}
            save_file(sd, str(f), metadata={"format": "pt"})
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    monkeypatch.setattr(loading, "MAPPED_FILES", set())
    mapped = load_decoder(d, dtype="bf16")
    kept = {k for e, k in trace if e == "keep"}
    reads = {k for e, k in trace if e == "read"}
    projections = {k for k in reads if re.search(r"self_attn\.[qkv]_proj\.", k)}
    head_norms = {k for k in reads if re.search(r"self_attn\.[qk]_norm\.", k)}
    assert len(projections) == 3 * mapped.config.n_layer and projections <= kept
    per_shard = {k for k in head_norms if norms == "per shard" and "q_norm" in k}
    assert len(head_norms) == 4 * mapped.config.n_layer and head_norms - per_shard <= kept
    assert not per_shard & kept
    for layer in mapped.layers:
        a = layer.attention
        assert all(in_a_file(p.weight) for p in a.projections())
        assert in_a_file(a.k_norm.weight) and in_a_file(a.q_norm.bias) == (norms == "per head")
        assert a.q_norm.weight.shape == (a.n_head, a.head_dim) and a.k_norm.weight.shape == (a.n_kv_head, a.head_dim)

    monkeypatch.setattr(loading, "MAPPED_DTYPES", ())
    copied = load_decoder(d, dtype="bf16")
    assert not any(in_a_file(p.weight) for p in copied.layers[0].attention.projections())
    assert_same_tensors(mapped, copied)
    prompts = Prompts.of([[1, 5, 9, 12, 3]])
    tokens = torch.randint(mapped.layout.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(mapped.logits(prompts, tokens), copied.logits(prompts, tokens))


def test_available_memory_leaves_out_the_mapped_weights(monkeypatch):
    """``available_memory_bytes`` (what the memory plan and weight packing may use) is MemAvailable
    less the weights held in file mappings, which the kernel counts as reclaimable page cache.
    Catches: the mapped weights planned as free memory (a batch planned into them would evict
    them, and every forward would read the file again)."""
    monkeypatch.setattr(loading, "mapped_weight_bytes", lambda: 0)
    free = weight_layout.available_memory_bytes()
    monkeypatch.setattr(loading, "mapped_weight_bytes", lambda: 2 ** 50)
    assert free > 0 and weight_layout.available_memory_bytes() == 0


def test_converting_and_quantized_loads_copy(janus_bf16, monkeypatch):
    """Nothing stays mapped where the load converts (bf16 file loaded in fp32 or fp16, fp32 file in
    bf16: every floating tensor then in the dtype asked) or quantizes (each float weight is freed as
    its int8 copy is made). Catches: a file tensor of another dtype left in the mapping as the weight."""
    trace: list[tuple[str, str]] = []
    monkeypatch.setattr(loading, "TRACE", trace)
    for d, dtype in ((janus_bf16, torch.float32), (janus_bf16, torch.float16), (janus_bf16.parent / "fp32", torch.bfloat16)):
        model = load_decoder(d, dtype=dtype)
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            assert t.dtype == expected_dtype(name, t, dtype), (name, t.dtype)
    load_decoder(janus_bf16, dtype="bf16", quantize="int8")
    assert [e for e, _ in trace if e == "keep"] == []
    assert json.loads((janus_bf16 / "config.json").read_text())  # the directory is intact


def test_routes_filling_rows_twice_or_not_at_all_are_refused():
    """``check_routes`` on row runs: two file tensors overlapping in a destination's rows, or rows no
    file tensor fills (inside or at the end), are one-line errors before any data is read; runs that
    tile the rows pass. Catches: an overlap or a trailing gap not seen by the run arithmetic."""
    dests = {"w": torch.empty(6, 2, device="meta")}

    def route(runs):
        return lambda key: (loading.Piece("w", runs[key]),)

    ok = {"a": slice(0, 3), "b": slice(3, 6)}
    assert set(loading.check_routes(ok, route(ok), dests, "x")) == {"a", "b"}
    for runs, match in (({"a": slice(0, 4), "b": slice(3, 6)}, "fills 'w' more than once"),
                        ({"a": slice(0, 3), "b": slice(4, 6)}, "lacks 1 tensors, e.g. 'w'"),
                        ({"a": slice(0, 3), "b": slice(3, 5)}, "lacks 1 tensors, e.g. 'w'")):
        with pytest.raises(ValueError, match=match):
            loading.check_routes(runs, route(runs), dests, "x")


def _mapped_shard(pipe) -> Path:
    w = pipe.target.layers[0].feed_forward.w2.weight
    where = mapping_of(w)
    assert where is not None and where.endswith(".safetensors"), "the test needs a weight left in the mapping"
    return Path(where)


def test_a_weights_file_rewritten_in_place_stops_the_next_call(janus_bf16, tmp_path):
    """A bf16 checkpoint's weights stay in the file mapping; the file rewritten in place (same size, other
    bytes) makes the next call one ValueError naming the file, before any forward; a file replaced by a
    new one (rename: a new inode) leaves the mapped weights as they were and calls go on. Catches: a
    call that runs on the silently changed weights (no check), a check that compares only sizes, a
    check that refuses a replaced file."""
    d = shutil.copytree(janus_bf16, tmp_path / "ckpt")
    pipe = sv.load(str(d), dtype="bf16")
    call = dict(prompts=["a cat"], method="ar", decode=False, sampling={"temperature": 0})
    first = pipe(**call).tokens
    shard = _mapped_shard(pipe)
    data = shard.read_bytes()
    fresh = shard.with_name("fresh.tmp")
    fresh.write_bytes(data)
    os.replace(fresh, shard)  # a new inode: the old mapping stands
    assert torch.equal(pipe(**call).tokens, first)
    pipe = sv.load(str(d), dtype="bf16")
    shard = _mapped_shard(pipe)
    header = 8 + int.from_bytes(data[:8], "little")
    with open(shard, "r+b") as f:  # in place: the same inode and size, other weights
        f.seek(header)
        f.write(bytes(len(data) - header))
    with pytest.raises(ValueError, match=re.escape(str(shard))) as e:
        pipe(**call)
    assert "\n" not in str(e.value) and "rewritten" in str(e.value)


def test_a_truncated_weights_file_is_one_line_not_sigbus(janus_bf16, tmp_path):
    """The mapped file truncated under a loaded model: the next call is one line naming the file and its
    sizes, not the process killed by SIGBUS. Runs in a child process (the bug kills it)."""
    import subprocess
    import sys

    d = shutil.copytree(janus_bf16, tmp_path / "ckpt")
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import specvis as sv
from test_loading_paths import _mapped_shard
pipe = sv.load({str(d)!r}, dtype="bf16")
call = dict(prompts=["a cat"], method="ar", decode=False, sampling={{"temperature": 0}})
pipe(**call)
shard = _mapped_shard(pipe)
os.truncate(shard, 4096)
try:
    pipe(**call)
except ValueError as e:
    print("ERROR", e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-500:])
    assert "ERROR weights file" in p.stdout and "changed size" in p.stdout and "4096" in p.stdout


def test_a_changed_file_of_a_freed_model_is_forgotten(janus_bf16, tmp_path):
    """Once the model that mapped a file is freed, rewriting the file stops nothing: another pipeline's
    call runs. Catches: a process-wide record that refuses every later call."""
    import gc

    d = shutil.copytree(janus_bf16, tmp_path / "ckpt")
    pipe = sv.load(str(d), dtype="bf16")
    shard = _mapped_shard(pipe)
    del pipe
    gc.collect()
    with open(shard, "r+b") as f:
        f.seek(64)
        f.write(b"\0" * 16)
        f.truncate(4096)
    sv.load("random-tiny")([0], "ar", decode=False)
