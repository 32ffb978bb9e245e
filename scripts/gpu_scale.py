"""specvis at real scale on one GPU (issue 49): every measurement in one call, one JSON.

    PYTHONPATH=$PWD SPECVIS_COMMIT=<commit> python3 scripts/gpu_scale.py            # GPU: writes $OUT/gpu-scale-<gpu>.json
    python scripts/gpu_scale.py --smoke --out docs/results/gpu-scale-smoke.json     # CPU: same code paths, tiny shapes

What it measures, below; it runs bandwidth, the 7B shape, then ``SCHEDULE`` (the most valuable first; the
CUDA tests before the least predictable blocks, so that they always run), each section only if its
minimum time is left of ``--budget`` (``--tests-reserve`` of it kept for the tests); the JSON is rewritten
atomically after each section, so a call cut short still returns what it measured. bf16 throughout (on a CPU without bf16 dot products, fp32), CFG
on, captured rounds (CUDA graphs) unless a figure says eager.

1. ``bandwidth_gbps``: a device-to-device copy (bytes read + written over the median time).
2. ``shapes["7b"]``: a Chameleon-7B-shaped ``PromptDecoder`` (``CHAMELEON_7B``; random weights placed on the
   meta device and drawn on the GPU: ``build_on_device``) on Lumina-mGPT's 768-px grid (48 x 48 codes, a
   row end after each row). ``floor_ms`` = bytes of the weights a step reads / bandwidth; one AR step at
   batch 1, 4, 16; the cost curve c(k) of one forward over k tokens per row (k = 1 .. 65, batch 1 and 4)
   and c(k)/c(1); one SJD round (window 16 and 32) and one Speculative round (gamma 4) with a draft of
   Janus-Pro-1B's width and depth. Every figure is one round of the method itself (``RoundTimer``: its
   own round function, advanced to mid-stream, captured and replayed), median over replays; on random
   weights acceptance means nothing, so rounds are timed, not images.
3. ``emoji_t2i`` / ``emoji``: the shipped bundles (real acceptance) at batch 1 and 8, AR and every lossless
   method (``METHODS``) through ``specvis.bench.runner.run_bench`` (its cost curve gives ``efficiency``),
   in three modes: captured rounds (the headline), eager, captured + ``torch.compile`` (AR and SJD).
4. ``projection_lumina_768_s``: PROJECTED seconds of a 768-px Lumina-mGPT image (2,357 steps) from the
   measured 7B AR step, and for SJD from the 7B SJD round at the mean accepted length measured on
   emoji-t2i in the same run. A projection, labelled so.
5. ``vs_transformers``: transformers' own ``generate`` (image mode, SDPA) against specvis AR on the same
   random Janus-Pro-1B-shaped weights, batch 1 and 8, 64 image tokens: specvis images/s over transformers'.
   null, with the reason, where transformers is not installed.
6. ``cuda_tests``: ``pytest tests/test_cuda.py`` (graph vs eager laws of every method, exactness with graphs
   in fp32 and bf16; all skipped on CPU): counts and failing test ids.

Shapes (cited):
- Chameleon-7B: hidden 4096, 32 layers, 32 heads, FFN 11008, vocabulary 65536 (issue 49; the
  transformers Chameleon config of facebook/chameleon-7b), 8192 image codes (Chameleon's VQ), query/key
  norms as ``families.chameleon.build`` sets them.
- Janus-Pro-1B: the ``text_config`` of the transformers-format Janus-Pro-1B config as stored at
  https://huggingface.co/hf-internal-testing/tiny-processor-janus/blob/main/config.json (hidden 2048,
  24 layers, 16 heads and 16 KV heads, FFN 5632, vocabulary 102400, 16384 positions, RMS eps 1e-6, RoPE
  theta 10000; https://huggingface.co/pruna-test/tiny_janus/blob/main/config.json: the same with 1 layer).
  The generation path as DeepSeek's configs give it (stored copy of Janus-Pro-7B's:
  https://huggingface.co/cyan2k/Janus-Pro-7B-bnb-4bit/blob/main/config.json): ``gen_vision_config`` 16384
  codes of 8 dims, ``gen_aligner_config`` depth 2 from 8 dims onto the model width, ``gen_head_config``
  image_token_embed = n_embed = the model width (4096 there; 2048 here by the same rule).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import specvis as sv  # noqa: E402
from specvis.bench.report import dumps  # noqa: E402
from specvis.families import chameleon, janus  # noqa: E402
from specvis.families.hf import decoder_route  # noqa: E402
from specvis.models.loading import empty_parameters, stream_into  # noqa: E402
from specvis.families.hf import llama_config  # noqa: E402
from specvis.io import write_text  # noqa: E402
from specvis.methods.base import sync  # noqa: E402
from specvis.models.base import Condition, Layout, Prompts  # noqa: E402
from specvis.models.checkpoint import one_line  # noqa: E402
from specvis.models.decoder import MappedEmbedding, PromptDecoder  # noqa: E402

# ------------------------------------------------------------------ shapes
CHAMELEON_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                "intermediate_size": 11008, "vocab_size": 65536, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "max_position_embeddings": 4096}
CHAMELEON_CODES = 8192  # Chameleon's VQ codebook
JANUS_PRO_1B_TEXT = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                     "intermediate_size": 5632, "vocab_size": 102400, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                     "max_position_embeddings": 16384}
JANUS_PRO_1B_VQ = {"num_embeddings": 16384, "embed_dim": 8, "num_hidden_layers": 2, "hidden_act": "gelu"}
# the draft of the 7B Speculative round: Janus-Pro-1B's width and depth in the 7B's vocabulary and codes
DRAFT_1B = {**CHAMELEON_7B, **{k: JANUS_PRO_1B_TEXT[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                                  "num_key_value_heads", "intermediate_size")}}
LUMINA_GRID = 48  # Lumina-mGPT-7B-768: 48 x 48 codes, each row followed by a row-end token
LUMINA_768_STEPS = 2357  # steps of one 768-px Lumina-mGPT image (issue 49)

SMOKE_7B = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 128, "vocab_size": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 1024}
SMOKE_DRAFT = {**SMOKE_7B, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
               "intermediate_size": 64}
SMOKE_JANUS_TEXT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "intermediate_size": 128, "vocab_size": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                    "max_position_embeddings": 1024}
SMOKE_JANUS_VQ = {"num_embeddings": 64, "embed_dim": 8, "num_hidden_layers": 2, "hidden_act": "gelu"}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: the GPU's (``full``) or the CPU smoke run's (``smoke``): same code, other numbers."""

    smoke: bool
    target: dict
    draft: dict
    codes: int
    grid: int
    janus_text: dict
    janus_vq: dict
    copy_mib: int  # bandwidth test buffer
    warm: int  # rounds run before a round is timed
    reps: int  # timed rounds (graph replays)
    emoji_num: dict  # images per (mode, batch)
    t2i_grid: int | None  # emoji-t2i grid (None: native)
    janus_tokens: int = 64
    prompt_len: int = 32
    ar_batches: tuple = (1, 4, 16)
    cost_batches: tuple = (1, 4)
    cost_tokens: tuple = (1, 2, 5, 9, 17, 33, 65)
    sjd_windows: tuple = (16, 32)
    gamma: int = 4
    fill: float = 0.5  # stream fraction committed before a timed round: the mean context of an image
    hf_reps: int = 3
    warmup: str = "batch"  # run_bench's untimed warm-up
    curve_repeats: int = 5  # timed forwards per cost-curve point (forward_cost.cost_curve)
    curve_calls: tuple | None = None  # smoke: (untimed, timed) forwards per cost-curve round instead of forward_cost's
    emoji_model: str = "emoji"  # what stands in for the emoji bundle (smoke: random-tiny, 8 x 8 codes)


