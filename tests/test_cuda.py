"""On a GPU (skipped without CUDA, except where a CPU stand-in of the graph API runs the same logic):
captured rounds replay exactly what eager rounds compute, for
every method, and the exactness harness passes with graphs on, in fp32 and in bf16 (a bf16 model's
law is the law of its own bf16 logits, enumerated from that model). ADT-Tree's rounds are static-shaped
on CUDA (the schedule as masks): they are captured (no fallback, the graph replays) and replay the
eager static rounds exactly. The paths that had never run on a GPU: the Chameleon decoder (separate
q/k/v, rotate-half RoPE, per-head q/k norms, row ends) and the Janus family captured in bf16; RoundTimer's
capture (scripts/gpu_scale.py); live spans crossing the 64-slot bucket (recaptured); continuous batching
(rows that restart) captured; PJD and ZipAR under graphs (they ask for no capture); int8 weights on CUDA. Sized to run in well under
90 s on one GPU (``scripts/gpu_scale.py --only cuda_tests``)."""

import importlib.util
import sys
import warnings
from pathlib import Path

import fake_cuda
import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model
from test_oracle import METHODS

import specvis as sv
from specvis.models.drafter import EagleDrafter

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CFG = sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream")


def _models(dtype=torch.float32):
    target = tiny_llamagen(0).cuda().to(dtype)
    draft = tiny_llamagen(1, dim=16, n_layer=1).cuda().to(dtype)
    return target, draft, EagleDrafter.from_target(target, seed=1).cuda().to(dtype).eval()


@needs_cuda
@pytest.mark.parametrize("name", list(METHODS))
def test_graphs_replay_eager(name):
    """Same seed, graphs on and off: identical tokens, forward counts and acceptance maps."""
    target = tiny_llamagen(0, vocab=8, grid=4).cuda()
    draft = tiny_llamagen(1, vocab=8, grid=4, dim=16, n_layer=1).cuda()
    drafter = EagleDrafter.from_target(target, seed=1).cuda().eval()
    method, sampling = METHODS[name]
    outs = [sv.generate(target, torch.arange(6) % 3, method, sampling, seed=3, draft=draft, drafter=drafter, graphs=g)
            for g in (False, True)]
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    assert outs[0].stats.target_forwards == outs[1].stats.target_forwards
    assert outs[0].stats.draft_forwards == outs[1].stats.draft_forwards
    assert torch.equal(outs[0].stats.accept_map, outs[1].stats.accept_map)


@needs_cuda
@pytest.mark.parametrize("init", ["horizontal", "vertical", "random"])
@pytest.mark.parametrize("batch", [1, 4])
def test_adt_rounds_are_captured(init, batch, monkeypatch):
    """ADTTree on CUDA (static_shapes default): graphs on captures its rounds (no capture-failure
    warning, the graph is replayed) and gives the same tokens, forward counts, acceptance map and
    tree statistics as the same static rounds run eagerly; the drafter forwards are the fixed count
    (``levels`` per round). The host-synced rounds (static_shapes=False) are never captured."""
    target = tiny_llamagen(0, vocab=8, grid=4).cuda()
    drafter = EagleDrafter.from_target(target, seed=1).cuda().eval()
    method = sv.ADTTree(init=init, total_tokens=8)
    sampling = sv.Sampling(temperature=1.0, top_k=6, cfg_scale=2.0, noise="stream")
    replays = []
    replay = torch.cuda.CUDAGraph.replay

    def counted(self, *a, **k):
        replays.append(1)
        return replay(self, *a, **k)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    cond = torch.arange(batch, device="cuda") % 3
    outs = {}
    for graphs in (False, True):
        replays.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs[graphs] = sv.generate(target, cond, method, sampling, seed=3, drafter=drafter, graphs=graphs)
        assert not [w for w in caught if "capture failed" in str(w.message)]
        assert bool(replays) == graphs
    a, b = outs[False], outs[True]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.stats.accept_map, b.stats.accept_map)
    sa, sb = a.stats.to_dict(), b.stats.to_dict()
    for key in ("target_forwards", "draft_forwards", "mean_tree_depth", "mean_scheduled_depth"):
        assert sa[key] == sb[key], key
    levels = min(method.depth_range[1] - 1, method.total_tokens - 1)
    assert sb["draft_forwards"] == (sb["target_forwards"] - 1) * levels  # every round but the prefill
    replays.clear()
    host = sv.generate(target, cond, sv.ADTTree(init=init, total_tokens=8, static_shapes=False), sampling, seed=3,
                       drafter=drafter, graphs=True)
    assert not replays and host.stats.to_dict()["mean_tree_depth"] >= 1.0


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["ar", "speculative", "sjd", "eagle", "adt"])
def test_exact_with_graphs(name, dtype):
    target, draft, drafter = _models(dtype)
    method = {"ar": sv.AR(), "speculative": sv.Speculative(3), "sjd": sv.SJD(window=3, init="vertical-sample"),
              "eagle": sv.EagleTree(depth=2, top_k=2, total_tokens=4),
              "adt": sv.ADTTree(depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=6)}[name]
    assert check_method(target, method, CFG, draft=draft, drafter=drafter) > 1e-3


