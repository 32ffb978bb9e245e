"""Predicted speedups in the bench: forwards by block size (every method, eager and with replayed
captured rounds), the cost-curve model (AR exactly 1, a linear curve gives a hand-checkable number),
the cost curve in the report JSON and its reuse on resume, shards and --no-cost-curve."""

import json

import fake_clock
import fake_cuda
import pytest

import specvis.bench.runner as runner
from specvis.bench.runner import Bench
from specvis.job import Job
from specvis.bench.report import (block_size_fields, curve_cost, markdown_table, merge_reports, predicted_time,
                                  set_speedups)
from specvis.cli import main
from specvis.registry import method_from_spec
from specvis.zoo import load

G, W, T, D, K = 3, 4, 8, 3, 2  # speculative gamma, SJD window, EAGLE total_tokens / depth / top_k
SPECS = {"ar": "ar", "speculative": f"speculative:gamma={G}", "sjd": f"sjd:window={W}",
         "eagle": f"eagle:total_tokens={T}:depth={D}:top_k={K}"}


@pytest.fixture(scope="module")
def pipe():
    return load("random-tiny")


def sizes_of(pipe, spec, **kw):
    out = pipe([0, 1], method_from_spec(spec), seed=0, decode=False, **kw)
    return out.stats


def expected_sizes(name: str, fwd: int) -> dict[str, dict[int, int]]:
    """What each method feeds per forward (read off the methods' code): the prefill is a 1-token
    forward; R = fwd - 1 verify rounds follow."""
    R = fwd - 1
    if name == "ar":
        return {"target": {1: fwd}}
    if name == "speculative":  # verify gamma + 1; the draft re-feeds 1 token in round 1, then 2, then 1s
        return {"target": {1: 1, G + 1: R}, "draft": {1: 1 + G + (R - 1) * (G - 1), 2: R - 1}}
    if name == "sjd":  # the pending token + the window
        return {"target": {1: 1, W + 1: R}}
    # eagle: the tree's total_tokens; drafter: catch-up over 1 token (round 1) then depth + 1 tokens,
    # and depth - 1 expansions of top_k nodes per round
    return {"target": {1: 1, T: R}, "drafter": {1: 1, D + 1: R - 1, K: (D - 1) * R}}


@pytest.mark.parametrize("name", list(SPECS))
def test_block_sizes_sum_to_forwards_and_are_what_the_method_verifies(pipe, name):
    s = sizes_of(pipe, SPECS[name])
    hist = s.block_sizes
    assert sum(hist["target"].values()) == s.target_forwards
    drafts = {k: v for k, v in hist.items() if k != "target"}
    assert sum(sum(h.values()) for h in drafts.values()) == s.draft_forwards
    assert hist == expected_sizes(name, s.target_forwards)


@pytest.mark.parametrize("name", ["speculative", "eagle"])
def test_replayed_rounds_count_block_sizes_like_eager_ones(pipe, name, monkeypatch):
    eager = sizes_of(pipe, SPECS[name])
    fake = fake_cuda.install(monkeypatch)
    monkeypatch.setattr(pipe, "graphs", True)
    graphed = sizes_of(pipe, SPECS[name])
    assert fake.replays > 10
    assert graphed.target_forwards == eager.target_forwards and graphed.draft_forwards == eager.draft_forwards
    assert graphed.block_sizes == eager.block_sizes


def test_ar_predicted_speedup_is_one_and_efficiency_its_speedup(pipe):
    report = runner.run_bench(pipe, Job(num=2, batch_size=2),
                              Bench(specs=[SPECS["sjd"]], metrics=[], cost_curve=True), progress=False)
    ar, sjd = report["runs"]
    assert ar["target_block_sizes"] == {"1": 64 * 1}  # one batch of 2: 64 batched calls of 1 token
    assert ar["predicted_speedup"] == 1.0 and ar["efficiency"] == ar["speedup"] == 1.0
    assert sjd["predicted_speedup"] > 0 and sjd["efficiency"] == pytest.approx(sjd["speedup"] / sjd["predicted_speedup"])
    assert {r["tokens"] for r in report["cost_curve"]["target"]} == {1, W + 1}
    table = markdown_table(report)
    assert "| predicted speedup | efficiency |" in table and "| 1.00x | 1.00x | 1.00 |" in table


