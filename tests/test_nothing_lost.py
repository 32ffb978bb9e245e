"""Nothing lost, nothing hangs: a user's file that is not ours is never overwritten, a weights file
changed under a loaded model stops the next call in one line, and every input that could block or
grow without bound ends in one line within seconds."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import specvis as sv
from specvis.cli import main


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "warning" not in ln]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


BENCH = ["bench", "--model", "random-tiny", "--methods", "ar", "--num", "1", "--no-cost-curve", "--metrics", "none"]


@pytest.mark.parametrize("content", ['{"model": "mine", "notes": [1, 2]}', '{"model": "mine", "runs": []}',
                                     "[1, 2, 3]", "{not json", "",
                                     '{"specvis_version": "0", "model": "x", "runs": "abc"}'])
def test_bench_refuses_a_json_that_is_not_a_report(content, tmp_path, capsys):
    """``bench --json FILE`` on a JSON object, a list or a corrupt file that is not a bench report: one line
    naming --json, exit 2, the file byte-identical. Catches: "not a bench report; starting afresh" and
    an overwrite (data loss), an AttributeError on a list."""
    mine = tmp_path / "mine.json"
    mine.write_text(content)
    assert main(BENCH + ["--json", str(mine)]) == 2
    line = one_error_line(capsys)
    assert "--json" in line and "not a specvis bench report" in line
    assert mine.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]


def test_bench_resumes_its_own_report_and_merge_refuses_a_list(tmp_path, capsys):
    """A report ``bench`` wrote carries its marker and is resumed; ``--merge`` of a list is one line
    naming --merge. Catches: a marker check that refuses our own reports; merge's AttributeError."""
    js = tmp_path / "r.json"
    assert main(BENCH + ["--json", str(js)]) == 0
    report = json.loads(js.read_text())
    assert report["specvis_report"] == "bench"
    capsys.readouterr()
    assert main(BENCH + ["--json", str(js)]) == 0
    assert "reusing ar" in capsys.readouterr().err
    lst = tmp_path / "list.json"
    lst.write_text("[]")
    assert main(["bench", "--merge", str(js), str(lst), "--json", str(tmp_path / "m.json")]) == 2
    line = one_error_line(capsys)
    assert "--merge" in line and "list.json" in line


@pytest.mark.parametrize("flag", ["--json", "--md", "--plots"])
def test_bench_checks_its_outputs_before_running(flag, tmp_path, capsys, monkeypatch):
    """An output path that cannot be written (a directory for a file, a file for a directory) is one line
    naming the flag before the model loads. Catches: the whole bench run, then a failed write."""
    import specvis.zoo

    monkeypatch.setattr(specvis.zoo, "load", lambda *a, **k: pytest.fail("loaded the model"))
    target = tmp_path / ("afile" if flag == "--plots" else "adir")
    target.mkdir() if flag != "--plots" else target.write_text("x")
    assert main(BENCH + [flag, str(target)]) == 2
    assert flag in one_error_line(capsys)


# ---------------------------------------------------------------- hangs and unbounded work

def test_pjd_window_is_clamped_and_planned(tmp_path):
    """PJD's window and lag count stream tokens: a window of 2**62 runs (clamped, the method recorded
    clamped) instead of overflowing a storage size, and the memory plan counts PJD's drafts and their
    laws: it grows with the window up to the row's width, then stays. Catches: an unclamped window
    (RuntimeError, or minutes of work), a plan blind to PJD's tensors (the same for any window)."""
    pipe = sv.load("random-tiny")
    W = pipe.target.layout.width
    with pytest.warns(UserWarning, match="window"):
        out = pipe([0], method=sv.PJD(window=2**62), decode=False)
    assert out.method.window == pipe.target.layout.stream_len
    plans = [pipe.memory(1, sv.PJD(window=w)).other_bytes for w in (2, 4, W, 10**9)]
    assert plans[0] < plans[1] < plans[2] == plans[3]
    assert plans[0] > pipe.memory(1, sv.AR()).other_bytes


def test_plan_runs_after_the_stream_clamp():
    """A stream field past the stream is planned as clamped: SJD(window=10**9) fits where the call runs.
    Catches: the plan of the unclamped window (thousands of GiB) refusing a call that runs."""
    pipe = sv.load("random-tiny")
    assert pipe.memory(1, sv.SJD(window=10**9)).needed_bytes == pipe.memory(1, sv.SJD(window=10**5)).needed_bytes
    assert pipe.memory(1, sv.SJD(window=10**9)).fits