def plan_for(smoke: bool) -> Plan:
    if smoke:
        return Plan(smoke=True, target=SMOKE_7B, draft=SMOKE_DRAFT, codes=256, grid=16, janus_text=SMOKE_JANUS_TEXT,
                    janus_vq=SMOKE_JANUS_VQ, copy_mib=16, warm=1, reps=3, t2i_grid=4, hf_reps=1, warmup="none",
                    emoji_num={m: {1: 1, 8: 8} for m in ("graphs", "eager", "compile")},
                    curve_repeats=1, curve_calls=(1, 1), emoji_model="random-tiny")
    return Plan(smoke=False, target=CHAMELEON_7B, draft=DRAFT_1B, codes=CHAMELEON_CODES, grid=LUMINA_GRID,
                janus_text=JANUS_PRO_1B_TEXT, janus_vq=JANUS_PRO_1B_VQ, copy_mib=2048, t2i_grid=None,
                emoji_num={"graphs": {1: 8, 8: 16}, "eager": {1: 2, 8: 8}, "compile": {1: 2, 8: 8}},
                warm=2, reps=10, curve_repeats=3)


# ------------------------------------------------------------------ building on the device
def init_weights(model: nn.Module, generator: torch.Generator, std: float = 0.02) -> None:
    """Draw every parameter in place: Linear and Embedding weights ~ N(0, std^2), biases 0, every other
    weight (RMSNorm, per-head LayerNorm scales) 1 (transformers' Llama initialisation)."""
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if name == "bias":
                    p.zero_()
                elif isinstance(module, (nn.Linear, nn.Embedding)):
                    p.normal_(0.0, std, generator=generator)
                else:
                    p.fill_(1.0)


def build_on_device(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    """``factory()`` on the meta device (no storage anywhere), then storage on ``device`` in ``dtype`` and
    its values drawn there (``init_weights``): nothing of the model is made on the host or moved. The
    module must have no buffers (their values would be lost): make those on ``device`` afterwards."""
    with torch.device("meta"):
        model = factory()
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"build_on_device: {type(model).__name__} has buffers ({buffers[0]}, ...): make them after")
    model = model.to(dtype).to_empty(device=device)
    init_weights(model, torch.Generator(device=device).manual_seed(seed))
    return model.eval()


def chameleon_decoder(text: dict, codes: int, grid: int, device: torch.device, dtype: torch.dtype,
                      seed: int) -> PromptDecoder:
    """A Chameleon-family decoder as ``families.chameleon.build`` makes it (per-head query/key norms, image
    codes embedded through the text table, a head over the image rows) on the Lumina-mGPT layout (a row
    end after each row), with random weights; image code c is text id 4 + c, the row end 4 + codes."""
    cfg = llama_config(text, "chameleon shape")
    cfg.qk_norm = True
    layout = Layout(grid, grid, codes, row_end=1)
    model = build_on_device(lambda: PromptDecoder(cfg, layout, None, nn.Linear(cfg.dim, codes, bias=False)),
                            device, dtype, seed)
    model.image_embed = MappedEmbedding(model.tok_embeddings, torch.arange(4, 5 + codes, device=device))
    return model


def read_bytes(model: PromptDecoder) -> int:
    """Bytes of the weights one decoding step reads: every parameter but the text embedding table, of
    which a step gathers one row per fed token."""
    skip = model.tok_embeddings.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not skip)


def kv_bytes(model: PromptDecoder, rows: int, slots: int) -> int:
    """Bytes of keys and values a step attends over: ``rows`` rows of ``slots`` cached positions."""
    layers, heads, head_dim = model.cache_shape()
    return 2 * layers * heads * head_dim * rows * slots * next(model.parameters()).element_size()


# ------------------------------------------------------------------ timing rounds
@dataclass(frozen=True)
class ForwardOnly:
    """A "method" whose round is one target forward over ``tokens`` random codes per row (CFG rows
    included, the law computed, nothing committed): a point of the cost curve."""

    tokens: int
    name = "forward"
    lossless = True
    acceptance = None

    @property
    def pad(self) -> int:
        return self.tokens + 1

    def decode(self, ctx) -> None:
        ctx.target.prefill()
        codes = torch.randint(ctx.layout.vocab_size, (ctx.target.batch, self.tokens), device=ctx.device,
                              generator=ctx.generator)
        ctx.run(lambda: ctx.target.forward(codes, ctx.positions(ctx.n - 1, self.tokens)))


@dataclass
class RoundTimer:
    """Runs ``inner``'s own decode up to its round loop, then times its round function instead of
    finishing the image: the rows are set to ``fill`` of the stream committed (target and draft caches
    rolled to match, live-span bounds exact), ``warm`` rounds run, and then on CUDA with graphs on the
    round is captured once and replayed ``reps`` times between CUDA events (eager: ``reps`` calls between
    synchronised host clocks). ``result``: the median and every round's milliseconds."""

    inner: Any
    fill: float
    warm: int
    reps: int
    result: dict = field(default_factory=dict)
    name = "round-timer"
    lossless = True

    @property
    def pad(self) -> int:
        return self.inner.pad

    @property
    def acceptance(self):
        return getattr(self.inner, "acceptance", None)

    def decode(self, ctx) -> None:
        ctx.run = lambda round_fn, rounds=None, **_: self._time(ctx, round_fn)  # capture, refill: one row set here
        self.inner.decode(ctx)

    def _time(self, ctx, round_fn) -> None:
        dev = ctx.device
        start = max(1, int(self.fill * ctx.L))
        ctx.n.fill_(start)
        for view in (ctx.target, ctx.draft):
            if view is not None:
                view.set_committed(ctx.n - 1)  # the last committed token is the next round's input
        caches = ctx.live_caches()

        def settle() -> None:  # exact bounds, the done-check's work in a decode
            for c in caches:
                c.refresh(int(c.length.max()))

        settle()
        self.result["context_slots"] = int(ctx.target.model.cache.length.max())
        capture = bool(ctx.graphs) and dev.type == "cuda"
        side = torch.cuda.Stream(dev) if capture else None
        for _ in range(self.warm):
            if capture:  # warm-up off the capture stream, as methods/rounds.py does
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    round_fn()
                torch.cuda.current_stream(dev).wait_stream(side)
            else:
                round_fn()
            settle()
        times = []
        if capture:
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(ctx.generator)
            with torch.cuda.graph(graph):
                round_fn()
            graph.replay()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps + 1)]
            events[0].record()
            for e in events[1:]:
                graph.replay()
                e.record()
            torch.cuda.synchronize(dev)
            times = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
        else:
            for _ in range(self.reps):
                sync(dev)
                t0 = time.perf_counter()
                round_fn()
                sync(dev)
                times.append((time.perf_counter() - t0) * 1e3)
                settle()
        self.result.update(ms=statistics.median(times), ms_all=[round(t, 4) for t in times], captured=capture)
        ctx.n.fill_(ctx.L)  # every row done: the decode returns