def test_linear_cost_curve_gives_tokens_over_block_tokens(pipe):
    """cost(n) = n seconds: AR costs one per token (batch 1), SJD the tokens it fed; a draft model
    priced at n / 2 adds half its fed tokens."""
    report = runner.run_bench(pipe, Job(num=2, batch_size=1),
                              Bench(specs=[SPECS["sjd"], SPECS["speculative"]], metrics=[]), progress=False)
    ar, sjd, spec = report["runs"]
    assert "predicted_speedup" not in sjd  # no curve: no prediction
    report["cost_curve"] = {"target": [{"tokens": 1, "median_s": 1.0}, {"tokens": 2, "median_s": 2.0}],
                            "draft": [{"tokens": 1, "median_s": 0.5}, {"tokens": 2, "median_s": 1.0}]}
    set_speedups(report)
    assert ar["tokens"] == 128 and ar["target_forwards"] == 128 and ar["predicted_speedup"] == 1.0
    fed = sum(int(n) * c for n, c in sjd["target_block_sizes"].items())
    rounds_ = sjd["target_forwards"] - 2  # two images, one prefill each
    assert fed == 2 + (W + 1) * rounds_
    assert sjd["predicted_speedup"] == pytest.approx(128 / fed)
    assert sjd["efficiency"] == pytest.approx(sjd["speedup"] * fed / 128)
    spec_fed = sum(int(n) * c for n, c in spec["target_block_sizes"].items())
    draft_fed = sum(int(n) * c for n, c in spec["draft_block_sizes"].items())
    assert spec["predicted_speedup"] == pytest.approx(128 / (spec_fed + draft_fed / 2))
    # hand-made runs: 64 tokens by a prefill and 21 forwards of 3 tokens -> 64 / 64 = 1; by 9 forwards of 8 -> 64 / 73
    runs = [{"method": "ar", "images_per_s": 1.0, "target_block_sizes": {"1": 64}},
            {"method": "sjd", "images_per_s": 1.0, "target_block_sizes": {"1": 1, "3": 21}},
            {"method": "sjd", "images_per_s": 2.0, "target_block_sizes": {"1": 1, "8": 9}}]
    hand = {"runs": runs, "cost_curve": {"target": [{"tokens": 1, "median_s": 1.0}, {"tokens": 2, "median_s": 2.0}]}}
    set_speedups(hand)
    assert [r["predicted_speedup"] for r in runs] == [1.0, pytest.approx(1.0), pytest.approx(64 / 73)]
    assert runs[2]["efficiency"] == pytest.approx(2.0 * 73 / 64)
    # the curve between and beyond its points: linear
    rows = [{"tokens": 1, "median_s": 1.0}, {"tokens": 5, "median_s": 3.0}]
    assert [curve_cost(rows, n) for n in (1, 3, 5, 9)] == [1.0, 2.0, 3.0, 5.0]
    assert predicted_time({"target_block_sizes": {"1": 2}, "draft_forwards": 3}, hand["cost_curve"]) is None