# ------------------------------------------------------------------ paths that never ran on a GPU
class Captures:
    """Where captured rounds run: CUDA (captures counted at ``CUDAGraph.capture_begin``) or the CPU
    stand-in of the graph API (tests/fake_cuda.py), which checks every replay runs at its captured spans."""

    def __init__(self, device: str, monkeypatch) -> None:
        self.device = device
        self.fake = fake_cuda.install(monkeypatch) if device == "cpu" else None
        self.real = 0
        if self.fake is None:
            begin = torch.cuda.CUDAGraph.capture_begin

            def counted(graph, *a, **k):
                self.real += 1
                return begin(graph, *a, **k)

            monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted)

    @property
    def captures(self) -> int:
        return self.fake.captures if self.fake is not None else self.real


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def device(request) -> str:
    return request.param


def rows_on(model, conditions: list[int]):
    """``condition_rows`` on the model's device (a ``Condition`` is passed to the model as it is)."""
    from specvis.models.base import Condition

    cond = condition_rows(model, conditions)
    dev = next(model.parameters()).device
    return Condition(cond.cond.to(dev), cond.uncond.to(dev)) if isinstance(cond, Condition) else cond.to(dev)


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert a.stats.target_forwards == b.stats.target_forwards
    assert a.stats.draft_forwards == b.stats.draft_forwards


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4, init="vertical-sample")], ids=["ar", "sjd"])
def test_live_spans_crossing_the_64_slot_bucket_are_recaptured(device, method, monkeypatch):
    """A 9 x 9 stream (82 slots with the class token) crosses the default 64-slot live-span bucket: the
    round is captured again at the larger span and replays the eager tokens and forwards."""
    target = tiny_llamagen(0, vocab=8, grid=9).to(device)
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    cond = torch.arange(2, device=device) % 3
    eager = sv.generate(target, cond, method, sampling, seed=3, graphs=False)
    cap = Captures(device, monkeypatch)
    _same(eager, sv.generate(target, cond, method, sampling, seed=3, graphs=True))
    assert cap.captures >= 2, cap.captures


@pytest.mark.parametrize("method", [sv.PJD(lag=6, window=4, keep_threshold=1.0), sv.ZipAR(window=3)],
                         ids=["pjd", "zipar"])