def random_condition(model: PromptDecoder, batch: int, length: int, seed: int) -> Condition:
    """``batch`` random prompts of ``length`` text ids (above the image ids) and 3-token negative prompts
    (Lumina-mGPT's unconditional row: begin-image and the two size tokens), on the model's device."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.text_vocab_size
    low = model.layout.law_size + 8
    cond = torch.randint(low, vocab, (batch, length), generator=g).tolist()
    uncond = torch.randint(low, vocab, (1, 3), generator=g).tolist() * batch
    dev = next(model.parameters()).device
    return Condition(Prompts.of(cond, dev), Prompts.of(uncond, dev))


def time_rounds(model, method, batch: int, plan: Plan, graphs: bool, draft=None, seed: int = 0) -> dict:
    """One round of ``method`` at ``batch`` rows mid-stream (``RoundTimer``), Lumina-mGPT's sampling."""
    timer = RoundTimer(method, plan.fill, plan.warm, plan.reps)
    cond = random_condition(model, batch, plan.prompt_len, seed)
    # stream noise: RoundTimer wraps the method and has no acceptance rule for keyed noise to set
    sampling = sv.Sampling(**chameleon.LUMINA_SAMPLING, noise="stream")
    sv.generate(model, cond, timer, sampling, seed=seed, draft=draft, graphs=graphs)
    return timer.result


