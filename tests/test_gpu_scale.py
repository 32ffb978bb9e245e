"""scripts/gpu_scale.py (issue 49): its CPU smoke run writes every key the issue pins, with measured
values finite and positive, and its parts do what the GPU run relies on (models built on the device
with the drawn weights, the floor's byte count, rounds timed mid-stream, the bench summary, the
transformers weights mapped onto specvis's Janus decoder, the CUDA-test counts)."""

import argparse
import importlib.util
import json
import warnings
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import specvis as sv

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_scale.py"
COMMITTED = ROOT / "docs" / "results" / "gpu-scale-smoke.json"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_scale"] = module
    spec.loader.exec_module(module)
    return module


gs = load_script()


@pytest.fixture(scope="module")
def smoke_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_scale") / "smoke.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--log", str(out.with_suffix(".log"))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text()), out.with_suffix(".log").read_text(), proc.stdout


@pytest.fixture(scope="module")
def smoke(smoke_files):
    return smoke_files[0]


def test_smoke_log_holds_the_plan_and_the_child_output(smoke_files):
    """The output is teed to the log: the plan with each section's expected seconds first, the 7B child's
    lines relayed, the closing line; the report keeps the plan and records the 7B child's exit."""
    report, log, stdout = smoke_files
    assert set(stdout.splitlines()) <= set(log.splitlines())  # stderr joins the log too
    assert log.index("[gpu_scale] plan:") < log.index("[gpu_scale] bandwidth (expected")
    assert "  [7b] [gpu_scale] 7b" in log and "wrote" in log.splitlines()[-1]
    assert [p["section"] for p in report["plan"]][:2] == ["bandwidth", "7b"]
    assert report["sections"]["7b"]["child"] == "exit 0"


def positive(value, where: str) -> None:
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {value!r} is not a number"
    assert math.isfinite(value) and value > 0, f"{where}: {value!r} is not finite and positive"


def test_smoke_report_has_every_pinned_key(smoke):
    """The JSON layout of issue 49: every key present, keys of batch sizes and token counts exactly the
    issue's strings, every measurement a finite positive number; no section failed."""
    assert smoke["kind"] == "gpu-scale" and smoke["smoke"] is True and "SMOKE" in smoke["note"]
    for key in ("device_name", "date", "commit", "torch"):
        assert isinstance(smoke[key], str) and smoke[key], key
    positive(smoke["bandwidth_gbps"], "bandwidth_gbps")
    b7 = smoke["shapes"]["7b"]
    positive(b7["floor_ms"], "7b.floor_ms")
    assert set(b7["ar_step_ms"]) == {"1", "4", "16"}
    assert set(b7["cost_ms"]) == {"1", "4"}
    assert set(b7["sjd_round_ms"]) == {"16", "32"}
    for b, v in b7["ar_step_ms"].items():
        positive(v, f"7b.ar_step_ms.{b}")
    for b, row in b7["cost_ms"].items():
        assert set(row) == {"1", "2", "5", "9", "17", "33", "65"}, b
        for k, v in row.items():
            positive(v, f"7b.cost_ms.{b}.{k}")
    for w, v in b7["sjd_round_ms"].items():
        positive(v, f"7b.sjd_round_ms.{w}")
    positive(b7["spec_round_ms"], "7b.spec_round_ms")
    assert set(smoke["vs_transformers"]) >= {"1", "8"}
    for b in ("1", "8"):
        positive(smoke["vs_transformers"][b], f"vs_transformers.{b}")
    for bundle in ("emoji", "emoji_t2i"):
        assert set(smoke[bundle]) == {"1", "8"}
        for b, entry in smoke[bundle].items():
            for key in ("ar_img_s", "best_lossless_speedup", "min_speedup"):
                positive(entry[key], f"{bundle}.{b}.{key}")
            methods = {r["method"] for r in entry["runs"]}
            assert methods == {"ar", "sjd", "speculative", "static-tree", "eagle", "adt"}, methods
            for r in entry["runs"]:
                for key in ("images_per_s", "speedup", "mean_accepted_length", "efficiency"):
                    positive(r[key], f"{bundle}.{b}.{r['method']}.{key}")
    proj = smoke["projection_lumina_768_s"]
    positive(proj["ar"], "projection.ar")
    positive(proj["sjd"], "projection.sjd")
    assert "PROJECTION" in proj["note"]
    assert smoke["cuda_tests"]["skipped"] > 0 and smoke["cuda_tests"]["failed"] == 0
    failed = {k: v for k, v in smoke["sections"].items() if v["status"] == "error"}
    assert not failed, failed


