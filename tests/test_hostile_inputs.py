"""Hostile input, one test per class of input: each bad value is one line naming the field and what it
takes (CLI: exit 2, no traceback; API: ValueError, or ``InputTypeError``, a TypeError that is also a
ValueError), never a traceback from deep inside, a hang or a silent wrong result. The whole list of
cases, CLI and API, is ``scripts/fuzz_inputs.py``; these tests pin each class's rule.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import specvis as sv
from specvis import checks, demo
from specvis.cli import main
from specvis.io import clean_stale_temps
from specvis.methods import rounds
from specvis.checks import one_line
from specvis.job import Job
from specvis.sample import sample

T2I = Path(sv.__file__).parent / "assets" / "emoji_t2i" / "target"


@pytest.fixture(scope="module")
def tiny():
    return sv.load("random-tiny")


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "warning" not in ln]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


# ---------------------------------------------------------------- devices

@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:99", "bogus", "", "meta", "cpu:x", "mps"])
def test_device_strings(device, tmp_path, capsys):
    """Every device string this machine lacks is one line naming --device (CLI) or device (API) and the
    allowed forms, before a model loads; cpu works. Catches: a device passed on to torch unchecked
    (its AssertionError/RuntimeError traceback)."""
    if device.startswith("cuda") and torch.cuda.is_available() and device != "cuda:99":
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="device") as e:
        sv.load("random-tiny", device=device)
    assert "\n" not in str(e.value)
    assert main(["generate", "--model", "random-tiny", "--num", "1", "--device", device, "--out", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert "--device" in line and ("cpu, cuda or cuda:N" in line or "use cpu" in line or "CUDA device" in line)
    assert not tmp_path.joinpath("000.png").exists()


def test_device_types_and_cpu():
    assert checks.device("cpu") == torch.device("cpu") and checks.device(torch.device("cpu")).type == "cpu"
    for bad in (3, None, ["cpu"]):
        with pytest.raises(TypeError, match="device must be cpu, cuda or cuda:N"):
            checks.device(bad)


# ---------------------------------------------------------------- numeric fields

@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e999])
def test_numeric_reader_refuses_what_is_not_finite(value):
    """``checks.number`` is the one reader of numeric fields: an infinity or NaN is refused there, naming the
    field, whatever range its caller then checks (every option's own bound is checked after it)."""
    with pytest.raises(ValueError, match="x must be a finite number >= 0"):
        checks.number(value, "x", ">= 0")


NUMERIC = [  # (field, value): bools, floats for ints, strings, inf/nan, negatives, huge
    ("temperature", True), ("temperature", "1"), ("temperature", math.inf), ("temperature", math.nan),
    ("temperature", -0.5), ("top_k", True), ("top_k", 2.0), ("top_k", 0), ("top_k", -3), ("top_k", "5"),
    ("top_p", math.nan), ("top_p", 0.0), ("top_p", 1.5), ("top_p", True), ("cfg_scale", math.inf),
    ("cfg_scale", math.nan), ("cfg_scale", -1.0), ("cfg_scale", "3"), ("cfg_scale", 1e400),
]


@pytest.mark.parametrize("field,value", NUMERIC)
def test_sampling_numeric_fields(field, value):
    """Sampling refuses what would run as something else (top_k=True as top-k 1) or poison every law
    (cfg_scale=inf made all-zero tokens); the message names the field. Catches: a bool, a string or a
    non-finite value let through."""
    with pytest.raises(ValueError, match=field):
        sv.Sampling(**{field: value})


def test_sampling_good_values_kept():
    s = sv.Sampling(temperature=0, top_k=5, top_p=0.9, cfg_scale=4)
    assert (s.temperature, s.top_k, s.top_p, s.cfg_scale) == (0, 5, 0.9, 4)
    import numpy as np

    sv.Sampling(temperature=np.float32(0.5), top_k=np.int64(3))  # numpy scalars are numbers


@pytest.mark.parametrize("args,needle", [
    (["--seed", "-1"], "--seed"), (["--seed", str(2**64)], "--seed"), (["--temperature", "nan"], "temperature"),
    (["--cfg-scale", "inf"], "cfg_scale"), (["--top-p", "0"], "top_p"), (["--top-k", "-2"], "top_k"),
    (["--num", "0"], "--num"), (["--method", "sjd:window=true"], "window"),
    (["--method", "speculative:gamma=1.5"], "gamma"), (["--method", "sjd:refine=2"], "refine"),
    (["--method", "sjd:accept=lantern:budget=relative:lam=nan"], "lam"),
    (["--method", "sjd", "--accept", "lantern", "--lantern-delta", "inf"], "--lantern-delta"),
])
def test_cli_numeric_flags(args, needle, tmp_path, capsys):
    """Numeric flags and bench-spec values: one line naming the flag or key. Catches: a spec value of
    the wrong type (gamma=true read as 1) or a non-finite float reaching a method."""
    rc = main(["generate", "--model", "random-tiny", "--out", str(tmp_path), *args])
    assert rc == 2
    assert needle in one_error_line(capsys)


def test_seeds_of_a_sample_run_stay_in_range(tiny, tmp_path):
    """Batch j runs with seed + j: the last batch's seed must be a valid one too."""
    with pytest.raises(ValueError, match="--seed"):
        sample(tiny, Job(method=sv.AR(), num=4, batch_size=2, seed=2**64 - 1, out=str(tmp_path / "s")))


# ---------------------------------------------------------------- the Python API's argument types

BAD_CALLS = [  # (keyword arguments of pipe(...), the argument the message must name)
    (dict(classes=[]), "classes"), (dict(classes=[3.5]), "classes[0]"), (dict(classes=[True]), "classes[0]"),
    (dict(classes=["a"]), "classes[0]"), (dict(classes=[0, 99]), "classes[1]"), (dict(classes=5), "classes"),
    (dict(classes="01"), "classes"), (dict(classes=torch.tensor([0.5])), "classes"),
    (dict(classes=[0], method=sv.Sampling()), "method"), (dict(classes=[0], method=sv.SJD), "method"),
    (dict(classes=[0], method=3), "method"), (dict(classes=[0], method="warp"), "method"),
    (dict(classes=[0], sampling={"temp": 0}), "sampling"), (dict(classes=[0], sampling=0.5), "sampling"),
    (dict(classes=[0], sampling=sv.SJD()), "sampling"), (dict(classes=[0], seed=1.5), "seed"),
    (dict(classes=[0], seed=2**64), "seed"), (dict(classes=[0], seed=-1), "seed"), (dict(classes=[0], seed="0"), "seed"),
    (dict(classes=[0], seed=True), "seed"),
]


@pytest.mark.parametrize("kwargs,name", BAD_CALLS, ids=[repr(k)[:50] for k, _ in BAD_CALLS])
def test_api_argument_types(tiny, kwargs, name):
    """A wrong argument is a ValueError (InputTypeError for a wrong type) naming it, never an
    AttributeError or a RuntimeError from inside, nor a silent conversion (classes=[3.5] ran as class 3,
    [True] as class 1, seed=1.5 as 1)."""
    with pytest.raises(ValueError) as e:
        tiny(**kwargs)
    assert str(e.value).startswith(name) or f"{name} " in str(e.value) or f"'{name.split('[')[0]}'" in str(e.value)
    assert "\n" not in str(e.value)


def test_api_conveniences_are_the_same_call(tiny):
    """Accepted as a convenience: a method name or bench spec string (as --method takes) and a dict of
    Sampling fields (set on the model's default sampling, as the CLI's flags are); each gives the same
    tokens as the objects they name."""
    a = tiny([0, 1], method="sjd:window=4", sampling={"temperature": 0.5, "top_k": 8}, seed=3)
    b = tiny([0, 1], method=sv.SJD(window=4), sampling=sv.Sampling(temperature=0.5, top_k=8), seed=3)
    assert torch.equal(a.tokens, b.tokens) and a.method == b.method
    c = tiny(torch.tensor([0, 1]), method=sv.SJD(window=4), sampling=sv.Sampling(temperature=0.5, top_k=8), seed=3)
    assert torch.equal(a.tokens, c.tokens)
    emoji = sv.load("emoji")
    assert emoji.default_sampling.cfg_scale != 1.0
    assert sv.sampling.sampling_argument({"temperature": 0}, emoji.default_sampling) == sv.Sampling(
        temperature=0, top_k=emoji.default_sampling.top_k, top_p=emoji.default_sampling.top_p,
        cfg_scale=emoji.default_sampling.cfg_scale)


@pytest.mark.parametrize("name,match", [("", "name is empty"), (None, "name must be"), (3, "name must be"),
                                         ("  ", "name is empty")])
def test_load_names(name, match):
    with pytest.raises(ValueError, match=match):
        sv.load(name)


def test_text_prompts():
    """Empty, whitespace and non-UTF-8 prompts (a command-line argument that was not UTF-8 arrives with
    lone surrogates: the tokenizer raised TypeError) are one line naming the prompt; an empty negative
    prompt is a legitimate value."""
    pytest.importorskip("transformers")
    pipe = sv.load("emoji-t2i")
    for prompts, name in ((["" ], "prompts[0]"), (["cat", " \t"], "prompts[1]"), (["caf\udce9"], "prompts[0]")):
        with pytest.raises(ValueError, match=name.replace("[", r"\[")):
            pipe(prompts=prompts, decode=False)
    out = pipe(prompts=["cat"], negative_prompts=[""], sampling={"cfg_scale": 2.0}, decode=False, height=2, width=2)
    assert out.tokens.shape == (1, 4)


# ---------------------------------------------------------------- sizes: stream-bounded fields, rounds

# 3 x the stream of random-tiny (64 tokens): beyond it, yet cheap if a bug lets it run unclamped (the
# issue's 100000 allocated 80 GB for SJD and drafted 100000 tokens a round for speculative: the fuzz
# script runs those under an address-space cap)
BIG = 192


@pytest.mark.parametrize("big,same", [
    (sv.SJD(window=BIG), "window"), (sv.Jacobi(window=BIG), "window"), (sv.Speculative(gamma=BIG), "gamma"),
    (sv.EagleTree(depth=BIG), "depth"),
])
def test_stream_fields_are_clamped_to_the_stream(tiny, big, same):
    """A window, gamma or tree depth beyond the image stream runs as the stream's length: same tokens
    as the method written with that length, a warning naming the field, and the work of a round
    bounded by the grid (gamma 100000 drafted 100000 tokens a round: one image took hours)."""
    import dataclasses

    L = tiny.target.layout.stream_len
    assert BIG > L
    sampling = sv.Sampling(temperature=0) if isinstance(big, sv.Jacobi) else None
    with pytest.warns(UserWarning, match=f"{same} {BIG} -> {L}"):
        out = tiny([0, 2], method=big, sampling=sampling, seed=1)
    ref = tiny([0, 2], method=dataclasses.replace(big, **{same: L}), sampling=sampling, seed=1)
    assert torch.equal(out.tokens, ref.tokens)
    assert getattr(out.method, same) == L


def test_a_round_loop_without_progress_stops():
    """The round runner raises once a stream of L tokens has taken L rounds and is not done (every
    round commits a token per unfinished row), instead of looping. Catches: the bound dropped."""
    calls = []

    class Stuck:
        device = torch.device("cpu")
        counted = []
        max_rounds = 5

        def live_caches(self):
            return []

        def done(self):
            return len(calls) >= 50  # finishes eventually, so a missing bound fails instead of hanging

        def report_progress(self):
            pass

    with pytest.raises(RuntimeError, match="no progress"):
        rounds.run_rounds(Stuck(), lambda: calls.append(1), graphs=False)
    assert len(calls) == 5
    calls.clear()
    roomy = Stuck()
    roomy.max_rounds = 60
    rounds.run_rounds(roomy, lambda: calls.append(1), graphs=False)  # within the bound: runs to the end
    assert len(calls) == 50


def test_allocation_failure_is_one_line(tmp_path, capsys, monkeypatch):
    """An allocation the machine cannot make (generate --num 100000) is one line, not torch's traceback."""
    from specvis.families import kv_cache

    def fail(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 264122368000 bytes.")

    monkeypatch.setattr(kv_cache, "run", fail)  # KV-cached models generate through tune.run
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "100000", "--out", str(tmp_path)]) == 2
    assert "out of memory" in one_error_line(capsys)


