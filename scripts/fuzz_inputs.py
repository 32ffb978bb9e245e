"""Hostile inputs, CLI and Python API: each must work as a user would expect or stop with one line.

Every case runs in its own process with a timeout and a cap on its address space (``--memory-gib``,
default 8: an allocation the machine cannot make fails at once instead of swapping a shared machine)
and is judged by what a user sees:

- ``fail`` cases must exit 2 (CLI) or raise ValueError/TypeError (API) with ONE line that names the
  field (every string of ``names`` in it, case-insensitive) and nothing of ``hide``;
- ``ok`` cases must exit 0 (CLI) or return (API);
- any case that prints a traceback, runs past its timeout, or exits 0 where it must fail is a defect.

Scenarios (damaged files in a ``sample`` directory, two ``sample`` processes on one directory, stale
temporaries, the demo's model allow-list) drive several commands and check files on disk.

Prints a table (case | expected | verdict | exit | seconds | first line of the error), a summary and
one line per class of input (the first campaign's cases, then the second's: data loss, hangs,
tracebacks, silent accepts, messages, memory, progress) with its counts; exits 1 when any case is a
defect. Run from the repository root::

    python scripts/fuzz_inputs.py              # every case (a few minutes on a 2-core machine)
    python scripts/fuzz_inputs.py -k device,seed   # the cases whose name contains "device" or "seed"
    python scripts/fuzz_inputs.py -g hangs,"data loss"   # the cases of these classes
    python scripts/fuzz_inputs.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
T2I = ROOT / "specvis" / "assets" / "emoji_t2i" / "target"


@dataclass
class Case:
    name: str
    expect: str  # "fail" or "ok"
    argv: list | None = None  # CLI: arguments of ``python -m specvis.cli``
    code: str | None = None  # API: Python run after ``import specvis as sv, torch, math`` (as written)
    names: tuple[str, ...] = ()  # the error line must contain each (case-insensitive)
    hide: tuple[str, ...] = ()  # ... and none of these
    timeout: float = 120.0
    scenario: Callable[["Work"], "Outcome"] | None = None
    group: str = "first campaign"  # the class of input it belongs to (the summary counts each)
    env: dict | None = None  # environment variables of its process


@dataclass
class Outcome:
    verdict: str  # "ok" or a defect: TRACEBACK, HANG, EXIT-0, EXIT-n, MULTI-LINE, UNNAMED, SHOWN, FAILED
    rc: int | None
    seconds: float
    line: str


@dataclass
class Work:
    """The scratch directory and fixtures the cases refer to as {name} in their arguments."""

    dir: Path
    memory: int
    paths: dict[str, str] = field(default_factory=dict)

    def fill(self, items):
        return [x.format(**self.paths) if isinstance(x, str) else x for x in items]


# ---------------------------------------------------------------- running one process

API_HARNESS = textwrap.dedent("""
    import math, sys, traceback
    import torch
    import specvis as sv
    try:
        exec(compile(sys.argv[1], "<case>", "exec"))
    except (ValueError, TypeError) as e:
        print(f"{type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
""")


def _limit(memory: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        os.setsid()  # its own process group: a timeout kills the case and its children
    return apply


def run(argv: list, work: Work, timeout: float, env: dict | None = None) -> tuple[int | None, str, str, float]:
    """(exit status or None on timeout, stdout, stderr, seconds) of ``python argv`` in the scratch directory."""
    t0 = time.monotonic()
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
             PYTHONWARNINGS="ignore", **(env or {}))
    p = subprocess.Popen([sys.executable, *argv], cwd=work.dir, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=_limit(work.memory))
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    return rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0


def judge(case: Case, rc: int | None, err: str, seconds: float) -> Outcome:
    lines = [ln for ln in err.splitlines() if ln.strip() and "warning" not in ln.lower()]
    first = lines[0] if lines else ""
    if rc is None:
        return Outcome("HANG", rc, seconds, f"killed after {case.timeout:.0f} s")
    if "Traceback (most recent call last)" in err:
        tail = [ln for ln in err.splitlines() if ln.strip()][-1:]
        return Outcome("TRACEBACK", rc, seconds, tail[0] if tail else "")
    if case.expect == "ok":
        return Outcome("ok" if rc == 0 else f"EXIT-{rc}", rc, seconds, first)
    if rc == 0:
        return Outcome("EXIT-0", rc, seconds, first)
    if rc != 2:
        return Outcome(f"EXIT-{rc}", rc, seconds, first)
    if len(lines) != 1:
        return Outcome("MULTI-LINE", rc, seconds, f"{len(lines)} lines: {first}")
    if not all(n.lower() in first.lower() for n in case.names):
        return Outcome("UNNAMED", rc, seconds, first)
    if any(h.lower() in first.lower() for h in case.hide):
        return Outcome("SHOWN", rc, seconds, first)
    return Outcome("ok", rc, seconds, first)


def run_case(case: Case, work: Work) -> Outcome:
    if case.scenario is not None:
        t0 = time.monotonic()
        try:
            out = case.scenario(work)
        except Exception as exc:  # noqa: BLE001 - a scenario's own failure is reported as a defect
            out = Outcome("FAILED", None, 0.0, f"{type(exc).__name__}: {exc}")
        out.seconds = time.monotonic() - t0
        return out
    if case.argv is not None:
        argv = ["-m", "specvis.cli", *work.fill(case.argv)]
    else:
        argv = ["-c", API_HARNESS, case.code]
    rc, _, err, seconds = run(argv, work, case.timeout, env=case.env)
    return judge(case, rc, err, seconds)


# ---------------------------------------------------------------- fixtures

def make_fixtures(work: Work) -> None:
    d = work.dir
    (d / "afile").write_text("not a directory\n")
    (d / "prompts_latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    (d / "prompts_blank.txt").write_text("\n   \n\n")
    for name, data in (("random_mar", random.Random(0).randbytes(4096)),  # torch: "Weights only load failed"
                       ("pickled_mar", pickle.dumps(print, protocol=2))):  # a code object's global, not tensors
        (d / name).mkdir()
        (d / name / "checkpoint-last.pth").write_bytes(data)
    config = json.loads((T2I / "config.json").read_text())
    for tag, value in (("zero", 0), ("huge", 10**9), ("inflated", 1_000_000)):
        c = json.loads(json.dumps(config))
        c["text_config"]["hidden_size"] = value
        target = d / f"config_{tag}"
        target.mkdir()
        for f in T2I.iterdir():
            if f.name != "config.json":
                (target / f.name).symlink_to(f)
        (target / "config.json").write_text(json.dumps(c))
    work.paths.update({k: str(d / k) for k in ("afile", "random_mar", "pickled_mar", "config_zero", "config_huge",
                                                "config_inflated")})
    work.paths.update(prompts_latin1=str(d / "prompts_latin1.txt"), prompts_blank=str(d / "prompts_blank.txt"))
    work.paths["out"] = str(d / "out")
    # second campaign: files that are not what they claim, FIFOs, devices, damaged checkpoints
    (d / "mine.json").write_text('{"model": "mine", "notes": [1, 2]}')
    (d / "list.json").write_text("[1, 2, 3]")
    (d / "adir").mkdir()
    (d / "prompts.txt").write_text("a cat\n")
    os.mkfifo(d / "prompts_fifo")
    fifo = d / "config_fifo"
    fifo.mkdir()
    for f in T2I.iterdir():
        if f.name != "config.json":
            (fifo / f.name).symlink_to(f)
    os.mkfifo(fifo / "config.json")
    from safetensors.torch import load_file, save_file
    import torch

    sd = load_file(str(T2I / "model.safetensors"))
    key = next(k for k in sd if "mlp.down_proj.weight" in k)
    raw = (T2I / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header[key]["data_offsets"][1] = 2**62
    lying = json.dumps(header).encode()
    for tag, write in (("nan", lambda f: save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                                                     for k, v in sd.items()}, f, metadata={"format": "pt"})),
                       ("int32", lambda f: save_file({**sd, key: sd[key].to(torch.int32)}, f, metadata={"format": "pt"})),
                       ("lying", lambda f: Path(f).write_bytes(len(lying).to_bytes(8, "little") + lying + raw[8 + n:]))):
        target = d / f"t2i_{tag}"
        target.mkdir()
        for f in T2I.iterdir():
            if f.name != "model.safetensors":
                (target / f.name).symlink_to(f)
        write(str(target / "model.safetensors"))
    work.paths.update({k.replace(".", "_"): str(d / k) for k in ("mine.json", "list.json", "adir", "prompts.txt",
                                                                  "prompts_fifo", "config_fifo", "t2i_nan", "t2i_int32",
                                                                  "t2i_lying")})


# ---------------------------------------------------------------- scenarios

def _sample(work: Work, out: str, *extra: str, seed: int = 0, timeout: float = 300) -> tuple[int | None, str, str, float]:
    argv = ["-m", "specvis.cli", "sample", "--model", "random-tiny", "--method", "ar", "-n", "6", "--batch-size", "2",
            "--seed", str(seed), "--out", out, *extra]
    return run(argv, work, timeout)


def scenario_truncated_config(work: Work) -> Outcome:
    """A truncated config.json is damage, not absence: a seed-1 run must not take the seed-0 images."""
    out = str(work.dir / "s_config")
    rc, _, err, _ = _sample(work, out)
    if rc != 0:
        return Outcome("FAILED", rc, 0, f"first run: {err.strip()[-200:]}")
    path = Path(out) / "config.json"
    path.write_text(path.read_text()[:40])
    rc, _, err, s = _sample(work, out, seed=1)
    case = Case("", "fail", names=("config.json",))
    return judge(case, rc, err, s)


def scenario_truncated_png(work: Work) -> Outcome:
    """A truncated PNG is regenerated by the rerun (same bytes as before), or named in one line."""
    out = Path(work.dir / "s_png")
    rc, _, err, _ = _sample(work, str(out))
    if rc != 0:
        return Outcome("FAILED", rc, 0, f"first run: {err.strip()[-200:]}")
    png = out / "images" / "000003.png"
    good = png.read_bytes()
    png.write_bytes(good[: len(good) // 2])
    rc, _, err, s = _sample(work, str(out))
    if rc != 0:
        return judge(Case("", "fail", names=("000003.png",)), rc, err, s)
    if png.read_bytes() != good:
        return Outcome("FAILED", rc, s, "the regenerated image differs from the first run's")
    return Outcome("ok", rc, s, "regenerated the damaged image's batch, byte-identical")


def scenario_two_samples(work: Work) -> Outcome:
    """Two ``sample`` processes on one directory: the second is refused while the first runs (an OS
    lock), and stats.json ends with every batch's stats."""
    out = str(work.dir / "s_two")
    argv = ["-m", "specvis.cli", "sample", "--model", "random-tiny", "--method", "ar", "-n", "48", "--batch-size", "1",
            "--out", out]
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    first = subprocess.Popen([sys.executable, *argv], cwd=work.dir, env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=_limit(work.memory))
    lock, images = Path(out) / "stats" / "rank000.lock", Path(out) / "images"

    def started() -> bool:  # the first run holds its lock, or (a version without one) has written images
        return (lock.exists() and bool(lock.read_text().strip())) or len(list(images.glob("*.png"))) >= 2

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not started():
        time.sleep(0.05)
    rc, _, err, s = run(argv, work, 300)
    running = first.poll() is None
    first.communicate(timeout=600)
    stats = json.loads((Path(out) / "stats.json").read_text())
    if stats["batches_with_stats"] != stats["n_batches"]:
        return Outcome("FAILED", rc, s, f"stats.json has {stats['batches_with_stats']} of {stats['n_batches']} batches")
    if running:
        return judge(Case("", "fail", names=("in use",)), rc, err, s)
    return Outcome("ok" if rc == 0 else f"EXIT-{rc}", rc, s, "the first run ended before the second started; stats consistent")


def scenario_stale_temps(work: Work) -> Outcome:
    """A temporary left by a killed ``generate`` (dead PID) is removed by the next run in the directory;
    one of a live process stays."""
    out = work.dir / "s_temps"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".000.png.{dead.pid}.0123abcd.tmp"
    live = out / f".001.png.{os.getpid()}.0123abcd.tmp"
    stale.write_bytes(b"half a png")
    live.write_bytes(b"being written")
    rc, _, err, s = run(["-m", "specvis.cli", "generate", "--model", "random-tiny", "--method", "ar", "--num", "1",
                         "--out", str(out)], work, 120)
    if rc != 0:
        return judge(Case("", "ok"), rc, err, s)
    if stale.exists() or not live.exists():
        return Outcome("FAILED", rc, s, f"stale temp {'left' if stale.exists() else 'removed'}, live temp "
                                        f"{'kept' if live.exists() else 'removed'}")
    return Outcome("ok", rc, s, "the dead process's temporary removed, the live one's kept")


def scenario_demo_allow_list(work: Work) -> Outcome:
    """The demo loads only its bundles and the operator's --model arguments; any other name gets the same
    line, which says nothing about the server's files."""
    code = textwrap.dedent(f"""
        from specvis import demo
        m = demo.Models(extra=[{str(T2I)!r}])
        assert {str(T2I)!r} in m.offered and "emoji" in m.offered
        lines = set()
        for name in ["/etc", "/etc/passwd", "/nonexistent/dir", "../../..", {str(work.dir / 'config_zero')!r}, "x" * 5000]:
            try:
                m.get(name)
            except ValueError as e:
                lines.add(str(e))
            else:
                raise SystemExit("loaded " + name[:40])
        assert len(lines) == 1, lines
        line = lines.pop()
        for word in ("config.json", "/etc", "passwd", "missing", "not a directory", "exist"):
            assert word not in line, (word, line)
        print(line)
    """)
    rc, out, err, s = run(["-c", code], work, 120)
    if rc != 0:
        return Outcome("FAILED", rc, s, (err.strip().splitlines() or [""])[-1])
    return Outcome("ok", rc, s, out.strip())


def scenario_demo_cfg_inf(work: Work) -> Outcome:
    """The page's cfg field set to inf (or nan) is one line naming the field."""
    code = textwrap.dedent("""
        from specvis import demo
        m = demo.Models()
        for value in ("inf", float("inf"), "nan", "1e999"):
            try:
                demo.compare(m, "random-tiny", "0", "sjd", "window=4", "exact", 0, cfg_scale=value)
            except ValueError as e:
                line = demo.error_line(e)
                assert "cfg" in line and "\\n" not in line, line
            else:
                raise SystemExit(f"cfg {value!r} ran")
        print(line)
    """)
    rc, out, err, s = run(["-c", code], work, 120)
    if rc != 0:
        return Outcome("FAILED", rc, s, (err.strip().splitlines() or [""])[-1])
    return Outcome("ok", rc, s, out.strip())


def scenario_bench_json_not_a_report(work: Work) -> Outcome:
    """``bench --json`` on a user's JSON that is not a bench report: one line naming --json, the file
    byte-identical (the first campaign overwrote it, "starting afresh")."""
    mine = Path(work.paths["mine_json"])
    before = mine.read_bytes()
    rc, _, err, s = run(["-m", "specvis.cli", "bench", "--model", "random-tiny", "--methods", "ar", "--num", "1",
                         "--no-cost-curve", "--metrics", "none", "--json", str(mine)], work, 120)
    if mine.read_bytes() != before:
        return Outcome("FAILED", rc, s, "the user's JSON was overwritten")
    return judge(Case("", "fail", names=("--json", "not a specvis bench report")), rc, err, s)


# ---------------------------------------------------------------- the cases

def cases() -> list[Case]:
    G = ["generate", "--model", "random-tiny", "--num", "1", "--out", "{out}"]
    GE = ["generate", "--model", "emoji", "--num", "1", "--out", "{out}"]
    T = ["generate", "--model", "emoji-t2i", "--method", "ar", "--out", "{out}"]
    S = ["sample", "--model", "random-tiny", "--method", "ar", "--out", "{out}"]
    PIPE = "pipe = sv.load('random-tiny'); "
    T2 = "pipe = sv.load('emoji-t2i'); "
    c = [
        # devices
        Case("cli device cuda (no GPU)", "fail", G + ["--device", "cuda"], names=("--device", "cuda")),
        Case("cli device bogus", "fail", G + ["--device", "bogus"], names=("--device", "bogus")),
        Case("cli device cuda:99", "fail", G + ["--device", "cuda:99"], names=("--device",)),
        Case("cli device empty", "fail", G + ["--device", ""], names=("--device",)),
        Case("cli device meta", "fail", G + ["--device", "meta"], names=("--device",)),
        Case("cli sample device cuda", "fail", S + ["-n", "2", "--device", "cuda"], names=("--device",)),
        Case("cli demo device bogus", "fail", ["demo", "--device", "bogus", "--port", "0"], names=("--device",)),
        Case("cli train-drafter device cuda:99", "fail", ["train-drafter", "--target", "x", "--out", "{out}",
                                                         "--device", "cuda:99"], names=("--device",)),
        Case("api load device bogus", "fail", code="sv.load('random-tiny', device='bogus')", names=("device",)),
        Case("api load device cuda", "fail", code="sv.load('random-tiny', device='cuda')", names=("device",)),
        Case("api load device int", "fail", code="sv.load('random-tiny', device=3)", names=("device",)),
        # stream sizes: clamped to the image stream, never an allocation failure or a hang
        Case("cli sjd window 100000", "ok", G + ["--method", "sjd", "--window", "100000"]),
        Case("cli speculative gamma 100000 (emoji)", "ok", GE + ["--method", "speculative", "--gamma", "100000"],
             timeout=300),
        Case("cli eagle depth 100000", "ok", G + ["--method", "eagle", "--depth", "100000"]),
        Case("cli jacobi window 100000", "ok", G + ["--method", "jacobi", "--window", "100000", "--temperature", "0"]),
        Case("cli adt depth_range 1/100000", "ok", G + ["--method", "adt:depth_range=1/100000"]),
        Case("api SJD(window=100000)", "ok", code=PIPE + "pipe([0], method=sv.SJD(window=100000))"),
        Case("api Speculative(gamma=100000)", "ok", code=PIPE + "pipe([0], method=sv.Speculative(gamma=100000))"),
        # batch sizes: one batch the machine cannot hold is one line
        Case("cli generate num 100000 (emoji)", "fail", ["generate", "--model", "emoji", "--method", "ar", "--num",
                                                        "100000", "--out", "{out}"], names=("memory",), timeout=300),
        Case("cli sample batch-size 100000", "fail", ["sample", "--model", "emoji", "--method", "ar", "-n", "100000",
                                                      "--batch-size", "100000", "--out", "{out}"], names=("memory",),
             timeout=300),
        Case("cli sample batch-size 0", "fail", S + ["-n", "2", "--batch-size", "0"], names=("--batch-size",)),
        Case("cli num 0", "fail", G[:-4] + ["--num", "0", "--out", "{out}"], names=("--num",)),
        Case("cli num -5", "fail", S + ["-n", "-5"], names=("--num",)),
        # numeric fields: bools, floats for ints, inf/nan, negatives, huge
        Case("cli temperature nan", "fail", G + ["--temperature", "nan"], names=("temperature",)),
        Case("cli temperature inf", "fail", G + ["--temperature", "inf"], names=("temperature",)),
        Case("cli temperature -1", "fail", G + ["--temperature", "-1"], names=("temperature",)),
        Case("cli cfg-scale inf", "fail", G + ["--cfg-scale", "inf"], names=("cfg_scale",)),
        Case("cli cfg-scale nan", "fail", G + ["--cfg-scale", "nan"], names=("cfg_scale",)),
        Case("cli top-p 0", "fail", G + ["--top-p", "0"], names=("top_p",)),
        Case("cli top-p 1.5", "fail", G + ["--top-p", "1.5"], names=("top_p",)),
        Case("cli top-k -1", "fail", G + ["--top-k", "-1"], names=("top_k",)),
        Case("cli top-k 1.5", "fail", G + ["--top-k", "1.5"], names=("--top-k",)),
        Case("cli window 0", "fail", G + ["--method", "sjd", "--window", "0"], names=("window",)),
        Case("cli gamma -3", "fail", G + ["--method", "speculative", "--gamma", "-3"], names=("gamma",)),
        Case("cli spec window=true", "fail", G + ["--method", "sjd:window=true"], names=("window",)),
        Case("cli spec gamma=1.5", "fail", G + ["--method", "speculative:gamma=1.5"], names=("gamma",)),
        Case("cli spec window=abc", "fail", G + ["--method", "sjd:window=abc"], names=("window",)),
        Case("cli spec refine=2", "fail", G + ["--method", "sjd:refine=2"], names=("refine",)),
        Case("cli lantern delta inf", "fail", G + ["--method", "sjd", "--accept", "lantern", "--lantern-delta", "inf"],
             names=("delta",)),
        Case("cli spec lam=nan", "fail", G + ["--method", "sjd:accept=lantern:budget=relative:lam=nan"], names=("lam",)),
        Case("cli seed -1", "fail", G + ["--seed", "-1"], names=("--seed",)),
        Case("cli seed 2**64", "fail", G + ["--seed", str(2**64)], names=("--seed",)),
        Case("cli seed 1.5", "fail", G + ["--seed", "1.5"], names=("--seed",)),
        Case("cli sample seed 2**64-1 with 3 batches", "fail", S + ["-n", "6", "--batch-size", "2", "--seed",
                                                                  str(2**64 - 1)], names=("--seed",)),
        Case("cli num-iter 0 (emoji-mar)", "fail", ["generate", "--model", "emoji-mar", "--num", "1", "--num-iter", "0",
                                                    "--out", "{out}"], names=("--num-iter",)),
        Case("cli num-iter 10**9 (emoji-mar)", "fail", ["generate", "--model", "emoji-mar", "--num", "1", "--num-iter",
                                                        str(10**9), "--out", "{out}"], names=("num_iter",)),
        Case("cli bench repeats 0", "fail", ["bench", "--model", "random-tiny", "--repeats", "0"], names=("--repeats",)),
        Case("cli demo port 70000", "fail", ["demo", "--port", "70000"], names=("--port",)),
        Case("api Sampling(top_k=True)", "fail", code="sv.Sampling(top_k=True)", names=("top_k",)),
        Case("api Sampling(top_k=2.0)", "fail", code="sv.Sampling(top_k=2.0)", names=("top_k",)),
        Case("api Sampling(temperature='1')", "fail", code="sv.Sampling(temperature='1')", names=("temperature",)),
        Case("api Sampling(temperature=inf)", "fail", code="sv.Sampling(temperature=math.inf)", names=("temperature",)),
        Case("api Sampling(top_p=nan)", "fail", code="sv.Sampling(top_p=math.nan)", names=("top_p",)),
        Case("api Sampling(cfg_scale=inf)", "fail", code="sv.Sampling(cfg_scale=math.inf)", names=("cfg_scale",)),
        Case("api Sampling(cfg_scale=True)", "fail", code="sv.Sampling(cfg_scale=True)", names=("cfg_scale",)),
        Case("api Speculative(gamma=True)", "fail", code="sv.Speculative(gamma=True)", names=("gamma",)),
        Case("api SJD(window=2.0)", "fail", code="sv.SJD(window=2.0)", names=("window",)),
        Case("api seed=1.5", "fail", code=PIPE + "pipe([0], seed=1.5)", names=("seed",)),
        Case("api seed=2**64", "fail", code=PIPE + "pipe([0], seed=2**64)", names=("seed",)),
        Case("api seed=-1", "fail", code=PIPE + "pipe([0], seed=-1)", names=("seed",)),
        Case("api seed='0'", "fail", code=PIPE + "pipe([0], seed='0')", names=("seed",)),
        Case("api seed=True", "fail", code=PIPE + "pipe([0], seed=True)", names=("seed",)),
        # classes
        Case("cli class 3 99", "fail", ["generate", "--model", "emoji", "--class", "3", "99", "--out", "{out}"],
             names=("--class", "99")),
        Case("cli class -1", "fail", G + ["--class", "-1"], names=("--class",)),
        Case("cli sample class 99", "fail", S + ["-n", "2", "--class", "99"], names=("--class",)),
        Case("api classes=[]", "fail", code=PIPE + "pipe([])", names=("classes",)),
        Case("api classes=[3.5]", "fail", code=PIPE + "pipe([3.5])", names=("classes",)),
        Case("api classes=[True]", "fail", code=PIPE + "pipe([True])", names=("classes",)),
        Case("api classes=['a']", "fail", code=PIPE + "pipe(['a'])", names=("classes",)),
        Case("api classes=5", "fail", code=PIPE + "pipe(5)", names=("classes",)),
        Case("api classes='01'", "fail", code=PIPE + "pipe('01')", names=("classes",)),
        Case("api classes=[0, 99]", "fail", code=PIPE + "pipe([0, 99])", names=("classes",)),
        Case("api classes=float tensor", "fail", code=PIPE + "pipe(torch.tensor([0.5]))", names=("classes",)),
        Case("api classes=int tensor", "ok", code=PIPE + "pipe(torch.tensor([0, 1]))"),
        Case("api generate empty conditions", "fail",
             code=PIPE + "sv.generate(pipe.target, torch.tensor([], dtype=torch.long))", names=("conditions",)),
        # the Python API's argument types
        Case("api method='sjd' (a name: accepted)", "ok", code=PIPE + "assert pipe([0], method='sjd').method.name == 'sjd'"),
        Case("api method='sjd:window=4' (a spec)", "ok", code=PIPE + "assert pipe([0], method='sjd:window=4').method.window == 4"),
        Case("api method='warp'", "fail", code=PIPE + "pipe([0], method='warp')", names=("method", "warp")),
        Case("api method=sv.Sampling()", "fail", code=PIPE + "pipe([0], method=sv.Sampling())", names=("method",)),
        Case("api method=sv.SJD (class)", "fail", code=PIPE + "pipe([0], method=sv.SJD)", names=("method",)),
        Case("api method=3", "fail", code=PIPE + "pipe([0], method=3)", names=("method",)),
        Case("api sampling={'temperature': 0} (accepted)", "ok", code=PIPE + "pipe([0], sampling={'temperature': 0})"),
        Case("api sampling={'temp': 0}", "fail", code=PIPE + "pipe([0], sampling={'temp': 0})", names=("sampling", "temp")),
        Case("api sampling=0.5", "fail", code=PIPE + "pipe([0], sampling=0.5)", names=("sampling",)),
        Case("api sampling=sv.SJD()", "fail", code=PIPE + "pipe([0], sampling=sv.SJD())", names=("sampling",)),
        Case("api load('')", "fail", code="sv.load('')", names=("name",)),
        Case("api load(None)", "fail", code="sv.load(None)", names=("name",)),
        Case("api load(3)", "fail", code="sv.load(3)", names=("name",)),
        Case("api mar num_iter=0", "fail", code="sv.load('emoji-mar')([0], num_iter=0)", names=("num_iter",)),
        # text prompts
        Case("cli prompt empty", "fail", T + ["--prompt", ""], names=("prompt",)),
        Case("cli prompt whitespace", "fail", T + ["--prompt", "   \t"], names=("prompt",)),
        Case("cli prompt not UTF-8", "fail", T + [b"--prompt", b"caf\xe9"], names=("prompt", "UTF-8")),
        Case("cli prompts file latin-1", "fail", ["sample", "--model", "emoji-t2i", "-n", "1", "--prompts",
                                                  "{prompts_latin1}", "--out", "{out}"], names=("--prompts",)),
        Case("cli prompts file blank", "fail", ["sample", "--model", "emoji-t2i", "-n", "1", "--prompts",
                                                "{prompts_blank}", "--out", "{out}"], names=("--prompts",)),
        Case("cli height 0", "fail", T + ["--prompt", "cat", "--height", "0"], names=("--height",)),
        Case("cli height 100000", "fail", T + ["--prompt", "cat", "--height", "100000", "--width", "100000"],
             names=("height",)),
        Case("cli 1x1 grid", "ok", T + ["--prompt", "cat", "--height", "1", "--width", "1"]),
        Case("api prompts=['']", "fail", code=T2 + "pipe(prompts=[''])", names=("prompts[0]",)),
        Case("api prompts=['cat', '  ']", "fail", code=T2 + "pipe(prompts=['cat', '  '])", names=("prompts[1]",)),
        Case("api prompts=[non-UTF-8]", "fail", code=T2 + "pipe(prompts=['caf\\udce9'])", names=("prompts[0]", "UTF-8")),
        Case("api prompts='cat'", "fail", code=T2 + "pipe(prompts='cat')", names=("prompts",)),
        Case("api negative_prompts=[''] (accepted)", "ok", code=T2 + "pipe(prompts=['cat'], negative_prompts=[''], "
                                                                      "sampling={'cfg_scale': 2.0}, decode=False)"),
        # files: model directories, checkpoints, outputs
        Case("cli model empty", "fail", ["generate", "--model", "", "--out", "{out}"], names=("--model",)),
        Case("cli model /etc", "fail", ["generate", "--model", "/etc", "--out", "{out}"], names=("/etc",)),
        Case("cli config.json zero size", "fail", T[:2] + ["{config_zero}"] + T[3:] + ["--prompt", "cat"],
             names=("hidden_size",)),
        Case("cli config.json huge size", "fail", T[:2] + ["{config_huge}"] + T[3:] + ["--prompt", "cat"],
             names=("hidden_size",)),
        Case("cli config.json inflated size", "fail", T[:2] + ["{config_inflated}"] + T[3:] + ["--prompt", "cat"],
             names=("hidden_size",)),
        Case("cli random-bytes checkpoint", "fail", ["generate", "--model", "{random_mar}", "--out", "{out}"],
             names=("checkpoint",), hide=("weights_only", "will likely succeed")),
        Case("cli pickled-code checkpoint", "fail", ["generate", "--model", "{pickled_mar}", "--out", "{out}"],
             names=("checkpoint",), hide=("weights_only", "will likely succeed")),
        Case("cli generate out is a file", "fail", G[:-1] + ["{afile}"], names=("--out",)),
        Case("cli sample out is a file", "fail", S[:-1] + ["{afile}", "-n", "2"], names=("--out",)),
        Case("cli train-drafter out is a file", "fail", ["train-drafter", "--target", "x", "--out", "{afile}"],
             names=("--out",)),
        Case("cli train-drafter lr -1", "fail", ["train-drafter", "--target", "x", "--out", "{out}", "--lr", "-1"],
             names=("--lr",)),
        Case("cli train-drafter lr nan", "fail", ["train-drafter", "--target", "x", "--out", "{out}", "--lr", "nan"],
             names=("--lr",)),
        Case("cli train-drafter lr abc", "fail", ["train-drafter", "--target", "x", "--out", "{out}", "--lr", "abc"],
             names=("--lr",)),
        Case("cli train-drafter no model", "fail", ["train-drafter", "--out", "{out}"], names=("--target",)),
        Case("cli bench metrics bogus", "fail", ["bench", "--model", "random-tiny", "--metrics", "bogus"],
             names=("--metrics", "bogus")),
        Case("cli bench methods bogus", "fail", ["bench", "--model", "random-tiny", "--methods", "ar,warp"],
             names=("warp",)),
        Case("cli dtype bogus", "fail", G + ["--dtype", "fp64"], names=("--dtype",)),
        # scenarios
        Case("sample: truncated config.json, rerun with seed 1", "fail", scenario=scenario_truncated_config),
        Case("sample: truncated PNG, rerun", "ok", scenario=scenario_truncated_png),
        Case("sample: two processes on one directory", "ok", scenario=scenario_two_samples),
        Case("generate: a killed run's temporaries", "ok", scenario=scenario_stale_temps),
        Case("demo: model allow-list", "ok", scenario=scenario_demo_allow_list),
        Case("demo: cfg inf / nan", "ok", scenario=scenario_demo_cfg_inf),
    ]
    return c + second_campaign(G, GE, T, S, PIPE)


def second_campaign(G: list, GE: list, T: list, S: list, PIPE: str) -> list[Case]:
    """Issue "nothing lost, nothing hangs": each case in the class the issue files it under."""
    B = ["bench", "--model", "random-tiny", "--methods", "ar", "--num", "1", "--no-cost-curve", "--metrics", "none"]
    MAR = ["generate", "--model", "emoji-mar", "--num", "3", "--out", "{out}"]
    loss = [Case("bench json: a user's JSON object", "fail", scenario=scenario_bench_json_not_a_report),
            Case("cli bench json a list", "fail", B + ["--json", "{list_json}"], names=("--json",)),
            Case("cli bench merge a list", "fail", ["bench", "--merge", "{mine_json}", "{list_json}", "--json",
                                                    "{out}.json"], names=("--merge",))]
    hangs = [Case("cli pjd window 100000", "ok", G + ["--method", "pjd", "--window", "100000"]),
             Case("cli pjd window 2**62", "ok", G + ["--method", "pjd", "--window", str(2**62)]),
             Case("cli pjd lag 2**62", "ok", G + ["--method", "pjd", "--lag", str(2**62)]),
             Case("cli zipar window 2**62", "ok", G + ["--method", "zipar", "--window", str(2**62)]),
             Case("api PJD(window=10**9) memory plan", "ok",
                  code=PIPE + "assert pipe.memory(1, sv.PJD(window=10**9)).fits"),
             Case("cli generate num 10**12", "fail", G[:3] + ["--num", str(10**12), "--out", "{out}"], names=("--num",),
                  timeout=60),
             Case("cli sample num 10**12", "fail", S + ["-n", str(10**12)], names=("--num",), timeout=60),
             Case("cli bench num 10**12", "fail", ["bench", "--model", "random-tiny", "--num", str(10**12)],
                  names=("--num",), timeout=60),
             Case("cli config.json FIFO", "fail", T[:2] + ["{config_fifo}"] + T[3:] + ["--prompt", "cat"],
                  names=("config.json", "regular file"), timeout=60),
             Case("cli prompts FIFO", "fail", ["sample", "--model", "emoji-t2i", "-n", "1", "--prompts", "{prompts_fifo}",
                                               "--out", "{out}"], names=("--prompts", "regular file"), timeout=60),
             Case("cli prompts /dev/zero", "fail", ["sample", "--model", "emoji-t2i", "-n", "1", "--prompts", "/dev/zero",
                                                    "--out", "{out}"], names=("--prompts", "regular file"), timeout=60),
             Case("cli SPECVIS_THREADS 10**9", "fail", G, names=("SPECVIS_THREADS",), env={"SPECVIS_THREADS": str(10**9)}),
             Case("api load threads=10**9", "fail", code="sv.load('random-tiny', threads=10**9)", names=("threads",)),
             Case("cli auto-repeats 10**6", "fail", G + ["--method", "auto", "--auto-repeats", str(10**6)],
                  names=("repeats",)),
             Case("cli eagle tree-top-k 10**9", "fail", G + ["--method", "eagle", "--tree-top-k", str(10**9)],
                  names=("--tree-top-k",)),
             Case("cli lantern-k 10**9", "fail", G + ["--method", "sjd", "--accept", "lantern", "--lantern-k", str(10**9)],
                  names=("k",))]
    tracebacks = [Case("cli emoji-mar batch-size 2", "fail", MAR + ["--batch-size", "2"], names=("batch_size",), timeout=300),
                  Case("api emoji-continuous method pjd", "fail", code="sv.load('emoji-continuous')([0], method='pjd')",
                       names=("method",)),
                  Case("api memory method='warp'", "fail", code=PIPE + "pipe.memory(1, method='warp')", names=("method",)),
                  Case("api memory method=3", "fail", code=PIPE + "pipe.memory(1, method=3)", names=("method",)),
                  Case("api memory sampling='x'", "fail", code=PIPE + "pipe.memory(1, sampling='x')", names=("sampling",)),
                  Case("api memory prompt_tokens=-1", "fail", code=PIPE + "pipe.memory(1, prompt_tokens=-1)",
                       names=("prompt_tokens",)),
                  Case("api progress=3", "fail", code=PIPE + "pipe([0], progress=3)", names=("progress",)),
                  Case("api generate(None)", "fail", code="sv.generate(None, [0])", names=("model",)),
                  Case("api Sampling(temperature=1e-40)", "fail", code="sv.Sampling(temperature=1e-40)",
                       names=("temperature",)),
                  Case("api Sampling(cfg_scale=1e30)", "fail", code="sv.Sampling(cfg_scale=1e30)", names=("cfg_scale",))]
    silent = [Case("cli class 3 99 num 1", "fail", ["generate", "--model", "emoji", "--class", "3", "99", "--num", "1",
                                                    "--out", "{out}"], names=("--class", "99")),
              Case("cli method ''", "fail", G + ["--method", ""], names=("--method",)),
              Case("cli out ''", "fail", G[:-1] + [""], names=("--out",)),
              Case("cli bench methods ''", "fail", ["bench", "--model", "random-tiny", "--methods", ""], names=("--methods",)),
              Case("cli bench methods ',,,'", "fail", ["bench", "--model", "random-tiny", "--methods", ",,,"],
                   names=("--methods",)),
              Case("cli NaN weights", "fail", T[:2] + ["{t2i_nan}"] + T[3:] + ["--prompt", "cat"], names=("NaN",)),
              Case("cli an int32 weight", "fail", T[:2] + ["{t2i_int32}"] + T[3:] + ["--prompt", "cat"], names=("int32",)),
              Case("api SJD(window=10**9) planned clamped", "ok",
                   code=PIPE + "assert pipe.memory(1, sv.SJD(window=10**9)).fits; pipe([0], method=sv.SJD(window=10**9))")]
    messages = [Case("cli md /", "fail", B + ["--md", "/"], names=("--md",)),
                Case("cli plots FILE", "fail", B + ["--plots", "{afile}"], names=("--plots",)),
                Case("cli bench json DIR", "fail", B + ["--json", "{adir}"], names=("--json",)),
                Case("cli demo host bogus.invalid", "fail", ["demo", "--host", "bogus.invalid"], names=("--host",)),
                Case("cli prompt 120000 characters", "fail", T + ["--prompt", "a" * 120_000], names=("--prompt",)),
                Case("cli safetensors header 2**62 bytes", "fail", T[:2] + ["{t2i_lying}"] + T[3:] + ["--prompt", "cat"],
                     names=("inconsistent",))]
    memory = [Case("api refill plan counts the prefix caches", "ok",
                   code=PIPE + "assert pipe.memory(2, refill=True).kv_bytes > pipe.memory(2).kv_bytes; "
                               "pipe([0, 1, 2], 'ar', batch_size=2)")]
    progress = [Case("cli generate --progress", "ok", G + ["--method", "ar", "--progress"]),
                Case("cli generate --quiet", "ok", G + ["--method", "ar", "--quiet"]),
                Case("cli progress and quiet", "fail", G + ["--progress", "--quiet"], names=("--quiet",)),
                Case("api progress=True", "ok", code=PIPE + "pipe([0], 'ar', progress=True)")]
    groups = (("data loss", loss), ("hangs", hangs), ("tracebacks", tracebacks), ("silent accepts", silent),
              ("messages", messages), ("memory", memory), ("progress", progress))
    return [dataclasses.replace(c, group=g) for g, cs in groups for c in cs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-k", dest="filter", help="run only the cases whose name contains one of these comma-separated "
                                             "strings (case-insensitive)")
    p.add_argument("-g", dest="groups", help="run only the cases of these comma-separated classes (e.g. hangs,"
                                              "\"data loss\"; --list shows each case's class)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--memory-gib", type=float, default=8.0, help="address-space cap of each case's process (GiB)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = p.parse_args(argv)
    keys = [k.strip().lower() for k in (a.filter or "").split(",") if k.strip()]
    groups = [g.strip() for g in (a.groups or "").split(",") if g.strip()]
    todo = [c for c in cases() if (not keys or any(k in c.name.lower() for k in keys))
            and (not groups or c.group in groups)]
    if a.list:
        for c in todo:
            print(f"{c.expect:4s}  {c.group:16s}  {c.name}")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="specvis-fuzz-"))
    work = Work(scratch, int(a.memory_gib * 2**30))
    make_fixtures(work)
    bad = []
    t0 = time.monotonic()
    print(f"{'case':52s} {'expect':6s} {'verdict':10s} {'exit':>4s} {'s':>6s}  first line")
    try:
        for c in todo:
            out = work.paths["out"]
            shutil.rmtree(out, ignore_errors=True)
            o = run_case(c, work)
            if o.verdict != "ok":
                bad.append((c, o))
            line = o.line if len(o.line) <= 150 else o.line[:147] + "..."
            print(f"{c.name[:52]:52s} {c.expect:6s} {o.verdict:10s} {str(o.rc):>4s} {o.seconds:6.1f}  {line}", flush=True)
    finally:
        if a.keep:
            print(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{len(todo)} cases in {time.monotonic() - t0:.0f} s: {len(todo) - len(bad)} as expected, {len(bad)} defects")
    for g in dict.fromkeys(c.group for c in todo):  # one line per class of input
        n = sum(c.group == g for c in todo)
        d = sum(c.group == g for c, _ in bad)
        print(f"  {g:16s} {n:4d} cases  {n - d:4d} as expected  {d:3d} defects")
    for c, o in bad:
        print(f"  DEFECT {o.verdict}: {c.name}: {o.line[:200]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