def key_tree(obj, path=""):
    """The report's key paths (lists of runs and per-round timings excluded: their length varies)."""
    if not isinstance(obj, dict):
        return set()
    out = set()
    for k, v in obj.items():
        if k in ("runs", "ms_all", "errors", "skipped"):
            continue
        out.add(f"{path}.{k}")
        out |= key_tree(v, f"{path}.{k}")
    return out


def test_committed_smoke_report_matches_the_script(smoke):
    """docs/results/gpu-scale-smoke.json is the smoke output of the script as committed (same keys)."""
    committed = json.loads(COMMITTED.read_text())
    assert committed["smoke"] is True
    ignore = lambda paths: {p for p in paths if not p.startswith((".sections", ".elapsed_s"))}  # noqa: E731
    assert ignore(key_tree(committed)) == ignore(key_tree(smoke))


def test_t2i_prompt_ids_are_the_bundle_encoding():
    """The committed prompt ids (the device machine needs no tokenizer) are what the emoji-t2i bundle's
    processor makes of docs/results/data/emoji-t2i-prompts.txt."""
    pytest.importorskip("transformers")
    pipe = sv.load("emoji-t2i")
    texts = (ROOT / "docs" / "results" / "data" / "emoji-t2i-prompts.txt").read_text().splitlines()
    assert pipe.family.encode(pipe.processor, texts, 16, 16, pipe.target) == gs.t2i_prompts()


def test_build_on_device_draws_every_weight():
    """Meta, then storage on the device, then the drawn values: Linear and Embedding weights N(0, 0.02^2),
    norm scales (RMSNorm and Chameleon's per-head LayerNorm) 1, biases 0; a module with buffers is refused."""
    model = gs.chameleon_decoder(gs.SMOKE_7B, 64, 4, torch.device("cpu"), torch.float32, seed=0)
    assert not any(p.is_meta for p in model.parameters())
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
    mats = torch.cat([p.flatten() for n, p in model.named_parameters() if p.dim() == 2 and "norm" not in n])
    assert mats.std().item() == pytest.approx(0.02, rel=0.02) and abs(mats.mean().item()) < 1e-3
    again = gs.chameleon_decoder(gs.SMOKE_7B, 64, 4, torch.device("cpu"), torch.float32, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="buffers"):
        gs.build_on_device(lambda: nn.BatchNorm1d(4), torch.device("cpu"), torch.float32, 0)


def test_read_bytes_leaves_out_the_embedding_table():
    """A step reads every weight once but only the fed tokens' rows of the text embedding table."""
    model = gs.chameleon_decoder(gs.SMOKE_7B, 64, 4, torch.device("cpu"), torch.bfloat16, seed=0)
    everything = sum(p.numel() for p in model.parameters())
    table = gs.SMOKE_7B["vocab_size"] * gs.SMOKE_7B["hidden_size"]
    assert gs.read_bytes(model) == 2 * (everything - table)


class Spy:
    """A method whose rounds record the committed length and the target/draft caches' lengths."""

    name = "spy"
    lossless = True
    acceptance = None
    pad = 3

    def __init__(self) -> None:
        self.seen = []

    def decode(self, ctx) -> None:
        ctx.target.prefill()
        ctx.draft.prefill()

        def round_():
            self.seen.append((ctx.n.tolist(), ctx.target.model.cache.length.tolist(),
                              ctx.draft.model.cache.length.tolist()))
            ctx.target.forward(ctx.tokens[:, :2], ctx.positions(ctx.n - 1, 2))

        ctx.run(round_)