@pytest.mark.parametrize("command", ["generate", "sample"])
def test_num_is_bounded_before_the_model_loads(command, tmp_path, capsys, monkeypatch):
    """``--num 10**12`` is one line naming --num before anything loads or any list is built. Catches:
    lists of num items built after loading (no output, memory growing)."""
    import specvis.zoo

    monkeypatch.setattr(specvis.zoo, "load", lambda *a, **k: pytest.fail("loaded the model"))
    assert main([command, "--model", "random-tiny", "--method", "ar", "--num", str(10**12), "--out", str(tmp_path / "o")]) == 2
    assert "--num" in one_error_line(capsys)


def test_auto_repeats_is_bounded():
    """``Auto(repeats=10**6)`` (``--auto-repeats``) is refused in one line naming the field."""
    with pytest.raises(ValueError, match=r"Auto.repeats must be an integer in \[1, "):
        sv.Auto(repeats=10**6)


def _cli(args: list[str], cwd: Path, timeout: float = 120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specvis.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))


T2I = Path(sv.__file__).parent / "assets" / "emoji_t2i" / "target"


@pytest.mark.parametrize("where", ["config.json", "tokenizer", "prompts", "/dev/zero"])
def test_fifos_and_devices_are_refused_not_read(where, tmp_path):
    """A FIFO as a checkpoint's config.json or one of its files, or as --prompts, and /dev/zero as
    --prompts: one line naming the file, exit 2, within the timeout (a child process: the bug blocks
    for ever or reads until memory runs out). Catches: an open() of a FIFO (blocks), a read of a
    device to its end."""
    model = tmp_path / "model"
    model.mkdir()
    for f in T2I.iterdir():
        if f.name != where:
            (model / f.name).symlink_to(f)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    if where == "config.json":
        os.mkfifo(model / "config.json")
    elif where == "tokenizer":
        os.mkfifo(model / "extra_tokens.json")
    elif where == "prompts":
        prompts.unlink()
        os.mkfifo(prompts)
    else:
        prompts = Path("/dev/zero")
    args = ["sample", "--model", str(model), "--method", "ar", "-n", "1", "--prompts", str(prompts),
            "--out", str(tmp_path / "o")]
    try:
        p = _cli(args, tmp_path, timeout=120)
    except Exception as e:  # subprocess.TimeoutExpired: the read blocked
        pytest.fail(f"{where}: {type(e).__name__}")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-400:]
    assert "not a regular file" in lines[0]
    assert (str(prompts) if where in ("prompts", "/dev/zero") else "model") in lines[0]


# ---------------------------------------------------------------- silent accepts

def _t2i_copy(tmp_path: Path, change) -> Path:
    from safetensors.torch import load_file, save_file

    d = tmp_path / "t2i"
    d.mkdir()
    for f in T2I.iterdir():
        if f.name != "model.safetensors":
            (d / f.name).symlink_to(f)
    sd = load_file(str(T2I / "model.safetensors"))
    save_file(change(sd), str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def test_nan_weights_stop_before_any_image(tmp_path):
    """A checkpoint whose weights are all NaN: the call is one ValueError (the first forward's logits are
    not finite), nothing generated. Catches: images written from a NaN law."""
    import torch

    d = _t2i_copy(tmp_path, lambda sd: {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                                        for k, v in sd.items()})
    pipe = sv.load(str(d))
    with pytest.raises(ValueError, match="NaN or infinite logits"):
        pipe(prompts=["a cat"], method="ar")


def test_an_integer_weight_is_refused_at_load(tmp_path):
    """One floating weight stored as int32: one line naming the tensor and its dtype at load. Catches:
    the integers silently converted into the model's floats."""
    import torch

    def one_int(sd):
        key = next(k for k in sd if "mlp.down_proj.weight" in k)
        return {**sd, key: sd[key].to(torch.int32)}

    d = _t2i_copy(tmp_path, one_int)
    with pytest.raises(ValueError, match="stored as int32") as e:
        sv.load(str(d))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args,needle", [
    (["generate", "--model", "emoji", "--class", "3", "99", "--num", "1"], "--class 99"),
    (["generate", "--model", "random-tiny", "--method", ""], "--method is empty"),
    (["generate", "--model", "random-tiny", "--out", ""], "--out is empty"),
    (["sample", "--model", "random-tiny", "-n", "1", "--out", ""], "--out is empty"),
    (["bench", "--model", "random-tiny", "--methods", ",,,"], "--methods"),
    (["bench", "--model", "random-tiny", "--methods", ""], "--methods"),
    (["generate", "--model", "emoji-mar", "--num", "3", "--batch-size", "2"], "batch_size 2"),
])
def test_silent_accepts_are_refused(args, needle, tmp_path, capsys, monkeypatch):
    """Nonsense refused in one line naming the flag: a class out of range that --num would not use, an
    empty --method (not the default), an empty --out (not the current directory), --methods naming
    nothing, MAR with a batch size below the images (it does not refill rows)."""
    monkeypatch.chdir(tmp_path)
    if "--out" not in args and args[0] != "bench":
        args = args + ["--out", str(tmp_path / "o")]
    assert main(args) == 2
    assert needle in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cgroup_limits_v1_and_v2(tmp_path):
    """The plan's free memory reads the cgroup's limit less its usage: v2 (``memory.max`` of the cgroup
    and its parents, "max" for none) and v1 (``memory.limit_in_bytes``, 2**63 for none). Catches: a
    limit ignored (MemAvailable alone), a parent's tighter limit ignored, "max" read as a number."""
    from specvis.models.weight_layout import cgroup_headroom_bytes

    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    for d, limit, used in ((v2, "max", "0"), (v2 / "a", "3000", "1000"), (v2 / "a" / "b", "5000", "900")):
        (d / "memory.max").write_text(limit + "\n")
        (d / "memory.current").write_text(used + "\n")
    (tmp_path / "cg2").write_text("0::/a/b\n")
    assert cgroup_headroom_bytes(str(v2), str(tmp_path / "cg2")) == 2000  # the parent's 3000 - 1000
    v1 = tmp_path / "v1" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("4096\n")
    (v1 / "memory.usage_in_bytes").write_text("1024\n")
    (tmp_path / "cg1").write_text("4:memory:/job\n0::/\n")
    assert cgroup_headroom_bytes(str(tmp_path / "v1"), str(tmp_path / "cg1")) == 3072
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert cgroup_headroom_bytes(str(tmp_path / "v1"), str(tmp_path / "cg1")) is None