# ---------------------------------------------------------------- concurrent sample on one directory

def _hold_lock(path: Path) -> subprocess.Popen:
    """A process that holds ``path``'s OS lock (as a running ``specvis sample`` does) until killed."""
    code = ("import fcntl, os, sys, time\nf = open(sys.argv[1], 'a+')\nfcntl.flock(f.fileno(), fcntl.LOCK_EX)\n"
            "f.write(str(os.getpid())); f.flush()\nprint('held', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_concurrent_sample_on_one_directory(tiny, tmp_path):
    """While one process samples into a directory, a second one is refused (one line, naming the holder)
    instead of both rewriting the same rank file (a batch went missing from stats.json); a holder
    killed with SIGKILL leaves no block behind (an OS lock, not a lock file's existence)."""
    out = tmp_path / "s"
    (out / "stats").mkdir(parents=True)
    holder = _hold_lock(out / "stats" / "rank000.lock")
    try:
        with pytest.raises(ValueError, match=f"in use by another specvis sample \\(process {holder.pid}"):
            sample(tiny, Job(method=sv.AR(), num=4, batch_size=2, out=str(out)))
        assert not list((out / "images").glob("*.png"))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    stats = sample(tiny, Job(method=sv.AR(), num=4, batch_size=2, out=str(out)), log=lambda line: None)
    assert stats["batches_with_stats"] == stats["n_batches"] == 2
    with open(out / "stats" / "rank000.lock") as f:  # released at the end of the run
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---------------------------------------------------------------- damaged files in an output directory

def test_damaged_files_in_a_sample_directory(tiny, tmp_path):
    """A truncated config.json is refused, naming it (it was taken for missing: a seed-1 run reused the
    seed-0 images under its own name); a truncated PNG is regenerated, byte-identical; a PNG damaged
    inside is named by the error; temporaries of dead processes go, a live process's stay."""
    out = tmp_path / "s"
    run = lambda seed=0: sample(tiny, Job(method=sv.AR(), num=6, batch_size=2, seed=seed, out=str(out)),  # noqa: E731
                                log=lambda line: None)
    run()
    png = out / "images" / "000003.png"
    good = png.read_bytes()

    config = out / "config.json"
    text = config.read_text()
    config.write_text(text[:30])
    with pytest.raises(ValueError, match="config.json is damaged"):
        run(seed=1)
    config.write_text(text)

    png.write_bytes(good[: len(good) // 2])
    run()
    assert png.read_bytes() == good

    broken = bytearray(good)
    broken[40:60] = bytes(20)  # inside the image data; the file still ends with IEND
    png.write_bytes(bytes(broken))
    with pytest.raises(ValueError, match="000003.png"):
        run()
    png.write_bytes(good)

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / "images" / f".000009.png.{dead.pid}.deadbeef.tmp"
    live = out / "images" / f".000010.png.{os.getpid()}.deadbeef.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    assert clean_stale_temps(out / "images") == []
    assert not stale.exists() and live.exists()


def test_generate_cleans_a_killed_runs_temporaries(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp_path.mkdir(exist_ok=True)
    stale = tmp_path / f".000.png.{dead.pid}.0123abcd.tmp"
    stale.write_bytes(b"half a png")
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "1", "--out", str(tmp_path)]) == 0
    assert not stale.exists() and not list(tmp_path.glob(".*.tmp"))


def _config_dir(tmp_path: Path, edit) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in T2I.iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    config = json.loads((T2I / "config.json").read_text())
    edit(config)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("key,value,match", [
    ("hidden_size", 0, "text_config.hidden_size must be an integer"), ("hidden_size", -1, "hidden_size"),
    ("hidden_size", 10**9, "hidden_size must be an integer in 1..16777216"), ("hidden_size", True, "hidden_size"),
    ("hidden_size", 256.5, "hidden_size"), ("hidden_size", 1_000_000, "the config does not match the weights"),
    ("num_hidden_layers", 100_000, "the config does not match the weights"),
    ("num_hidden_layers", 4, "config.json gives 4 decoder layers, the checkpoint stores 5"),
    ("num_attention_heads", 3, "multiple of num_attention_heads"), ("vocab_size", 10**7, "vocab_size"),
])
def test_config_json_sizes(tmp_path, key, value, match):
    """Zero, negative, huge, non-integer or inflated sizes in a checkpoint's config.json are one line
    naming the key, before a module of that size is built (no ZeroDivisionError, no allocation failure,
    no silently dropped layers)."""
    d = _config_dir(tmp_path, lambda c: c["text_config"].__setitem__(key, value))
    with pytest.raises(ValueError, match=match):
        sv.load(str(d))


@pytest.mark.parametrize("key,value", [("hidden_size", 0), ("num_hidden_layers", 10**9), ("block_size", True)])
def test_drafter_config_json_sizes(tmp_path, key, value):
    """The EAGLE head's config.json (``--drafter``) too: one line naming the key, before building."""
    src = T2I.parent / "drafter"
    d = tmp_path / "drafter"
    d.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    config = json.loads((src / "config.json").read_text())
    config[key] = value
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"config.json: {key} must be an integer"):
        sv.models.drafter.EagleDrafter.from_pretrained(d)


def test_one_line_joins_the_lines_and_cuts_at_the_limit():
    """Every line of a wrapped error is kept, on one line; the loaders cut it at 300 characters, the
    CLI (limit None) does not; an empty message names the error's type."""
    e = ValueError("first\n  second\tthird " + "x" * 400)
    assert one_line(e).startswith("first second third x") and len(one_line(e)) == 300
    assert len(one_line(e, limit=None)) == len("first second third ") + 400
    assert one_line(OSError()) == "OSError"


def test_checkpoint_errors_do_not_advise_unsafe_loading(tmp_path):
    """torch's weights-only refusal advises loading with weights_only=False: wrong advice for a file of
    unknown origin, so the message gives the reason only."""
    for data in (random.Random(0).randbytes(4096), pickle.dumps(print, protocol=2)):
        path = tmp_path / "x.pt"
        path.write_bytes(data)
        with pytest.raises(Exception) as e, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(str(path), weights_only=True)
        line = one_line(e.value)
        assert "weights_only" not in line and "not a plain tensor checkpoint" in line


# ---------------------------------------------------------------- the demo's model allow-list

def test_demo_model_allow_list(tmp_path):
    """The page loads the installed bundles and the operator's --model arguments only; every other
    name, an existing directory or not, gets the same line, which says nothing of the server's files
    (it answered "/etc: missing config.json")."""
    offered = _config_dir(tmp_path, lambda c: None)
    models = demo.Models(extra=[str(offered)])
    assert "random-tiny" in models.offered and str(offered) in models.offered
    lines = set()
    for name in ("/etc", "/etc/passwd", str(tmp_path / "nope"), str(T2I), "../..", "x" * 2000, None, 3):
        with pytest.raises(ValueError) as e:
            models.get(name)
        lines.add(str(e.value))
    lines.discard(f"choose a model: {', '.join(models.offered)}")  # None / 3: nothing typed
    assert len(lines) == 1
    line = lines.pop()
    assert "offers only the models its operator chose" in line
    for word in ("/etc", "passwd", "config.json", "missing", "nope"):
        assert word not in line
    assert models.get(str(offered)).name  # the operator's checkpoint loads


def test_demo_page_offers_only_the_allow_list():
    pytest.importorskip("gradio")
    app = demo.build_app(["random-tiny"])
    box = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "sv-model")
    assert box.allow_custom_value is False
    assert [c[0] if isinstance(c, tuple) else c for c in box.choices][:1] == ["emoji"]