def test_round_timer_times_the_method_round_mid_stream():
    """RoundTimer runs the method's own round (warm + reps times, eager on CPU) with every row at
    ``fill`` of the stream committed and both caches rolled to it (prefix + start - 1 slots), then
    ends the decode; it reports the median of the timed rounds and the context."""
    plan = gs.plan_for(True)
    target = gs.chameleon_decoder(gs.SMOKE_7B, 64, 8, torch.device("cpu"), torch.float32, seed=0)
    draft = gs.chameleon_decoder(gs.SMOKE_DRAFT, 64, 8, torch.device("cpu"), torch.float32, seed=1)
    spy = Spy()
    timer = gs.RoundTimer(spy, fill=0.5, warm=2, reps=3)
    cond = gs.random_condition(target, 2, 5, seed=0)
    out = sv.generate(target, cond, timer, sv.Sampling(cfg_scale=3.0), draft=draft)
    start = int(0.5 * target.layout.stream_len)  # 36 of 72 stream positions
    prefix = torch.tensor([5, 5, 3, 3])  # two conditional rows, then their negative prompts
    assert len(spy.seen) == 2 + 3
    for n, t_len, d_len in spy.seen:
        assert n == [start, start]
        assert t_len == (prefix + start - 1).tolist() and d_len == t_len
    assert timer.result["context_slots"] == 5 + start - 1
    assert len(timer.result["ms_all"]) == 3 and timer.result["ms"] > 0 and not timer.result["captured"]
    assert out.tokens.shape == (2, 64)
    res = gs.time_rounds(target, sv.AR(), 1, plan, graphs=False)
    assert res["ms"] > 0 and len(res["ms_all"]) == plan.reps


def test_summarise_counts_lossless_methods_only():
    runs = [{"method": "ar", "config": {}, "lossless": True, "images_per_s": 2.0, "speedup": 1.0},
            {"method": "sjd", "config": {"window": 16}, "lossless": True, "images_per_s": 3.0, "speedup": 1.5},
            {"method": "speculative", "config": {}, "lossless": True, "images_per_s": 1.6, "speedup": 0.8},
            {"method": "sjd", "config": {"accept": "lantern"}, "lossless": False, "images_per_s": 8.0, "speedup": 4.0}]
    s = gs.summarise(runs)
    assert s["ar_img_s"] == 2.0 and s["best_lossless_speedup"] == 1.5 and s["min_speedup"] == 0.8
    assert s["best_lossless"].startswith("sjd")


def test_specvis_janus_holds_the_transformers_weights():
    """The Janus-Pro-shaped comparison runs the same weights: specvis's decoder made from transformers'
    model scores the first image token as transformers does (fp32)."""
    pytest.importorskip("transformers")
    plan = gs.plan_for(True)
    vocab = plan.janus_text["vocab_size"]
    ids = {"bos": vocab - 400, "pad": vocab - 398, "boi": vocab - 384}
    hf = gs.hf_janus(plan, torch.device("cpu"), torch.float32, ids)
    model = gs.specvis_janus(hf, ids, 8)
    prompt = torch.cat([torch.tensor([[ids["bos"]]]), torch.randint(0, ids["bos"], (1, 9)),
                        torch.tensor([[ids["boi"]]])], 1)
    with torch.no_grad():
        assert gs.first_logits_diff(hf, model, prompt) < 1e-4
    assert model.layout.num_tokens == plan.janus_tokens