def test_report_keeps_cost_curve_and_resume_reuses_it(pipe, tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    calls = []
    real = runner.measure_curve
    monkeypatch.setattr(runner, "measure_curve", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    first = runner.run_bench(pipe, Job(num=2, batch_size=2, out=path),
                             Bench(specs=[SPECS["sjd"]], metrics=[], cost_curve=True), progress=False)
    saved = json.loads(path.read_text())
    assert calls == [{"target": [1, W + 1]}]
    assert saved["cost_curve"] == first["cost_curve"] and saved["runs"][1]["target_block_sizes"]
    assert saved["runs"][1]["predicted_speedup"] == pytest.approx(first["runs"][1]["predicted_speedup"])

    again = runner.run_bench(pipe, Job(num=2, batch_size=2, out=path),
                             Bench(specs=[SPECS["sjd"]], metrics=[], cost_curve=True), progress=False)
    assert len(calls) == 1 and again["cost_curve"] == saved["cost_curve"]  # reused, not remeasured
    assert again["runs"][1]["predicted_speedup"] == pytest.approx(saved["runs"][1]["predicted_speedup"])

    # a method with sizes the curve lacks: measured afresh for all sizes the runs use
    more = runner.run_bench(pipe, Job(num=2, batch_size=2, out=path),
                            Bench(specs=[SPECS["sjd"], SPECS["speculative"]], metrics=[], cost_curve=True),
                            progress=False)
    assert calls[1] == {"target": [1, G + 1, W + 1], "draft": [1, 2]}
    assert {r["tokens"] for r in more["cost_curve"]["draft"]} == {1, 2}
    # another batch size: the old curve does not apply; sampled after each of the two batches
    runner.run_bench(pipe, Job(num=2, batch_size=1, out=path),
                     Bench(specs=[SPECS["sjd"]], metrics=[], cost_curve=True), progress=False)
    assert len(calls) == 4
    # more repeats on a finished report: the added round samples its own curve, batch by batch
    runner.run_bench(pipe, Job(num=2, batch_size=1, out=path),
                     Bench(specs=[SPECS["sjd"]], repeats=2, metrics=[], cost_curve=True), progress=False)
    assert len(calls) == 6
    # a round of more batches than CURVE_SAMPLES_PER_ROUND: one sample every few batches, the last included
    calls.clear()
    n = runner.CURVE_SAMPLES_PER_ROUND + 3
    runner.run_bench(pipe, Job(num=n, batch_size=1), Bench(specs=["ar"], metrics=[], cost_curve=True), progress=False)
    assert len(calls) == n // 2 + 1


def test_shards_merge_block_sizes_and_keep_the_curve(pipe, tmp_path):
    parts = [tmp_path / f"s{i}.json" for i in range(2)]
    shards = [runner.run_bench(pipe, Job(num=4, batch_size=1, out=p),
                               Bench(specs=[SPECS["sjd"]], metrics=[], cost_curve=True, shards=2, shard_index=i),
                               progress=False)
              for i, p in enumerate(parts)]
    merged = merge_reports(parts)
    sjd = merged["runs"][1]
    want: dict[str, int] = {}
    for s in shards:
        for n, c in s["runs"][1]["target_block_sizes"].items():
            want[n] = want.get(n, 0) + c
    assert sjd["target_block_sizes"] == want and sum(want.values()) == sjd["target_forwards"]
    assert merged["cost_curve"] == shards[0]["cost_curve"] and merged["runs"][0]["predicted_speedup"] == 1.0
    assert sjd["forward_s_repeats"] == pytest.approx([sum(s["runs"][1]["forward_s_repeats"][0] for s in shards)])
    assert 0 < sjd["forward_share"] < 1
    assert sjd["round_efficiency"] == pytest.approx(sjd["forward_share"] / merged["runs"][0]["forward_share"])
    t = predicted_time(sjd, merged["cost_curve"])
    assert sjd["predicted_speedup"] == pytest.approx(predicted_time(merged["runs"][0], merged["cost_curve"]) / t)


def test_cli_measures_the_curve_unless_told_not_to(tmp_path):
    args = ["bench", "--model", "random-tiny", "--methods", SPECS["eagle"], "--num", "2", "--batch-size", "2"]
    assert main([*args, "--json", str(tmp_path / "a.json"), "--md", str(tmp_path / "a.md")]) == 0
    rep = json.loads((tmp_path / "a.json").read_text())
    assert {r["tokens"] for r in rep["cost_curve"]["drafter"]} == {1, K, D + 1}
    assert all("predicted_speedup" in r and "efficiency" in r for r in rep["runs"])
    assert "predicted speedup" in (tmp_path / "a.md").read_text()
    assert main([*args, "--json", str(tmp_path / "b.json"), "--md", str(tmp_path / "b.md"), "--no-cost-curve"]) == 0
    rep = json.loads((tmp_path / "b.json").read_text())
    assert "cost_curve" not in rep and not any("predicted_speedup" in r for r in rep["runs"])
    assert rep["runs"][1]["drafter_block_sizes"]  # still recorded
    assert "predicted speedup" not in (tmp_path / "b.md").read_text()


@pytest.mark.parametrize("family", ["emu3", "janus"])
def test_text_to_image_cost_curve_with_prompts_and_a_draft(tmp_path, family):
    """Prompts instead of classes (Emu3 with its forced row ends, Janus): the curve covers the target
    and draft sizes the runs used, every run gets a prediction, histograms sum to the forward counts."""
    pytest.importorskip("transformers")
    from hf_tiny import make_emu3, make_janus, read_fixture

    make = make_emu3 if family == "emu3" else make_janus
    d, dd = make(tmp_path / "t", seed=0), make(tmp_path / "d", seed=1)
    info = read_fixture(d)
    pipe = load(str(d), draft=str(dd))
    report = runner.run_bench(pipe, Job(num=2, batch_size=2, prompts=("a red apple", "a cat"), height=info["height"],
                                  width=info["width"]),
                              Bench(specs=[SPECS["sjd"], "speculative:gamma=2"], metrics=[], cost_curve=True),
                              progress=False)
    curve = report["cost_curve"]
    assert {r["tokens"] for r in curve["target"]} == {1, 3, W + 1} and {r["tokens"] for r in curve["draft"]} == {1, 2}
    for r in report["runs"]:
        assert sum(r["target_block_sizes"].values()) == r["target_forwards"]
        assert sum((r.get("draft_block_sizes") or {}).values()) == r["draft_forwards"]
        assert r["predicted_speedup"] > 0 and r["efficiency"] > 0
    assert report["runs"][0]["predicted_speedup"] == 1.0


def test_cost_curve_is_sampled_during_every_round_and_its_median_kept(pipe, monkeypatch):
    """With 3 timed passes of one batch the curve is measured once in each round (after its batch of
    every method) and the report keeps the per-size median: a curve taken once, or the mean, or the
    last sample, fails."""
    times = iter([1.0, 9.0, 2.0])
    calls = []

    def fake(pipe, need, *a, **k):
        t = next(times)
        calls.append(need)
        return {kind: [{"tokens": n, "median_s": t * n} for n in sizes] for kind, sizes in need.items()}

    monkeypatch.setattr(runner, "measure_curve", fake)
    report = runner.run_bench(pipe, Job(num=2, batch_size=2),
                              Bench(specs=[SPECS["sjd"]], repeats=3, metrics=[], cost_curve=True), progress=False)
    assert len(calls) == 3
    assert report["cost_curve"]["target"] == [{"tokens": 1, "median_s": 2.0}, {"tokens": W + 1, "median_s": 2.0 * (W + 1)}]
    assert all(len(r["wall_s_repeats"]) == 3 for r in report["runs"])


def test_interleaved_speedup_is_the_median_of_within_round_ratios():
    """AR slowed down in round 2 only: the per-round ratios are 2, 2, 1 (median 2), while the ratio
    of median walls would say 1.0; passes that were not interleaved keep the ratio of images/s."""
    def run(method, walls):
        return {"method": method, "n_images": 4, "wall_s_repeats": walls, "images_per_s": 4 / sorted(walls)[1]}

    report = {"pass_order": "interleaved", "runs": [run("ar", [10.0, 20.0, 10.0]), run("sjd", [5.0, 10.0, 10.0])]}
    set_speedups(report)
    sjd = report["runs"][1]
    assert sjd["speedup_rounds"] == [2.0, 2.0, 1.0] and sjd["speedup"] == 2.0
    assert report["runs"][0]["speedup"] == 1.0
    del report["pass_order"]
    set_speedups(report)
    assert sjd["speedup"] == 1.0 and "speedup_rounds" not in sjd


def test_cost_curve_times_each_forward_after_warm_calls_of_its_size(pipe, monkeypatch):
    """Sizes interleave, and each round times ``TIMED_CALLS`` forwards after ``WARM_CALLS`` untimed ones
    of their size: the first forwards after a switch of size cost more (docs/results/archive/goal.md), and
    a curve timed right after the switch priced AR's forward above AR's whole decode step. Here, on a
    fake clock (``fake_clock``: no wall time), the first seven forwards after a switch take 20 ms and
    the others 1 ms: a curve that timed any of them in a round (the warm calls dropped or timed) would
    price a size above 1 ms."""
    from specvis.bench import forward_cost

    clock = fake_clock.install(monkeypatch)
    order = []
    real = pipe.target.forward_tokens

    def forward(tokens, *a, **k):
        n = tokens.shape[1]
        since = next((i for i, m in enumerate(reversed(order)) if m != n), len(order))  # calls of n in a row
        order.append(n)
        clock.advance(0.02 if since < 7 else 0.001)
        return real(tokens, *a, **k)

    monkeypatch.setattr(pipe.target, "forward_tokens", forward)
    curve = forward_cost.cost_curve(pipe, {"target": [1, 5]}, 1, repeats=5)
    run = forward_cost.WARM_CALLS + forward_cost.TIMED_CALLS
    assert forward_cost.WARM_CALLS >= 7
    rounds = 1 + -(-5 // forward_cost.TIMED_CALLS)  # a first round dropped
    assert order == ([1] * run + [5] * run) * len(forward_cost.FILLS) * rounds
    for r in curve["target"]:
        assert r["median_s"] == pytest.approx(0.001) and [t for _, t in r["spans"]] == pytest.approx([0.001, 0.001])


def test_live_spans_are_the_mean_span_each_forward_attended(pipe, monkeypatch):
    """``Stats.live_spans[kind][n]``: the mean over that model's forwards of n tokens of the live span
    ``KVCache.live`` returned (read here by wrapping it). A span booked under another size, or the
    slots needed booked instead of the span (its bucket multiple), fails."""
    from specvis.models.base import KVCache

    seen: dict[tuple[int, int], list[int]] = {}
    real = KVCache.live

    def live(self, n):
        span = real(self, n)
        seen.setdefault((id(self), n), []).append(span)
        return span

    monkeypatch.setattr(KVCache, "live", live)
    st = sizes_of(pipe, SPECS["speculative"])
    for kind, cache in (("target", pipe.target.cache), ("draft", pipe.draft.cache)):
        expect = {n: sum(v) / len(v) for (c, n), v in seen.items() if c == id(cache)}
        assert st.live_spans[kind] == pytest.approx(expect)
    assert set(st.live_spans) == set(st.block_sizes)


def test_forwards_are_priced_at_their_mean_live_span():
    """A curve row timed at two live spans prices a run's forwards of its size on the line through
    them, at the run's mean span for that size; without spans (run or row) at ``median_s``. Runs'
    spans are merged weighted by their forwards."""
    from types import SimpleNamespace as NS

    curve = {"target": [{"tokens": 1, "median_s": 2.0, "spans": [[64, 1.0], [192, 3.0]]},
                        {"tokens": 5, "median_s": 4.0, "spans": [[64, 3.0], [192, 5.0]]}]}
    sizes = {"1": 10, "5": 4}
    assert predicted_time({"target_block_sizes": sizes, "target_live_spans": {"1": 128.0, "5": 256.0}},
                          curve) == pytest.approx(10 * 2.0 + 4 * 6.0)
    assert predicted_time({"target_block_sizes": sizes}, curve) == pytest.approx(10 * 2.0 + 4 * 4.0)
    assert curve_cost(curve["target"], 3, 64) == pytest.approx(2.0)  # between sizes, at the span
    a = NS(block_sizes={"target": {1: 3}}, live_spans={"target": {1: 64.0}})
    b = NS(block_sizes={"target": {1: 1, 5: 2}}, live_spans={"target": {1: 128.0, 5: 192.0}})
    assert block_size_fields([a, b]) == {"target_block_sizes": {"1": 4, "5": 2},
                                         "target_live_spans": {"1": 80.0, "5": 192.0}}


def test_cost_curve_times_each_size_at_two_fills(pipe, monkeypatch):
    """Each size is timed with a quarter and with three quarters of the stream committed: ``spans``
    holds the live span each ran over and its seconds, ``median_s`` their mean. The forward here takes
    0.2 ms per committed slot on a fake clock (no wall time), so each fill's time is 0.2 ms times its
    committed length, and a curve that timed both at one fill (the fill not committed) gives two equal
    times."""
    from specvis.bench import forward_cost

    clock = fake_clock.install(monkeypatch)
    real = pipe.target.forward_tokens
    lengths = set()

    def forward(tokens, *a, **k):
        committed = int(pipe.target.cache.length.max())
        lengths.add(committed)
        clock.advance(2e-4 * committed)
        return real(tokens, *a, **k)

    monkeypatch.setattr(pipe.target, "forward_tokens", forward)
    rows = forward_cost.cost_curve(pipe, {"target": [1, 5]}, 1, repeats=1)["target"]
    lo_len, hi_len = min(lengths), max(lengths)
    assert len(lengths) == 2 and hi_len - lo_len >= 16
    for r in rows:
        (lo, t_lo), (hi, t_hi) = r["spans"]
        assert lo <= hi and t_lo == pytest.approx(2e-4 * lo_len) and t_hi == pytest.approx(2e-4 * hi_len)
        assert r["median_s"] == pytest.approx((t_lo + t_hi) / 2)


@pytest.mark.parametrize("name,kind", [("speculative", "draft"), ("eagle", "drafter")])
def test_forward_seconds_are_the_time_inside_each_models_forwards(pipe, monkeypatch, name, kind):
    """``Stats.forward_s``: per model that ran, the seconds inside its forwards. On a fake clock (no wall
    time) each target forward (prefill included) takes 1 ms and each forward of the second model 10 ms,
    nothing else takes time: the seconds booked are exactly those, and they add up to the decode's
    wall-clock. Seconds booked under the wrong model, not booked for the drafter or for a view's
    forwards, or the round's other work (the other model's forwards) counted in, fail."""
    clock = fake_clock.install(monkeypatch)
    model = pipe.draft if kind == "draft" else pipe.drafter
    calls = {"target": 0, kind: 0}

    def timed(who, fn, seconds):
        def run(*a, **k):
            calls[who] += 1
            clock.advance(seconds)
            return fn(*a, **k)
        return run

    monkeypatch.setattr(model, "forward_tokens", timed(kind, model.forward_tokens, 0.01))
    for fn in ("prefill", "forward_tokens"):
        monkeypatch.setattr(pipe.target, fn, timed("target", getattr(pipe.target, fn), 0.001))
    st = sizes_of(pipe, SPECS[name])
    assert set(st.forward_s) == set(st.block_sizes) == {"target", kind}
    assert calls["target"] == st.target_forwards
    assert calls[kind] == sum(st.block_sizes[kind].values()) - (1 if kind == "draft" else 0)  # the draft's prefill is not wrapped
    assert st.forward_s[kind] == pytest.approx(0.01 * calls[kind])
    assert st.forward_s["target"] == pytest.approx(0.001 * st.target_forwards)
    assert st.wall_s == pytest.approx(clock.now) and sum(st.forward_s.values()) == pytest.approx(st.wall_s)


def test_forward_seconds_join_each_pass_and_split_the_efficiency():
    """Per pass the seconds inside forwards (``forward_s_repeats``); ``forward_share`` is their median
    share of the pass, ``round_efficiency`` the median over rounds of the run's share over AR's, and
    ``forward_vs_curve`` the median pass's forward seconds over the curve's price; a pass without the
    timing (off CPU, an older report resumed) drops the field."""
    from specvis.bench.runner import add_repeat

    curve = {"target": [{"tokens": 1, "median_s": 0.05}, {"tokens": 5, "median_s": 0.1}]}
    common = {"n_images": 4, "config": {}, "acceptance": "exact", "lossless": True, "step_compression": 1.0,
              "mean_accepted_length": 1.0}
    ar = {"method": "ar", "target_block_sizes": {"1": 200}, **common}  # priced at 10 s
    sjd = {"method": "sjd", "target_block_sizes": {"1": 1, "5": 50}, **common}  # 5.05 s
    for run, walls, fwd in ((ar, [10.0, 20.0, 10.0], [9.0, 18.0, 9.0]), (sjd, [5.0, 10.0, 10.0], [4.0, 8.0, 9.0])):
        for w, f in zip(walls, fwd):
            add_repeat(run, w, f)
    report = {"pass_order": "interleaved per batch", "cost_curve": curve, "runs": [ar, sjd]}
    set_speedups(report)
    assert sjd["forward_s_repeats"] == [4.0, 8.0, 9.0]
    assert sjd["forward_share"] == pytest.approx(0.8) and ar["forward_share"] == pytest.approx(0.9)
    assert sjd["round_efficiency"] == pytest.approx(0.8 / 0.9) and ar["round_efficiency"] == 1.0
    assert ar["forward_vs_curve"] == pytest.approx(9.0 / 10.0)
    assert sjd["forward_vs_curve"] == pytest.approx(8.0 / 5.05)
    table = markdown_table({"model": "m", "device": "cpu", "batch_size": 1, "num_images": 4, "seed": 0,
                            "torch": "t", **report})
    assert "| forwards / curve | round efficiency |" in table and "| 1.58 | 0.89 |" in table
    add_repeat(sjd, 5.0, None)
    assert "forward_s_repeats" not in sjd and len(sjd["wall_s_repeats"]) == 4
    set_speedups(report)
    assert "round_efficiency" not in sjd and "forward_vs_curve" not in sjd and "forward_share" not in sjd