# ------------------------------------------------------------------ the report
class Run:
    """The report, its file, the clock and the device. ``section`` runs one measurement under a time
    budget (in this process, or in a child process: ``child``) and saves the report after it, recording
    its seconds, every warning it raised and, when it fails, its error in one line and its traceback."""

    def __init__(self, args, plan: Plan) -> None:
        self.args, self.plan = args, plan
        self.t0 = time.monotonic()
        self.device = torch.device("cuda" if torch.cuda.is_available() and not plan.smoke else "cpu")
        self.dtype = torch.bfloat16 if self.device.type == "cuda" or sv_cpu_bf16() else torch.float32
        self.report: dict[str, Any] = skeleton(self.device, self.dtype, plan)
        if args.resume:
            self.report = resumed(Path(args.resume), self.report)
        if args.child_report:  # a child process: the parent's report so far, written back to the same file
            self.report = json.loads(Path(args.child_report).read_text())
            self.path = Path(args.child_report)
        else:
            self.path = output_path(args.out, self.report["device_name"], plan.smoke)
        for key in ("warnings", "tracebacks", "errors", "plan"):
            self.report.setdefault(key, [])
        self.poisoned = False  # a CUDA error left this process unusable: later sections run in child processes

    def left(self) -> float:
        """Seconds left for measurements (the CUDA tests' reserve excluded)."""
        return self.args.budget - self.args.tests_reserve - (time.monotonic() - self.t0)

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.path, dumps(self.report) + "\n")

    def section(self, name: str, need_s: float, fn: Callable[[], None], reserve: bool = True,
                child: bool = False) -> None:
        log = self.report["sections"]
        if self.args.only and not any(name.startswith(o) for o in self.args.only):
            return
        left = self.left() + (0 if reserve else self.args.tests_reserve)
        if left < need_s:
            log[name] = {"status": "skipped", "reason": f"budget: {left:.0f} s left, needs ~{need_s:.0f} s"}
            self.save()
            return
        t = time.monotonic()
        print(f"[gpu_scale] {name} (expected ~{need_s:.0f} s, {left:.0f} s left) ...", flush=True)
        if (child or self.poisoned) and not self.args.child_report:
            self.in_child(name, left)
        else:
            self.in_process(name, fn)
        entry = self.report["sections"][name]  # the report itself is the child's after a child section
        entry["seconds"] = round(time.monotonic() - t, 1)
        print(f"[gpu_scale] {name}: {entry}", flush=True)
        if self.device.type == "cuda" and not self.poisoned:
            torch.cuda.empty_cache()
        self.save()

    def in_process(self, name: str, fn: Callable[[], None]) -> None:
        log = self.report["sections"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn()
                log[name] = {"status": "done"}
            except SectionSkipped as why:
                log[name] = {"status": "skipped", "reason": str(why)}
            except Exception as exc:  # noqa: BLE001 - one failed section must not lose the others
                log[name] = {"status": "error", "error": f"{type(exc).__name__}: {one_line(exc)}"}
                self.record_traceback(name)
                if not cuda_usable(self.device):
                    self.poisoned = True
                    log[name]["poisoned"] = "CUDA unusable after this error: later sections run in child processes"
        self.record_warnings(name, caught)

    def in_child(self, name: str, left: float) -> None:
        """``name`` in a child process (a sticky CUDA error or a crash there leaves this process whole): it
        reads this report, runs the section, writes the report back (after every figure, so a child that
        dies keeps what it measured); its output joins this one's."""
        self.save()
        fd, tmp = tempfile.mkstemp(prefix=f"gpu-scale-{name}-", suffix=".json")
        os.close(fd)
        write_text(Path(tmp), dumps(self.report) + "\n")
        cmd = [sys.executable, str(Path(__file__).resolve()), *(["--smoke"] if self.plan.smoke else []),
               "--child", name, "--child-report", tmp, "--budget", f"{left:.1f}", "--tests-reserve", "0"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        tail: list[str] = []
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def relay() -> None:
            for line in proc.stdout:
                print(f"  [{name}] {line}", end="", flush=True)
                tail.append(line.rstrip())
                del tail[:-40]

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            status = f"exit {proc.wait(timeout=left + 10)}"
        except subprocess.TimeoutExpired:
            proc.kill()
            status = f"killed after {left + 10:.0f} s"
            proc.wait()
        reader.join(timeout=10)
        try:
            self.report = json.loads(Path(tmp).read_text())
        except (OSError, ValueError) as exc:
            tail.append(f"child report unreadable: {one_line(exc)}")
        finally:
            Path(tmp).unlink(missing_ok=True)
        log = self.report["sections"]
        entry = log.get(name) if status == "exit 0" else None
        if entry is None:  # the child died before it recorded the section
            log[name] = {"status": "error", "error": f"child process {status}"}
            self.report["tracebacks"].append({"section": name, "text": "\n".join(tail)})
        log[name]["child"] = status

    def record_traceback(self, name: str) -> None:
        self.report["tracebacks"].append({"section": name, "text": "".join(traceback.format_exc()[-6000:])})

    def record_warnings(self, name: str, caught: list) -> None:
        """Every warning of a section into the report (the first 50); a CUDA graph capture that failed (the
        rounds then ran eagerly) marks the section's "graphs" figures as eager (``mark_eager``)."""
        failed = []
        for w in caught:
            msg = one_line(w.message)
            if len(self.report["warnings"]) < 50 * len(self.report["sections"]) + 50:
                self.report["warnings"].append({"section": name, "category": w.category.__name__, "message": msg,
                                                "where": f"{Path(w.filename).name}:{w.lineno}"})
            print(f"[gpu_scale] {name}: {w.category.__name__}: {msg}", flush=True)
            if CAPTURE_FAILED in msg:
                failed.append(msg)
        if failed:
            self.report["sections"][name]["capture_failed"] = len(failed)
            mark_eager(self.report, name, failed)

    def guarded(self, name: str, fn: Callable[[], None]) -> None:
        """``fn`` (bookkeeping between sections, e.g. the projection) with its error recorded, not raised."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self.report["errors"].append(f"{name}: {type(exc).__name__}: {one_line(exc)}")
            self.record_traceback(name)


class SectionSkipped(Exception):
    """A section that cannot run on this machine or tree (its reason is recorded; not an error)."""


CAPTURE_FAILED = "CUDA graph capture failed"  # specvis.methods.rounds' warning when a round runs eagerly instead


def mark_eager(report: dict, section: str, messages: list[str]) -> None:
    """A section whose rounds were meant to be captured but fell back to eager: its "graphs" figures say so
    (``captured`` false, the warnings kept), so that no eager figure reads as a captured one."""
    first = messages[0][:300]
    parts = section.split(":")
    if len(parts) == 3 and parts[1] == "graphs":
        entry = report[parts[0]][parts[2].removeprefix("b")]
        entry["by_mode"].setdefault("graphs", {}).update(captured=False, capture_failed=first)
        for r in entry["runs"]:
            if r["mode"] == "graphs":
                r["captured"] = False
        if entry.get("mode") == "graphs":
            entry["mode"] = "graphs (capture failed: eager)"
    elif section == "vs_transformers":
        report["vs_transformers"].setdefault("detail", {}).update(specvis_captured=False, capture_failed=first)


def cuda_usable(device: torch.device) -> bool:
    """False when a CUDA error is sticky (every later call fails): a synchronise and a small kernel fail."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def sv_cpu_bf16() -> bool:
    from specvis.cpu_features import native_dot_products

    return native_dot_products(torch.bfloat16) is True


def commit_id() -> str:
    """``SPECVIS_COMMIT`` (the device copy of the tree has no git), else ``git rev-parse HEAD`` (+ "-dirty")."""
    if os.environ.get("SPECVIS_COMMIT"):
        return os.environ["SPECVIS_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def skeleton(device: torch.device, dtype: torch.dtype, plan: Plan) -> dict:
    """Every key issue 49 pins, None until measured; batch sizes and token counts as strings."""
    from specvis.cpu_features import cpu_description

    try:
        import transformers
        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    batch = {"ar_img_s": None, "best_lossless_speedup": None, "best_lossless": None, "min_speedup": None,
             "mode": None, "by_mode": {}, "runs": []}
    return {
        "kind": "gpu-scale",
        "smoke": plan.smoke,
        "note": ("SMOKE RUN on CPU with tiny shapes: checks the code paths and the JSON's structure; its figures "
                 "are not GPU results" if plan.smoke else "measured on the GPU named below; see scripts/gpu_scale.py"),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit_id(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": hf_version,
        "dtype": str(dtype).removeprefix("torch."),
        "bandwidth_gbps": None,
        "shapes": {"7b": {"floor_ms": None, "ar_step_ms": {str(b): None for b in plan.ar_batches},
                          "cost_ms": {str(b): {str(k): None for k in plan.cost_tokens} for b in plan.cost_batches},
                          "sjd_round_ms": {str(w): None for w in plan.sjd_windows}, "spec_round_ms": None}},
        "vs_transformers": {"1": None, "8": None, "transformers_patched": None},
        "emoji": {"1": json.loads(json.dumps(batch)), "8": json.loads(json.dumps(batch))},
        "emoji_t2i": {"1": json.loads(json.dumps(batch)), "8": json.loads(json.dumps(batch))},
        "projection_lumina_768_s": {"ar": None, "sjd": None,
                                    "note": f"PROJECTION, not a measurement: {LUMINA_768_STEPS} steps x the measured 7B-shape "
                                            "AR step (batch 1); SJD: the steps over the mean accepted length of SJD window 16 "
                                            "measured on emoji-t2i (batch 1, captured rounds) x the measured 7B SJD round"},
        "cuda_tests": None,
        "serve": None,
        "seeds": None,
        "plan": [],
        "sections": {},
        "warnings": [],
        "tracebacks": [],
        "errors": [],
    }


def resumed(path: Path, fresh: dict) -> dict:
    """An earlier report of this script (``--resume``: a later call adds sections to it), checked to be of
    the same kind of run on the same device and software; this call's date and commit join ``calls``."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--resume {path}: unreadable ({one_line(exc)})") from None
    for key in ("kind", "smoke", "device_name", "torch", "dtype"):
        if old.get(key) != fresh[key]:
            raise SystemExit(f"--resume {path}: its {key} is {old.get(key)!r}, this run's {fresh[key]!r}")
    calls = old.get("calls") or [{"date": old["date"], "commit": old["commit"]}]
    old["calls"] = [*calls, {"date": fresh["date"], "commit": fresh["commit"]}]
    return old


def gpu_slug(name: str) -> str:
    m = re.search(r"(gh200|h200|h100|b200|a100|l40s|l4|a10g?)", name.lower())
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def output_path(out: str | None, device_name: str, smoke: bool) -> Path:
    """``--out`` (a .json file, or a folder), else ``$OUT``, else the working folder; the file is
    gpu-scale-<gpu>.json (gpu-scale-smoke.json for a smoke run)."""
    target = out or os.environ.get("OUT") or "."
    if target.endswith(".json"):
        return Path(target)
    return Path(target) / f"gpu-scale-{'smoke' if smoke else gpu_slug(device_name)}.json"


# ------------------------------------------------------------------ sections
def bandwidth(run: Run) -> None:
    """Achievable bandwidth: copy a ``copy_mib`` buffer onto another, bytes read + written over the median."""
    n = run.plan.copy_mib * 2 ** 20
    src = torch.empty(n, dtype=torch.uint8, device=run.device).random_(0, 256)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), run.device, reps=10, warm=3)
    run.report["bandwidth_gbps"] = 2 * n / (ms / 1e3) / 1e9
    run.report["bandwidth_detail"] = {"buffer_mib": run.plan.copy_mib, "median_ms": ms, "repeats": 10}


def median_ms(fn: Callable[[], Any], device: torch.device, reps: int, warm: int) -> float:
    """Median milliseconds of ``fn`` after ``warm`` untimed calls: CUDA events around each call on a
    GPU, a synchronised host clock elsewhere."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize(device)
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def shape_7b(run: Run) -> None:
    plan, dev, dt = run.plan, run.device, run.dtype
    out = run.report["shapes"]["7b"]
    graphs = dev.type == "cuda"
    target = chameleon_decoder(plan.target, plan.codes, plan.grid, dev, dt, seed=1)
    bw = run.report["bandwidth_gbps"]
    rb = read_bytes(target)
    params = sum(p.numel() for p in target.parameters())
    out.update(config={**plan.target, "image_codes": plan.codes, "grid": [plan.grid, plan.grid], "row_end": 1,
                       "qk_norm": True}, params=params, read_bytes=rb, fill=plan.fill,
               sampling=dict(chameleon.LUMINA_SAMPLING), captured_rounds=graphs)
    if bw:
        out["floor_ms"] = rb / (bw * 1e9) * 1e3
    run.save()

    def measure(method, batch: int, draft=None, eager: bool = False) -> float | None:
        what = f"{type(method).__name__} batch {batch}{' eager' if eager else ''}"
        if run.left() < 5:
            out.setdefault("skipped", []).append(f"{what}: budget")
            return None
        try:
            res = time_rounds(target, method, batch, plan, graphs and not eager, draft=draft)
        except (RuntimeError, ValueError) as exc:  # e.g. out of memory at batch 16: the other figures go on
            out.setdefault("errors", []).append(f"{what}: {type(exc).__name__}: {one_line(exc)}")
            run.record_traceback(f"7b: {what}")
            if not cuda_usable(dev):  # a sticky CUDA error: no later figure of this process can be measured
                raise
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            return None
        out["context_slots"] = res["context_slots"]
        return res["ms"]

    for b in plan.ar_batches:
        out["ar_step_ms"][str(b)] = measure(sv.AR(), b)
        run.save()
    out["ar_step_eager_ms"] = {"1": measure(sv.AR(), 1, eager=True)}
    if bw and out.get("context_slots"):
        ctx = out["context_slots"]
        out["floor_with_kv_ms"] = {str(b): (rb + kv_bytes(target, 2 * b, ctx)) / (bw * 1e9) * 1e3 for b in plan.ar_batches}
        out["ar_step_over_floor"] = {str(b): v / out["floor_ms"] for b, v in
                                     ((b, out["ar_step_ms"][str(b)]) for b in plan.ar_batches) if v}
    for b in plan.cost_batches:
        for k in plan.cost_tokens:
            out["cost_ms"][str(b)][str(k)] = measure(ForwardOnly(k), b)
        run.save()
    out["cost_ratio"] = {b: {k: v / row["1"] for k, v in row.items() if v and row.get("1")}
                         for b, row in out["cost_ms"].items()}
    for w in plan.sjd_windows:
        out["sjd_round_ms"][str(w)] = measure(sv.SJD(window=w, init="vertical-sample"), 1)
    out["sjd_config"] = {"init": "vertical-sample", "coupling": sv.SJD().coupling, "batch": 1}
    run.save()
    draft = chameleon_decoder(plan.draft, plan.codes, plan.grid, dev, dt, seed=2)
    run.report["shapes"]["1b_draft"] = {"config": plan.draft, "params": sum(p.numel() for p in draft.parameters()),
                                        "read_bytes": read_bytes(draft),
                                        "floor_ms": read_bytes(draft) / (bw * 1e9) * 1e3 if bw else None}
    out["spec_round_ms"] = measure(sv.Speculative(gamma=plan.gamma), 1, draft=draft)
    out["spec_config"] = {"gamma": plan.gamma, "batch": 1, "draft": "1b_draft"}


METHODS = {  # the lossless methods of issue 49, one configuration each (the ones the CPU benchmarks ran)
    "emoji": ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel", "speculative:gamma=2", "static-tree:tree=chain",
              "eagle:depth=5:top_k=8:total_tokens=24", "adt:init=horizontal:total_tokens=24"],
    "emoji-t2i": ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel", "speculative:gamma=2", "static-tree:tree=chain",
                  "eagle:depth=5:top_k=8:total_tokens=12", "adt:init=horizontal:total_tokens=12"],
}
COMPILE_METHODS = 2  # captured + compile: AR and SJD only (every new block size and live span is a compile)
T2I_PROMPT_IDS = ROOT / "docs" / "results" / "data" / "emoji-t2i-prompt-ids.json"
MODES = ("graphs", "eager", "compile")
RUN_FIELDS = ("method", "config", "acceptance", "lossless", "n_images", "wall_s", "images_per_s", "speedup",
              "mean_accepted_length", "target_forwards", "draft_forwards", "predicted_speedup", "efficiency")


def summarise(runs: list[dict]) -> dict:
    """AR's images/s, and over the lossless methods other than AR: the best speedup (and which) and the
    lowest."""
    ar = next(r for r in runs if r["method"] == "ar")
    others = [r for r in runs if r["method"] != "ar" and r["lossless"]]
    best = max(others, key=lambda r: r["speedup"], default=None)
    return {"ar_img_s": ar["images_per_s"],
            "best_lossless_speedup": best["speedup"] if best else None,
            "best_lossless": f"{best['method']} {json.dumps(best['config'], sort_keys=True)}" if best else None,
            "min_speedup": min((r["speedup"] for r in others), default=None)}


def bench_block(run: Run, bundle: str, batch: int, mode: str) -> None:
    """One bundle, batch size and mode through ``run_bench`` (AR first, passes interleaved per batch,
    warm-up excluded), then the forward cost curve of the block sizes the runs used, measured once
    (``runner.measure_cost_curve``) and every run's ``efficiency`` from it (``report.set_speedups``):
    not under compile, where every new shape is a compile. The runs join ``report[bundle][batch]["runs"]``
    and their summary ``by_mode[mode]``."""
    from specvis.bench.report import set_speedups
    from specvis.bench.runner import Bench, measure_cost_curve, run_bench
    from specvis.job import Job

    plan = run.plan
    model = plan.emoji_model if bundle == "emoji" else bundle
    pipe = sv.load(model, run.device, dtype=run.dtype, compile=mode == "compile", graphs=mode != "eager")
    specs = METHODS[bundle][:COMPILE_METHODS] if mode == "compile" else METHODS[bundle]
    prompts = t2i_prompts() if bundle == "emoji-t2i" else None
    grid = dict(prompts=tuple(prompts), height=plan.t2i_grid, width=plan.t2i_grid) if prompts else {}
    num = plan.emoji_num[mode][batch]
    rep = run_bench(pipe, Job(num=num, batch_size=batch, seed=777, **grid),
                    Bench(specs=tuple(specs), repeats=1, metrics=(), warmup=plan.warmup), progress=False)
    if mode != "compile":  # one cost curve per bundle and batch, measured by its first block, reused after
        curves = run.report.setdefault("cost_curves", {})
        key = f"{bundle}:b{batch}"
        with cost_curve_calls(plan.curve_calls):
            rep["cost_curve"] = measure_cost_curve(pipe, rep, pipe.default_sampling, prompts, rep["runs"],
                                                   previous=curves.get(key), repeats=plan.curve_repeats)
        curves[key] = rep["cost_curve"]
        set_speedups(rep)
    runs = [{"mode": mode, **{k: r.get(k) for k in RUN_FIELDS}} for r in rep["runs"]]
    entry = run.report[bundle.replace("-", "_")][str(batch)]
    entry["runs"] = [r for r in entry["runs"] if r["mode"] != mode] + runs
    entry["by_mode"][mode] = {**summarise(runs), "model": model, "n_images": num, "seed": 777,
                              "grid": [pipe.target.layout.height, pipe.target.layout.width]}
    headline = "graphs" if run.device.type == "cuda" else "eager"  # captured rounds exist on CUDA only
    if mode == headline:
        entry.update(summarise(runs), mode=mode)


@contextmanager
def cost_curve_calls(calls: tuple | None):
    """With ``calls`` = (untimed, timed) (smoke runs only): that many forwards per cost-curve round in
    place of ``cost.WARM_CALLS`` and ``TIMED_CALLS`` (``specvis.cost``, which times them), restored after."""
    from specvis import cost as forward_cost

    saved = forward_cost.WARM_CALLS, forward_cost.TIMED_CALLS
    if calls is not None:
        forward_cost.WARM_CALLS, forward_cost.TIMED_CALLS = calls
    try:
        yield
    finally:
        forward_cost.WARM_CALLS, forward_cost.TIMED_CALLS = saved


def t2i_prompts() -> list[list[int]]:
    """The 64 emoji-t2i benchmark prompts (docs/results/data/emoji-t2i-prompts.txt) as the bundle's
    processor encodes them, committed (the device machine needs no tokenizer; a test checks them)."""
    return json.loads(T2I_PROMPT_IDS.read_text())["ids"]


def projection(run: Run) -> None:
    """``projection_lumina_768_s`` from what this run measured (None where a figure is missing)."""
    proj = run.report["projection_lumina_768_s"]
    b7 = run.report["shapes"]["7b"]
    step = b7["ar_step_ms"].get("1")
    proj["ar"] = LUMINA_768_STEPS * step / 1e3 if step else None
    t2i = run.report["emoji_t2i"]["1"]
    sjd = [r for r in t2i["runs"] if r["mode"] == t2i.get("mode") and r["method"] == "sjd"]
    rnd = b7["sjd_round_ms"].get("16")
    if sjd and rnd:
        mal = sjd[0]["mean_accepted_length"]
        proj["sjd"] = LUMINA_768_STEPS / mal * rnd / 1e3
        proj["sjd_mean_accepted_length"] = mal


def hf_janus(plan: Plan, device: torch.device, dtype: torch.dtype, ids: dict):
    """transformers' JanusForConditionalGeneration of the Janus-Pro-1B shape (smoke: tiny), made on
    ``device`` by its own initialisation, generating ``plan.janus_tokens`` image tokens (the vision tower,
    unused in image generation, sized for that many patches)."""
    from transformers import (JanusConfig, JanusForConditionalGeneration, JanusVisionConfig, JanusVQVAEConfig,
                              LlamaConfig)

    t = plan.janus_text
    side = math.isqrt(plan.janus_tokens)
    rope = {"rope_type": "default", "rope_theta": t["rope_theta"]}
    text = LlamaConfig(**{k: v for k, v in t.items() if k != "rope_theta"}, rope_parameters=rope,
                       bos_token_id=ids["bos"], pad_token_id=ids["pad"], eos_token_id=ids["bos"] + 1)
    vision = JanusVisionConfig(image_size=16 * side, patch_size=16, num_image_tokens=plan.janus_tokens,
                               projection_dim=t["hidden_size"],
                               **({"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2} if plan.smoke else {}))
    vq = JanusVQVAEConfig(**plan.janus_vq, projection_dim=t["hidden_size"], image_token_embed_dim=t["hidden_size"],
                          **({"base_channels": 32, "channel_multiplier": [1, 1, 2], "latent_channels": 32,
                              "num_res_blocks": 1} if plan.smoke else {}))
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        torch.manual_seed(0)
        model = JanusForConditionalGeneration(config)
    model = model.to(dtype).eval()
    gc = model.generation_config
    gc.bos_token_id, gc.pad_token_id = ids["bos"], ids["pad"]
    gc.generation_kwargs = {"boi_token_id": ids["boi"]}
    return model


JANUS_CACHE_FIXED = "5.23.0"  # the first version known to pass prefill_chunk_size from Janus's generate (the pin)


def janus_generate_shim(model, version: str) -> dict | None:
    """transformers before ``JANUS_CACHE_FIXED`` (5.17.0 is the device's): ``JanusForConditionalGeneration.
    generate`` calls ``GenerationMixin._prepare_static_cache`` without its required ``prefill_chunk_size``
    and fails with a TypeError. On those versions this model's own ``_prepare_static_cache`` (an instance
    attribute; the class and other models untouched) passes ``generation_config.prefill_chunk_size`` (None
    unless set: no chunked prefill), what the fixed Janus passes. Returns what was patched (the report's
    ``transformers_patched``), or None where nothing was."""
    from packaging.version import Version

    if Version(version) >= Version(JANUS_CACHE_FIXED):
        return None
    original = model._prepare_static_cache

    def prepare_static_cache(cache_implementation, batch_size, max_cache_len, model_kwargs, prefill_chunk_size=None):
        chunk = model.generation_config.prefill_chunk_size if prefill_chunk_size is None else prefill_chunk_size
        return original(cache_implementation=cache_implementation, batch_size=batch_size, max_cache_len=max_cache_len,
                        prefill_chunk_size=chunk, model_kwargs=model_kwargs)

    model._prepare_static_cache = prepare_static_cache
    return {"transformers": version, "what": "JanusForConditionalGeneration._prepare_static_cache on this model: "
            "passes generation_config.prefill_chunk_size, which Janus's generate omits before " + JANUS_CACHE_FIXED,
            "prefill_chunk_size": model.generation_config.prefill_chunk_size}


def specvis_janus(hf, ids: dict, side: int) -> PromptDecoder:
    """specvis's Janus decoder (``families.janus.make_decoder`` on the transformers config, built on meta)
    filled with the transformers model's weights through the route ``families.janus`` reads a
    checkpoint with (its renames, the Llama layers' q/k interleave)."""
    config = hf.config.to_dict()
    dev, dt = next(hf.parameters()).device, next(hf.parameters()).dtype
    with empty_parameters():
        model = janus.make_decoder(config, ids, "janus-pro-1b shape", side, side)
    sd = hf.state_dict()  # live tensors: streamed as they are (no page dropping, unlike a mapped file)
    stream_into(model, list(sd), lambda wanted, kept: ((k, v) for k, v in sd.items() if wanted(k)),
                decoder_route(janus.RENAMES, janus.KEEP, model.config), dt, dev, "transformers Janus")
    return model.eval()


def vs_transformers(run: Run) -> None:
    out = run.report["vs_transformers"]
    try:
        import transformers  # noqa: F401
    except ImportError:
        out["reason"] = "transformers is not installed on this machine: not measured"
        return
    plan, dev = run.plan, run.device
    vocab = plan.janus_text["vocab_size"]
    ids = {"bos": vocab - 400, "pad": vocab - 398, "boi": vocab - 384}  # arbitrary ids (random weights)
    hf = hf_janus(plan, dev, run.dtype, ids)
    out["transformers_patched"] = janus_generate_shim(hf, transformers.__version__)
    side = math.isqrt(plan.janus_tokens)
    model = specvis_janus(hf, ids, side)
    sampling = sv.Sampling(cfg_scale=5.0, temperature=1.0, noise="stream")  # Janus-Pro's official settings
    g = torch.Generator().manual_seed(0)
    detail = {"config": {**plan.janus_text, **plan.janus_vq}, "image_tokens": plan.janus_tokens,
              "prompt_tokens": plan.prompt_len, "sampling": {"cfg_scale": 5.0, "temperature": 1.0, "top_k": None},
              "attn_implementation": getattr(hf.config.text_config, "_attn_implementation", None),
              "transformers": transformers.__version__, "images_per_s": {}, "seconds": {}}
    with torch.inference_mode():
        for batch in (1, 8):
            body = torch.randint(0, ids["bos"], (batch, plan.prompt_len - 2), generator=g)
            prompt = torch.cat([torch.full((batch, 1), ids["bos"]), body, torch.full((batch, 1), ids["boi"])], 1).to(dev)
            if batch == 1:  # the same weights: both models' logits for the first image token
                detail["first_logits_max_abs_diff"] = first_logits_diff(hf, model, prompt)
            mask = torch.ones_like(prompt)

            def hf_call():
                return hf_generate(hf, prompt, mask)

            def sv_call():
                return sv.generate(model, Prompts.of(prompt.tolist(), dev), sv.AR(), sampling, seed=0,
                                   graphs=dev.type == "cuda")

            t_hf = median_wall(hf_call, dev, plan.hf_reps)
            t_sv = median_wall(sv_call, dev, plan.hf_reps)
            out[str(batch)] = t_hf / t_sv  # specvis images/s over transformers'
            detail["images_per_s"][str(batch)] = {"transformers": batch / t_hf, "specvis": batch / t_sv}
            detail["seconds"][str(batch)] = {"transformers": t_hf, "specvis": t_sv}
            out["detail"] = detail
            run.save()


def hf_generate(hf, prompt: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """transformers' Janus ``generate`` in image mode: CFG 5, temperature 1, no top-k / top-p."""
    return hf.generate(input_ids=prompt, attention_mask=mask, generation_mode="image", do_sample=True,
                       guidance_scale=5.0, temperature=1.0, top_k=0, top_p=1.0)


def first_logits_diff(hf, model: PromptDecoder, prompt: torch.Tensor) -> float:
    """max |logit difference| of the first image token's generation-head logits (conditional row)."""
    h = hf.model.language_model(inputs_embeds=hf.get_input_embeddings()(prompt)).last_hidden_state
    ref = hf.model.generation_head(h[:, -1]).float()
    model.setup_cache(prompt.shape[0], 1)
    ours, _ = model.prefill(Prompts.of(prompt.tolist(), prompt.device))
    return float((ours.float() - ref).abs().max())


def median_wall(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median seconds of ``reps`` synchronised calls after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_tests(run: Run, timeout: float) -> None:
    """``pytest tests/test_cuda.py -v`` in a child process: counts by outcome and the failing test ids
    (parsed from its per-test lines, so a run stopped at ``timeout`` still counts what it finished)."""
    cmd = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-v", "-p", "no:cacheprovider", "-o", "addopts="]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
        text, status = proc.stdout + proc.stderr, f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status = f"stopped after {timeout:.0f} s"
    if "No module named pytest" in text:
        status = "pytest is not installed on this machine"
    run.report["cuda_tests"] = {"command": "python -m pytest tests/test_cuda.py -v", "status": status,
                                **pytest_outcomes(text), "seconds": round(time.monotonic() - t, 1),
                                "tail": text.strip().splitlines()[-1:] if text.strip() else []}


def pytest_outcomes(text: str) -> dict:
    """Counts of ``pytest -v`` per-test lines by outcome, and the ids of the failed or erroring tests."""
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
    failing = []
    for m in re.finditer(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M):
        counts[m.group(2).lower()] += 1
        if m.group(2) in ("FAILED", "ERROR"):
            failing.append(m.group(1))
    return {**counts, "failing": failing}


# ------------------------------------------------------------------ hooks: the server and keyed noise
SMOKE_HOOK_S = 300.0  # a hook's limit in the CPU smoke (its arguments there take seconds)
HOOKS = {  # section: (script, its arguments on the device, the smoke's smaller ones, modules it needs); {out}: the hook's folder
    "serve": ("scripts/bench_serve.py",
              ["--device", "cuda", "--in-process", "--models", "emoji-t2i", "--modes", "auto", "ar", "sjd", "--clients",
               "1", "8", "--rates", "4", "--requests", "16", "--limit-s", "30", "--one-images", "4",
               "--out", "{out}/serve.json"],
              ["--device", "cpu", "--in-process", "--models", "emoji-t2i", "--modes", "ar", "--clients", "1", "--rates",
               "2", "--requests", "2", "--limit-s", "20", "--one-images", "1", "--out", "{out}/serve.json"],
              ("prometheus_client",)),
    "seeds": ("scripts/bench_seeds.py",
              ["--device", "cuda", "--models", "emoji-t2i", "--parts", "cost,bf16", "--cost-repeats", "3", "--num", "16",
               "--out", "{out}/seeds.json"],
              ["--device", "cpu", "--models", "emoji-t2i", "--parts", "cost", "--cost-repeats", "1",
               "--out", "{out}/seeds.json"],
              ()),
}


def hook(run: Run, name: str, timeout: float) -> None:
    """``HOOKS[name]``'s script (the server benchmark, the keyed-noise cost per round) as a child process
    with ``OUT`` set to a folder of its own, where it exists; the report keeps its command, exit status,
    output tail and every JSON it wrote (the device has no FastAPI / uvicorn: the script must drive the
    engine in process). Extra arguments: ``GPU_SCALE_<NAME>_ARGS`` (whitespace-separated)."""
    script, args, smoke_args, modules = HOOKS[name]
    extra = os.environ.get(f"GPU_SCALE_{name.upper()}_ARGS")
    args = extra.split() if extra is not None else smoke_args if run.plan.smoke else args
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not (ROOT / script).exists() or missing:
        reason = f"{script} is not in this tree" if missing == [] else f"{script} needs {', '.join(missing)}, not installed here"
        run.report[name] = {"status": "skipped", "reason": reason}
        raise SectionSkipped(reason)
    with tempfile.TemporaryDirectory(prefix=f"gpu-scale-{name}-") as out:
        cmd = [sys.executable, script, *(a.replace("{out}", out) for a in args)]
        env = {**os.environ, "OUT": out, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
            text, status = proc.stdout + proc.stderr, f"exit {proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            status = f"stopped after {timeout:.0f} s"
        results = {}
        for f in sorted(Path(out).rglob("*.json"))[:8]:
            try:
                results[str(f.relative_to(out))] = json.loads(f.read_text())
            except ValueError as exc:
                results[str(f.relative_to(out))] = f"unreadable: {one_line(exc)}"
    run.report[name] = {"command": " ".join(cmd), "status": status, "tail": text.strip().splitlines()[-15:],
                        "results": results}
    if status != "exit 0":
        raise RuntimeError(f"{script} {status}: {(text.strip().splitlines() or [''])[-1][:300]}")


# ------------------------------------------------------------------ the plan
# Expected seconds of each section on an H200 (bf16), from the H100 run of the emoji bundle
# (docs/results/data/emoji-h100-*.json: 9 runs of 16 images at batch 1 took 65 s captured) scaled to this
# plan's methods and images, plus start-up; the 7B section includes its child process's start and building
# 8B random parameters on the device. A section runs only if its expected time is left; the report keeps
# each expected and measured time (``plan``, ``sections``), so that the next call can correct these.
EXPECTED_S = {"bandwidth": 3, "7b": 75, "graphs:b1": 45, "graphs:b8": 30, "vs_transformers": 30, "serve": 60,
              "seeds": 45, "compile:b1": 90, "compile:b8": 90, "eager:b1": 60, "eager:b8": 40}
BUNDLES = ("emoji-t2i", "emoji")


def schedule(cuda: bool) -> list[tuple[str, float]]:
    """Sections by value, each with its expected seconds: the 7B floor and c(k); the bundles at batch 1 and 8
    with captured rounds (on a CPU: eager, the only mode there); transformers; the CUDA tests; the server and
    keyed-noise hooks; then with what is left, captured + compile, and eager at batch 1 (CUDA only)."""
    head = "graphs" if cuda else "eager"
    items = [("bandwidth", EXPECTED_S["bandwidth"]), ("7b", EXPECTED_S["7b"])]
    items += [(f"{b.replace('-', '_')}:{head}:b{n}", EXPECTED_S[f"{head}:b{n}"]) for n in (1, 8) for b in BUNDLES]
    items += [("vs_transformers", EXPECTED_S["vs_transformers"]), ("cuda_tests", 0),
              ("serve", EXPECTED_S["serve"]), ("seeds", EXPECTED_S["seeds"])]
    items += [(f"{b.replace('-', '_')}:compile:b{n}", EXPECTED_S[f"compile:b{n}"]) for n in (1, 8) for b in BUNDLES]
    if cuda:
        items += [(f"{b.replace('-', '_')}:eager:b1", EXPECTED_S["eager:b1"]) for b in BUNDLES]
    return items


def section_call(run: Run, name: str, args) -> Callable[[], None]:
    """The function that measures section ``name``."""
    if name == "bandwidth":
        return lambda: bandwidth(run)
    if name == "7b":
        return lambda: shape_7b(run)
    if name == "vs_transformers":
        return lambda: vs_transformers(run)
    if name == "cuda_tests":
        return lambda: cuda_tests(run, max(args.budget - (time.monotonic() - run.t0), 30.0))
    if name in HOOKS:
        # the CPU smoke runs the hooks' tiny arguments on a machine that may be busy: its limit only stops a hang
        limit = SMOKE_HOOK_S if run.plan.smoke else max(min(run.left() + args.tests_reserve, 2 * EXPECTED_S[name]), 10.0)
        return lambda: hook(run, name, limit)
    bundle, mode, batch = name.split(":")
    return lambda: bench_block(run, bundle.replace("_", "-"), int(batch.removeprefix("b")), mode)


def print_plan(run: Run, items: list[tuple[str, float]], scale: float) -> None:
    args = run.args
    run.report["plan"] = [{"section": n, "expected_s": round(e * scale, 1)} for n, e in items]
    print(f"[gpu_scale] plan: budget {args.budget:.0f} s, {args.tests_reserve:.0f} s of it kept for the CUDA tests "
          "(expected seconds; a section runs only if they are left)", flush=True)
    total = 0.0
    for n, e in items:
        total += e * scale if n != "cuda_tests" else args.tests_reserve
        print(f"[gpu_scale]   {n:<26} ~{e * scale if n != 'cuda_tests' else args.tests_reserve:5.0f} s   "
              f"(cumulative {total:5.0f} s)", flush=True)


class Tee:
    """A text stream that writes to ``stream`` and to ``file`` (the log that comes back in ``$OUT``)."""

    def __init__(self, stream, file) -> None:
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, seconds: the code paths and the JSON's structure")
    ap.add_argument("--out", help="a .json file or a folder (default $OUT, else .)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run, 10..3600 (default 420 on a GPU: one 8-minute call with room to start)")
    ap.add_argument("--tests-reserve", type=float, default=None,
                    help="seconds kept for the CUDA tests, 0..600 (default 100)")
    ap.add_argument("--no-tests", action="store_true", help="skip tests/test_cuda.py")
    ap.add_argument("--resume", help="an earlier gpu-scale JSON of the same device: add this call's sections to it")
    ap.add_argument("--only", nargs="*", help="run only the sections whose name starts with one of these "
                                              "(bandwidth, 7b, emoji, emoji_t2i, vs_transformers, cuda_tests, serve, seeds)")
    ap.add_argument("--log", help="also write the output here (default $OUT/<the JSON's name>.log where $OUT is set)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: run this one section (Run.in_child)
    ap.add_argument("--child-report", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.budget = args.budget if args.budget is not None else (600.0 if args.smoke else 420.0)
    args.tests_reserve = 0.0 if args.no_tests else (args.tests_reserve if args.tests_reserve is not None
                                                     else 20.0 if args.smoke else 100.0)
    if not 10 <= args.budget <= 3600:
        ap.error(f"--budget must be within 10..3600 seconds, got {args.budget:g}")
    if not 0 <= args.tests_reserve <= 600:
        ap.error(f"--tests-reserve must be within 0..600 seconds, got {args.tests_reserve:g}")
    plan = plan_for(args.smoke)
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --smoke on a CPU")
    run = Run(args, plan)
    scale = 0.1 if plan.smoke else 1.0
    if args.child:  # one section, this process's result written back to the parent's report file
        faulthandler.dump_traceback_later(max(args.budget, 5), exit=True)
        run.section(args.child, 0, section_call(run, args.child, args))
        return run.path
    log_path = args.log or (str(Path(os.environ["OUT"]) / (run.path.stem + ".log")) if os.environ.get("OUT") else None)
    log = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115 - open for the whole run
    if log:
        sys.stdout, sys.stderr = Tee(sys.__stdout__, log), Tee(sys.__stderr__, log)
    # watchdog: a hang prints every thread's stack (into the log) and ends the run; the JSON holds what was measured
    faulthandler.dump_traceback_later(args.budget + 30, exit=True, file=log or sys.__stderr__)
    print(f"[gpu_scale] {run.report['device_name']}, torch {torch.__version__}, {run.report['dtype']}, -> {run.path}", flush=True)
    items = schedule(run.device.type == "cuda")
    print_plan(run, items, scale)
    run.save()
    tests_at = [n for n, _ in items].index("cuda_tests")
    for k, (name, expected) in enumerate(items):
        if name == "cuda_tests":
            if not args.no_tests:
                run.section(name, 1, section_call(run, name, args), reserve=False)
            continue
        if run.device.type != "cuda" and (":graphs:" in name or ":compile:" in name):
            run.report["sections"][name] = {"status": "skipped", "reason": "captured rounds and compile are CUDA-only"}
            continue
        run.section(name, expected * scale, section_call(run, name, args), reserve=k < tests_at, child=name == "7b")
        run.guarded("projection", lambda: projection(run))
    run.save()
    faulthandler.cancel_dump_traceback_later()
    print(f"[gpu_scale] wrote {run.path} in {time.monotonic() - run.t0:.0f} s", flush=True)
    if log:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        log.close()
    return run.path


if __name__ == "__main__":
    main()