def test_janus_generate_shim_by_version():
    """transformers before 5.23 gets the per-model shim (recorded), 5.23 and later none; with the shim
    transformers' Janus generate makes the image tokens (run this file under transformers 5.17 to see
    the unpatched call fail)."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    plan = gs.plan_for(True)
    vocab = plan.janus_text["vocab_size"]
    ids = {"bos": vocab - 400, "pad": vocab - 398, "boi": vocab - 384}
    installed = transformers.__version__
    hf = gs.hf_janus(plan, torch.device("cpu"), torch.float32, ids)
    patched = gs.janus_generate_shim(hf, installed)
    assert (patched is None) == (Version(installed) >= Version("5.23.0"))
    assert ("_prepare_static_cache" in vars(hf)) == (patched is not None)
    assert gs.janus_generate_shim(gs.hf_janus(plan, torch.device("cpu"), torch.float32, ids), "5.23.0") is None
    old = gs.janus_generate_shim(hf, "5.17.0") if patched is None else patched
    assert old["transformers"] in ("5.17.0", installed) and "prefill_chunk_size" in old["what"]
    prompt = torch.tensor([[ids["bos"], 5, 6, 7, ids["boi"]]])
    torch.manual_seed(0)
    with torch.inference_mode():
        out = gs.hf_generate(hf, prompt, torch.ones_like(prompt))
    assert out.shape == (1, plan.janus_tokens)
    assert type(hf)._prepare_static_cache is not vars(hf)["_prepare_static_cache"]  # the class is untouched


def test_pytest_outcomes_counts_each_outcome():
    text = ("tests/test_cuda.py::test_a[ar] PASSED  [ 25%]\ntests/test_cuda.py::test_a[sjd] FAILED  [ 50%]\n"
            "tests/test_cuda.py::test_b SKIPPED (needs CUDA)  [ 75%]\ntests/test_cuda.py::test_c ERROR\n"
            "== 1 failed, 1 passed ==\n")
    out = gs.pytest_outcomes(text)
    assert (out["passed"], out["failed"], out["skipped"], out["error"]) == (1, 1, 1, 1)
    assert out["failing"] == ["tests/test_cuda.py::test_a[sjd]", "tests/test_cuda.py::test_c"]


def test_vs_transformers_without_transformers_says_why(monkeypatch):
    """The device machine may lack transformers: the comparison is null with the reason, not a crash."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    run = type("R", (), {"report": {"vs_transformers": {"1": None, "8": None}}})()
    gs.vs_transformers(run)
    out = run.report["vs_transformers"]
    assert out["1"] is None and out["8"] is None and "not installed" in out["reason"]


def test_resume_adds_to_an_earlier_report_of_the_same_device(tmp_path):
    """--resume keeps an earlier call's figures, records both calls, and refuses another device's report."""
    fresh = {"kind": "gpu-scale", "smoke": False, "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
             "dtype": "bfloat16", "date": "d2", "commit": "c2"}
    old = {**fresh, "date": "d1", "commit": "c1", "bandwidth_gbps": 3000.0}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    merged = gs.resumed(path, fresh)
    assert merged["bandwidth_gbps"] == 3000.0
    assert merged["calls"] == [{"date": "d1", "commit": "c1"}, {"date": "d2", "commit": "c2"}]
    path.write_text(json.dumps({**old, "device_name": "NVIDIA H200"}))
    with pytest.raises(SystemExit, match="device_name"):
        gs.resumed(path, fresh)


def smoke_run(tmp_path):
    args = argparse.Namespace(budget=120.0, tests_reserve=0.0, resume=None, child_report=None,
                              out=str(tmp_path / "r.json"), only=None)
    return gs.Run(args, gs.plan_for(True))


def test_capture_failure_marks_graphs_figures_eager_and_errors_keep_tracebacks(tmp_path):
    """A "graphs" block whose rounds fell back to eager (rounds' RuntimeWarning) is marked as not captured
    in its runs, its by_mode entry and its headline mode; every warning is recorded; a failing section
    records its error and traceback, and the next section still runs."""
    run = smoke_run(tmp_path)
    entry = run.report["emoji"]["1"]

    def block():
        entry["runs"] = [{"mode": "graphs", "method": "ar"}, {"mode": "eager", "method": "ar"}]
        entry["by_mode"]["graphs"] = {"ar_img_s": 1.0}
        entry["mode"] = "graphs"
        warnings.warn(f"{gs.CAPTURE_FAILED}, running eagerly: boom", RuntimeWarning)
        warnings.warn("something else", UserWarning)

    run.in_process("emoji:graphs:b1", block)
    assert run.report["sections"]["emoji:graphs:b1"] == {"status": "done", "capture_failed": 1}
    assert [r.get("captured") for r in entry["runs"]] == [False, None]
    assert entry["by_mode"]["graphs"]["captured"] is False and "eager" in entry["mode"]
    assert [w["category"] for w in run.report["warnings"]] == ["RuntimeWarning", "UserWarning"]

    def broken():
        raise ValueError("no such thing")

    run.in_process("vs_transformers", broken)
    assert run.report["sections"]["vs_transformers"]["error"] == "ValueError: no such thing"
    assert "raise ValueError" in run.report["tracebacks"][-1]["text"]
    run.guarded("projection", broken)
    assert run.report["errors"] == ["projection: ValueError: no such thing"]