def test_pjd_and_zipar_run_eagerly_under_graphs(device, method, monkeypatch):
    """The 2-D methods (rows in flight, row ends) ask for no capture (their rounds read the host:
    ``ctx.run(..., capture=False)``): with graphs on they capture nothing, raise no capture-failure
    warning and give the eager tokens and forwards."""
    m = tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=1, janus=False).to(device)
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    cond = rows_on(m, [0, 1, 2])
    eager = sv.generate(m, cond, method, sampling, seed=5, graphs=False)
    cap = Captures(device, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphed = sv.generate(m, cond, method, sampling, seed=5, graphs=True)
    _same(eager, graphed)
    assert cap.captures == 0 and not [w for w in caught if "capture failed" in str(w.message)]


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4, init="vertical-sample")], ids=["ar", "sjd"])
def test_continuous_batching_captured_restarts_rows_as_eager(device, method, monkeypatch):
    """Seven samples through three rows (``batch_size=3``, a row end per row): rows restart between
    replays of the captured round and give the eager tokens and forwards."""
    m = tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=1, janus=False).to(device)
    order = [0, 1, 2, 2, 0, 1, 1]
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    eager = sv.generate(m, rows_on(m, order), method, sampling, seed=5, batch_size=3, graphs=False)
    cap = Captures(device, monkeypatch)
    _same(eager, sv.generate(m, rows_on(m, order), method, sampling, seed=5, batch_size=3, graphs=True))
    assert cap.captures >= 1


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny transformers checkpoints: Chameleon in the Lumina-mGPT layout, and Janus-Pro."""
    pytest.importorskip("transformers")
    from hf_tiny import make_janus
    from test_chameleon import make_chameleon

    root = tmp_path_factory.mktemp("families_cuda")
    return {"lumina": make_chameleon(root / "lumina", lumina=True, swin=True)[0],
            "janus": make_janus(root / "janus", seed=0)}


@pytest.mark.parametrize("family", ["lumina", "janus"])
def test_chameleon_and_janus_checkpoints_captured_in_bf16(device, family, checkpoints, monkeypatch):
    """The Chameleon family (Lumina-mGPT layout: separate q/k/v, rotate-half RoPE, per-head q/k norms, a row
    end per row) and Janus, loaded in bf16: captured rounds give the eager tokens for AR, SJD and
    Speculative (the same checkpoint as draft), rounds are captured and none falls back to eager."""
    path = str(checkpoints[family])
    grid = {"height": 4, "width": 8} if family == "lumina" else {}
    sampling = sv.Sampling(temperature=1.0, cfg_scale=3.0, noise="stream")
    eager = sv.load(path, device, dtype="bf16", graphs=False, draft=path)
    graphed = sv.load(path, device, dtype="bf16", graphs=True, draft=path)
    assert next(graphed.target.parameters()).dtype == torch.bfloat16
    cap = Captures(device, monkeypatch)
    captured = []
    for method in (sv.AR(), sv.SJD(window=3, init="vertical-sample"), sv.Speculative(gamma=2)):
        before, outs = cap.captures, []
        for pipe in (eager, graphed):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs.append(pipe(prompts=["a red apple", "cat"], method=method, sampling=sampling, seed=0,
                                 decode=False, **grid))
            assert not [w for w in caught if "capture failed" in str(w.message)], method
        _same(*outs)
        captured.append(cap.captures - before)
    assert all(captured), captured  # every method's rounds captured (a round is captured after a warm one)


def _gpu_scale():
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_scale.py"
    spec = importlib.util.spec_from_file_location("gpu_scale_for_cuda_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@needs_cuda
@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4, init="vertical-sample")], ids=["ar", "sjd"])
def test_round_timer_captures_the_method_round(method):
    """scripts/gpu_scale.py's RoundTimer on CUDA: the round is captured and replayed (``captured``), every
    replay timed, on a Chameleon-shaped bf16 decoder with a row end per row."""
    gs = _gpu_scale()
    plan = gs.plan_for(True)
    target = gs.chameleon_decoder(gs.SMOKE_7B, 64, 8, torch.device("cuda"), torch.bfloat16, seed=0)
    res = gs.time_rounds(target, method, 2, plan, graphs=True)
    assert res["captured"] is True and len(res["ms_all"]) == plan.reps and res["ms"] > 0


@needs_cuda
@pytest.mark.parametrize("name", ["ar", "speculative", "sjd"])
def test_int8_weights_on_cuda_are_exact_and_captured(name):
    """int8 weight-only linears (specvis.models.quantize) on CUDA: the exactness harness passes with graphs
    on (the law of the int8 model's own logits), and captured rounds give the eager tokens."""
    from specvis.models.quantize import quantize_linears

    target, draft, _ = _models(torch.float32)
    assert quantize_linears(target) > 0 and quantize_linears(draft) > 0
    method = {"ar": sv.AR(), "speculative": sv.Speculative(3), "sjd": sv.SJD(window=3, init="vertical-sample")}[name]
    assert check_method(target, method, CFG, draft=draft) > 1e-3
    cond = torch.arange(4, device="cuda") % 3
    outs = [sv.generate(target, cond, method, CFG, seed=1, draft=draft, graphs=g) for g in (False, True)]
    _same(*outs)