def test_the_free_memory_is_the_least_of_the_limits(monkeypatch):
    """``available_memory_bytes`` is the least of MemAvailable, the cgroup's headroom and RLIMIT_AS's.
    Catches: a limit read but left out of the minimum."""
    from specvis.models import weight_layout

    machine = weight_layout.available_memory_bytes()
    monkeypatch.setattr(weight_layout, "cgroup_headroom_bytes", lambda: 12345)
    assert weight_layout.available_memory_bytes() == min(machine, 12345)
    monkeypatch.setattr(weight_layout, "address_space_headroom_bytes", lambda: 999)
    assert weight_layout.available_memory_bytes() == 999


def test_rlimit_as_bounds_the_free_memory():
    """A process under ``RLIMIT_AS`` plans with what its address space has left, not the machine's
    MemAvailable (a child process: the limit is process-wide)."""
    import subprocess
    import sys

    code = ("import resource; from specvis.models import weight_layout as w; "
            "before = w.available_memory_bytes(); resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
            "after = w.available_memory_bytes(); print(before, after)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    before, after = map(int, out.stdout.split())
    assert after < 6 << 30 and (after < before or before < 6 << 30)


@pytest.mark.parametrize("lie", ["offsets", "shape"])
def test_a_lying_safetensors_header_is_named(lie, tmp_path):
    """A header whose tensor claims 2**62 bytes (its data_offsets past the file's end, or a shape of
    2**62 elements over its few bytes): one line saying the header is inconsistent with the file's
    size. Catches: "hidden_size 256 is more than the checkpoint's 0 stored weights"."""
    d = tmp_path / "t2i"
    d.mkdir()
    for f in T2I.iterdir():
        if f.name != "model.safetensors":
            (d / f.name).symlink_to(f)
    raw = (T2I / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    key = next(k for k in header if "mlp.down_proj.weight" in k)
    if lie == "offsets":
        header[key]["data_offsets"][1] = 2**62
    else:
        header[key]["shape"] = [2**31, 2**31]
    text = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    with pytest.raises(ValueError, match="inconsistent with the file's size") as e:
        sv.load(str(d))
    assert key in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- messages name the flag

def test_a_full_disk_names_out(tmp_path, capsys, monkeypatch):
    """An OSError writing under --out (a full disk) is one line naming --out. Catches: the bare
    "No space left on device" with no flag."""
    import errno

    import specvis.outputs

    def full(image, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(specvis.outputs, "write_png", full)
    out = tmp_path / "o"
    assert main(["generate", "--model", "random-tiny", "--method", "ar", "--num", "1", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"--out {out}" in line and "No space left" in line


@pytest.mark.parametrize("args,needle", [
    (["demo", "--host", "bogus.invalid"], "--host"),
    (["bench", "--model", "random-tiny", "--methods", "ar", "--md", "/"], "--md"),
    (["generate", "--model", "emoji-t2i", "--method", "ar", "--prompt", "a" * 120_000], "--prompt has 120000"),
])
def test_messages_name_the_flag(args, needle, tmp_path, capsys):
    """Each is one line naming its flag, before anything runs (a prompt of 120,000 characters prints no
    tokenizer warning first)."""
    if args[0] == "generate":
        args = args + ["--out", str(tmp_path / "o")]
    assert main(args) == 2
    assert needle in one_error_line(capsys)


# ---------------------------------------------------------------- memory the plan must see

def test_a_refill_allocates_prefix_slots_and_stays_within_the_plan(monkeypatch):
    """Continuous batching (5 samples through 2 rows): each refill's prefill allocates a cache of the
    prefix's slots only, and the KV caches alive at once (the running cache and the refill's) stay
    within the call's plan, which counts the refill. Catches: a refill cache of prefix + stream slots
    (twice the KV memory during a refill), a plan blind to the refill."""
    from specvis.models.base import CacheGeometry

    pipe = sv.load("random-tiny")
    made: list[tuple[int, int]] = []
    allocate = CacheGeometry.allocate

    def recording(self, dtype, device):
        made.append((self.slots, self.nbytes(dtype, device)))
        return allocate(self, dtype, device)

    monkeypatch.setattr(CacheGeometry, "allocate", recording)
    sampling = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    pipe([0, 1, 2, 3, 1], "ar", sampling, batch_size=2, decode=False)
    prefix = pipe.target.max_prefix
    running, refills = made[0], made[1:]
    assert refills and all(slots == prefix for slots, _ in refills)
    plan = pipe.memory(2, sv.AR(), sampling, prompt_tokens=prefix, refill=True)
    assert running[1] + 2 * max(b for _, b in refills) <= plan.kv_bytes
    assert plan.kv_bytes > pipe.memory(2, sv.AR(), sampling, prompt_tokens=prefix).kv_bytes


# ---------------------------------------------------------------- progress

@pytest.mark.parametrize("command", ["generate", "sample", "bench"])
def test_progress_bar_on_stderr_when_asked_and_never_with_quiet(command, tmp_path, capsys):
    """``--progress`` shows the bar (images, on stderr, never stdout) where stderr is not a terminal;
    ``--quiet`` and the default off a terminal show none."""
    base = {"generate": ["generate", "--model", "random-tiny", "--method", "ar", "--num", "2", "--out", str(tmp_path / "g")],
            "sample": ["sample", "--model", "random-tiny", "--method", "ar", "-n", "2", "--batch-size", "1",
                       "--out", str(tmp_path / "s")],
            "bench": ["bench", "--model", "random-tiny", "--methods", "ar", "--num", "1", "--no-cost-curve",
                      "--metrics", "none"]}[command]
    assert main(base + ["--progress"]) == 0
    out, err = capsys.readouterr()
    assert " img [" in err and " img [" not in out
    for extra in (["--quiet"], []):
        if command != "bench":
            import shutil

            shutil.rmtree(tmp_path / ("g" if command == "generate" else "s"))
        assert main(base + extra) == 0
        assert " img [" not in capsys.readouterr().err


def test_python_progress_true_shows_a_bar(capsys):
    """``pipe(..., progress=True)``: a bar of images on stderr; False: none."""
    pipe = sv.load("random-tiny")
    pipe([0, 1], "ar", progress=True, decode=False)
    assert "img" in capsys.readouterr().err
    pipe([0, 1], "ar", progress=False, decode=False)
    assert "img" not in capsys.readouterr().err


@pytest.mark.parametrize("module", ["specvis", "specvis.cli"])
def test_ctrl_c_while_importing_is_one_line(module):
    """SIGINT while specvis imports torch (sent by an import hook, so it lands inside the import): one
    line, ended by SIGINT (a shell shows 130), no KeyboardInterrupt traceback. Catches: the traceback of an interrupt before the
    command line's own handler is in place."""
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "class Interrupting:\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'torch':\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "        return None\n"
            "sys.meta_path.insert(0, Interrupting())\n"
            f"import {module}\n")
    def as_in_a_terminal() -> None:  # Ctrl+C's default disposition, whatever this test process inherited or set
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       preexec_fn=as_in_a_terminal)
    assert p.returncode in (130, -signal.SIGINT) and p.stderr.strip() == "specvis: interrupted", p.stderr[-300:]


def test_the_import_hook_is_gone_after_a_complete_import():
    """Once specvis is imported, ``sys.excepthook`` is what it was: the library leaves no global hook."""
    import subprocess
    import sys

    code = "import sys; before = sys.excepthook; import specvis.cli; assert sys.excepthook is before"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