def test_a_child_section_that_dies_leaves_the_parent_whole(tmp_path):
    """A section run in a child process that dies before recording it is an error with the child's exit
    status and output tail (its traceback); the parent's report keeps what it had."""
    run = smoke_run(tmp_path)
    run.report["bandwidth_gbps"] = 12.5
    run.section("bogus", 0, lambda: None, child=True)
    entry = run.report["sections"]["bogus"]
    assert entry["status"] == "error" and entry["child"] == "exit 1" and "exit 1" in entry["error"]
    assert "ValueError" in run.report["tracebacks"][-1]["text"]
    assert run.report["bandwidth_gbps"] == 12.5


def test_the_plan_puts_sections_in_value_order_and_skips_what_does_not_fit(tmp_path):
    """On CUDA: 7B, the captured blocks at batch 1 then 8, transformers, the tests, the hooks, compile
    last; a section whose expected seconds are not left is skipped and says why."""
    names = [n for n, _ in gs.schedule(True)]
    assert names[:2] == ["bandwidth", "7b"]
    assert names[2:6] == ["emoji_t2i:graphs:b1", "emoji:graphs:b1", "emoji_t2i:graphs:b8", "emoji:graphs:b8"]
    assert names[6:10] == ["vs_transformers", "cuda_tests", "serve", "seeds"]
    assert all(":compile:" in n or ":eager:" in n for n in names[10:])
    high = sum(e for n, e in gs.schedule(True)[:7])
    assert high <= 420 - 100, "the sections before the tests must fit one 8-minute call"
    run = smoke_run(tmp_path)
    run.section("emoji:graphs:b1", 10_000, lambda: pytest.fail("ran"))
    assert run.report["sections"]["emoji:graphs:b1"]["status"] == "skipped"


def test_hooks_run_the_scripts_that_exist_and_keep_their_json(tmp_path, monkeypatch):
    """The server / keyed-noise hooks: a missing script or module is a recorded skip; an existing one runs
    with ``OUT`` set and ``{out}`` in its arguments replaced by that folder (its JSON and output tail kept;
    the smoke run takes the smoke arguments); a script that fails is an error naming it."""
    run = smoke_run(tmp_path)
    monkeypatch.setitem(gs.HOOKS, "serve", ("scripts/no_such_bench.py", ["--device", "cuda"], [], ()))
    run.in_process("serve", lambda: gs.hook(run, "serve", 30))
    assert run.report["sections"]["serve"]["status"] == "skipped" and "not in this tree" in run.report["serve"]["reason"]
    monkeypatch.setitem(gs.HOOKS, "serve", ("scripts/gpu_scale.py", [], [], ("no_such_module_here",)))
    run.in_process("serve", lambda: gs.hook(run, "serve", 30))
    assert run.report["sections"]["serve"]["status"] == "skipped" and "no_such_module_here" in run.report["serve"]["reason"]
    script = tmp_path / "bench.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({'argv': sys.argv[1:]}, open(os.path.join(os.environ['OUT'], 'r.json'), 'w'))\n"
                      "print('measured'); sys.exit(int(os.environ.get('FAIL', '0')))\n")
    monkeypatch.setitem(gs.HOOKS, "seeds", (str(script), ["--device", "cuda"], ["--device", "cpu", "--in", "{out}"], ()))
    run.in_process("seeds", lambda: gs.hook(run, "seeds", 30))
    out = run.report["seeds"]
    assert run.report["sections"]["seeds"]["status"] == "done" and out["status"] == "exit 0"
    assert out["results"]["r.json"]["argv"][:3] == ["--device", "cpu", "--in"] and out["tail"] == ["measured"]
    assert out["results"]["r.json"]["argv"][3] in out["command"] and "{out}" not in out["command"]
    monkeypatch.setenv("FAIL", "3")
    run.in_process("seeds", lambda: gs.hook(run, "seeds", 30))
    assert run.report["sections"]["seeds"]["status"] == "error" and "exit 3" in run.report["sections"]["seeds"]["error"]