def test_demo_server_refuses_other_models_over_http(monkeypatch):
    """A client posting straight to the page's API (no browser, no dropdown) cannot make the server
    load a path: the model field is refused before any handler runs, and a non-finite cfg scale (it
    became a JSON error) is one line in the status."""
    pytest.importorskip("gradio")
    import urllib.request

    loaded = []
    real_get = demo.Models.get
    monkeypatch.setattr(demo.Models, "get", lambda self, name: loaded.append(name) or real_get(self, name))
    app = demo.serve(["random-tiny"], port=0, block=False)
    try:
        url = app.local_url.rstrip("/")

        def call(api: str, data: list) -> str:
            req = urllib.request.Request(f"{url}/gradio_api/call/{api}", data=json.dumps({"data": data}).encode(),
                                         headers={"Content-Type": "application/json"})
            event = json.loads(urllib.request.urlopen(req, timeout=60).read())["event_id"]
            with urllib.request.urlopen(f"{url}/gradio_api/call/{api}/{event}", timeout=120) as r:
                return r.read().decode()

        for name in ("/etc", "../../etc/passwd"):
            assert "event: error" in call("on_model", [name])
            assert "event: error" in call("on_generate", [name, "0", "sjd", "window=4", "exact", 0, 1.0, 3.0])
        assert not [n for n in loaded if n not in ("random-tiny",)]
        reply = call("on_generate", ["random-tiny", "0", "sjd", "window=4", "exact", 0, 1.0, float("inf")])
        assert "cfg scale must be a finite number" in reply and "event: complete" in reply
    finally:
        app.close()


@pytest.mark.parametrize("cfg", ["inf", float("inf"), "nan", "1e999"])
def test_demo_cfg_field_not_finite(cfg):
    with pytest.raises(ValueError, match="cfg scale must be a finite number"):
        demo.compare(demo.Models(), "random-tiny", "0", "sjd", "window=4", "exact", 0, cfg_scale=cfg)


# ---------------------------------------------------------------- other commands

@pytest.mark.parametrize("args,needle", [
    (["--target", "x", "--out", "{file}"], "--out"), (["--target", "x", "--out", "{dir}", "--lr", "-1"], "--lr"),
    (["--target", "x", "--out", "{dir}", "--lr", "nan"], "--lr"), (["--target", "x", "--out", "{dir}", "--lr", "x"], "--lr"),
    (["--out", "{dir}"], "--target"), (["--target", "x", "--out", "{dir}", "--device", "bogus"], "--device"),
])
def test_train_drafter_flags(args, needle, tmp_path, capsys):
    """One line naming the flag, not the whole usage."""
    f = tmp_path / "afile"
    f.write_text("x")
    args = [a.format(file=f, dir=tmp_path / "o") for a in args]
    assert main(["train-drafter", *args]) == 2
    line = one_error_line(capsys)
    assert needle in line and "usage" not in line


def test_bench_unknown_metric(capsys):
    assert main(["bench", "--model", "random-tiny", "--metrics", "proxy,bogus"]) == 2
    assert "--metrics: unknown metric 'bogus'" in one_error_line(capsys)
