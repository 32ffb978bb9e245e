"""Several image rows in flight (ZipAR, PJD, ``methods/rows2d.py``) on the position-aware cache.

Where the law is known: ZipAR's row 0 (and row 1 without row ends) and every grid whose rows never
overlap (``window``/``lag`` >= width) are AR; PJD's top row with the exact rule, no keep threshold and
no coupling is SJD, so PJD on non-overlapping rows is exact by the harness. Step counts follow the
official formula; a batch's rows do not depend on each other."""

import pytest
import torch
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model

import specvis as sv
from specvis.registry import build_method, parse_method_spec

GREEDY = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
P_MIN = 1e-3


@pytest.fixture(scope="module")
def wide():
    """A random 8x8 LlamaGen over 50 codes (no row end, 2-D RoPE from the cell)."""
    return tiny_llamagen(0, vocab=50, grid=8)


def _layouts():
    """Tiny models of every layout: LlamaGen (2-D RoPE), Janus-shaped (1-D RoPE, no row end),
    Emu3/Lumina-shaped (one forced row end), and two row ends."""
    return {"llamagen": tiny_llamagen(0, vocab=50, grid=6),
            "janus": tiny_prompt_model(0, vocab=7, height=6, width=6),
            "row-end": tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=1, janus=False),
            "two-row-ends": tiny_prompt_model(0, vocab=7, height=6, width=6, row_end=2, janus=False)}


@pytest.fixture(scope="module")
def layouts():
    return _layouts()


def _run(model, method, conds, sampling=GREEDY, seed=0):
    return sv.generate(model, condition_rows(model, [0, 1, 2], torch.tensor(conds)), method, sampling, seed=seed)


@pytest.mark.parametrize("window,forwards", [(3, 34), (2, 28), (5, 46), (8, 64)])
def test_zipar_forwards_follow_the_official_formula(wide, window, forwards):
    """LlamaGen-ZipAR (no row end): 1 + (W - 1) + (H - 2) s + W forwards (8x8, s = 3: 34, as the
    official loop counts them, pjd_zipar_brief D1)."""
    assert forwards == 1 + 7 + 6 * window + 8
    out = sv.generate(wide, torch.tensor([0, 1]), sv.ZipAR(window=window), GREEDY, seed=0)
    assert out.stats.target_forwards == forwards


def test_zipar_rows_zero_and_one_are_ar_and_later_rows_are_not(wide):
    """Greedy: rows 0-1 equal AR (row 1 starts once row 0 is complete), later rows differ (they see
    partial rows above): a method that waited for complete rows would equal AR everywhere."""
    ar = sv.generate(wide, torch.tensor([0, 1]), sv.AR(), GREEDY, seed=0).tokens.view(2, 8, 8)
    z = sv.generate(wide, torch.tensor([0, 1]), sv.ZipAR(window=3), GREEDY, seed=0).tokens.view(2, 8, 8)
    assert torch.equal(z[:, :2], ar[:, :2])
    assert not torch.equal(z[:, 2:], ar[:, 2:])


@pytest.mark.parametrize("name", ["llamagen", "janus", "row-end", "two-row-ends"])
def test_rows_that_never_overlap_are_ar_on_every_layout(layouts, name):
    """Greedy, window / lag = width: the next row starts when the row above is complete, so ZipAR and
    PJD are AR token for token, row ends fed as the next row's lead, on 2-D and 1-D RoPE."""
    m = layouts[name]
    ar = _run(m, sv.AR(), [0, 1, 2]).tokens
    assert torch.equal(_run(m, sv.ZipAR(window=6), [0, 1, 2]).tokens, ar)
    assert torch.equal(_run(m, sv.PJD(lag=6, keep_threshold=1.0), [0, 1, 2]).tokens, ar)


@pytest.mark.parametrize("name", ["llamagen", "janus", "row-end", "two-row-ends"])
def test_zipar_row_zero_is_ar_and_rows_run_in_parallel(layouts, name):
    """Greedy, window 2 on 6x6: row 0 equals AR; fewer forwards than the 36 image tokens (rows in
    flight; row ends cost no forward of their own)."""
    m = layouts[name]
    ar = _run(m, sv.AR(), [0, 1, 2]).tokens.view(3, 6, 6)
    z = _run(m, sv.ZipAR(window=2), [0, 1, 2])
    assert torch.equal(z.tokens.view(3, 6, 6)[:, 0], ar[:, 0])
    expected = 1 + 5 + 4 * 2 + 6 if name in ("llamagen", "janus") else 1 + 5 * 2 + 5
    assert z.stats.target_forwards == expected


@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_a_batch_decodes_each_sample_as_alone(layouts, name):
    """Greedy, per-sample rows: a batch of 8 mixed conditions gives each sample the tokens it gets
    alone (ZipAR; PJD whose rows never overlap, deterministic under greedy); no lock-step, no min over
    the batch."""
    m = layouts[name]
    conds = [0, 1, 2, 1, 0, 2, 2, 1]
    for method in (sv.ZipAR(window=2), sv.PJD(lag=6, window=4, keep_threshold=1.0)):
        batch = _run(m, method, conds).tokens
        for i in (0, 1, 2):
            assert torch.equal(_run(m, method, [conds[i]]).tokens[0], batch[i]), (method, i)


def test_pjd_batch_progress_is_per_sample(wide):
    """T = 1: each sample commits at its own pace (official PJD commits the minimum over the batch, so
    every sample would commit the same block sizes at the same positions): the accept maps (tokens
    committed by the forward that committed each token) differ between samples of one batch, and the
    batch needs fewer forwards than AR."""
    out = sv.generate(wide, torch.tensor([0, 1, 2, 0]), sv.PJD(), sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream"), seed=3)
    maps = out.stats.accept_map.flatten(1)
    assert out.stats.target_forwards < 64
    assert all(not torch.equal(maps[0], maps[i]) for i in (1, 2, 3))


def _rounds(accept_map: torch.Tensor) -> torch.Tensor:
    """Per sample, the forwards it was active in: every round of an unfinished sample commits >= 1 image
    token (its top row's), and each token's accept-map entry is the count its round committed, so the
    sum of 1 / entry over the grid counts the rounds (the prefill included)."""
    return (1.0 / accept_map.flatten(1).double()).sum(1).round().long()


@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_a_sample_does_not_wait_for_its_batch_neighbours(layouts, name):
    """T = 1, overlapping rows (PJD with drafts, coupling, the vertical prior and GSD; ZipAR): with the same
    seed (the same random numbers at each sample's index) sample 0 gets the same tokens, accept map and
    rounds whatever its neighbours are. A row gated by another sample (official PJD's minimum over the
    batch, a block's padding visible to a shorter sample, a schedule decision taken on the batch) would
    change it, since the neighbours here run different conditions at different paces."""
    m = layouts[name]
    t1 = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    for method in (sv.PJD(window=4, lag=2, init="vertical-repeat", coupling="gumbel"),
                   build_method(*parse_method_spec("pjd:window=4:lag=1:accept=gsd:group=8:delta_p=0.5")),
                   sv.ZipAR(window=1)):
        for seed in (1, 2):
            a = _run(m, method, [0, 1, 1, 2], t1, seed=seed)
            b = _run(m, method, [0, 2, 2, 1], t1, seed=seed)
            assert torch.equal(a.tokens[0], b.tokens[0]), (method, seed)
            assert torch.equal(a.stats.accept_map[0], b.stats.accept_map[0]), (method, seed)
            ra, rb = _rounds(a.stats.accept_map), _rounds(b.stats.accept_map)
            assert ra[0] == rb[0]
            # the batch's forwards are its slowest sample's rounds: nothing runs past the last sample
            assert a.stats.target_forwards == int(ra.max()) and b.stats.target_forwards == int(rb.max())
            if isinstance(method, sv.PJD):  # the neighbours really committed at other paces (other block lengths)
                assert not torch.equal(a.stats.accept_map[1:], b.stats.accept_map[1:])


@pytest.mark.parametrize("init", ["random", "vertical-repeat"])
def test_pjd_non_overlapping_rows_are_exact_by_the_harness(target, init):
    """2x2 harness, lag >= width: the top row only, the exact rule with residual and bonus, no keep
    threshold, no coupling: SJD's law, i.e. AR's (a wrong residual or bonus shifts it; so does a copied
    first draft verified against a law other than its point mass)."""
    sampling = sv.Sampling(temperature=0.9, cfg_scale=2.0, noise="stream")
    assert check_method(target, sv.PJD(window=2, keep_threshold=1.0, init=init), sampling) > P_MIN


def test_zipar_two_rows_without_row_end_are_exact_by_the_harness(target):
    """2x2 harness, window 1: row 1 still waits for row 0 (no row end to start it), so ZipAR is AR."""
    assert check_method(target, sv.ZipAR(window=1), sv.Sampling(temperature=0.9, cfg_scale=2.0, noise="stream")) > P_MIN


@pytest.mark.parametrize("make,message", [
    (lambda: sv.ZipAR(window=0), "ZipAR.window must be an integer >= 1, got 0"),
    (lambda: sv.PJD(window=1), "PJD.window must be an integer >= 2, got 1"),
    (lambda: sv.PJD(lag=0), "PJD.lag must be an integer >= 1, got 0"),
    (lambda: sv.PJD(coupling="maximal"), "PJD.coupling must be one of none, gumbel, got 'maximal'"),
    (lambda: sv.PJD(keep_threshold=2), "PJD.keep_threshold must be a finite number in [0, 1], got 2"),
    (lambda: sv.PJD(rcm=1), "PJD.rcm must be"),
])
def test_bad_fields_are_one_line_errors(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("spec,needle", [("zipar:window=0", "window"), ("pjd:lag=x", "lag"),
                                         ("pjd:gamma=3", "method pjd has no option 'gamma'")])
def test_bad_specs_are_one_line_errors(spec, needle):
    with pytest.raises(ValueError) as err:
        build_method(*parse_method_spec(spec))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_registry_names_the_methods():
    assert isinstance(build_method(*parse_method_spec("zipar:window=4")), sv.ZipAR)
    m = build_method(*parse_method_spec("pjd:window=6:lag=4:accept=gsd"))
    assert isinstance(m, sv.PJD) and (m.window, m.lag) == (6, 4) and isinstance(m.acceptance, sv.GSD)


def test_pjd_lower_rows_commit_only_accepted_drafts(wide):
    """Greedy on a random model: a lower row commits a draft only when it equals the target's argmax
    (no residual, no bonus), so some of its rounds commit nothing; a lower row given a residual
    or bonus token would commit at least one token each time it predicts."""
    out = sv.generate(wide, torch.tensor([0, 1]), sv.PJD(window=4, lag=3), GREEDY, seed=0)
    x = out.stats.extra
    assert x["lower_row_rounds"] > 20
    assert x["lower_tokens"] < 0.8 * x["lower_row_rounds"]  # measured 27 of 49; a bonus gives >= 49
    assert x["top_tokens"] + x["lower_tokens"] == 2 * 64 - 2  # the prefill's tokens are no row's


def _mask_case(rcm: bool):
    """A context in which row 0 has 4 committed tokens and row 1 one, each with drafts; the block."""
    from specvis.methods.base import DecodeContext
    from specvis.methods.rows2d import Rows
    from specvis.methods.views import guided_view
    from specvis.models.base import Condition

    m = tiny_llamagen(0, vocab=50, grid=8)
    view = guided_view(m, Condition.of(m, torch.tensor([0])), sv.Sampling(noise="stream"), 256)
    ctx = DecodeContext(view, torch.Generator().manual_seed(0), 256)
    view.prefill()
    ctx.commit(torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]))
    ctx.commit(torch.tensor([[5]]), torch.tensor([1]), at=torch.tensor([[8]]))
    view.track_positions()
    rows = Rows(ctx, lag=2, chain=3, rcm=rcm)
    rows.started[0, :2] = True
    rows.c[0, :2] = torch.tensor([4, 1])
    return rows.block(torch.tensor([[3, 3, 0, 0, 0, 0, 0, 0]]), torch.full((1, 8, 2), 7))


@pytest.mark.parametrize("rcm", [True, False])
def test_the_block_mask_is_raster_causal_and_the_row_causal_mask_hides_drafts_above(rcm):
    """Fed: row 0 [x (0,3), d (0,4), d (0,5)], row 1 [x (1,0), d (1,1), d (1,2)]. Row 1's queries (stream
    8..10) see row 0's committed x (3 < 8) and never its drafts under RCM (PJD); without RCM raster
    order lets them; nobody sees a later position; each row sees its own chain causally."""
    b = _mask_case(rcm)
    assert b.positions[0].tolist() == [3, 4, 5, 8, 9, 10]
    mask = b.mask[0]
    assert mask[3:, 0].all()  # row 0's x: committed, earlier
    assert bool(mask[3:, 1:3].any()) == (not rcm)  # row 0's drafts
    assert not mask[:3, 3:].any()  # row 0 never sees row 1
    causal = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    assert torch.equal(mask[:3, :3], causal) and torch.equal(mask[3:, 3:], causal)


def test_cli_generate_and_bench_take_the_2d_methods(tmp_path):
    """``--method zipar|pjd`` with their fields as flags, and bench specs, from the registry alone."""
    import json

    from specvis.cli import main

    assert main(["generate", "--model", "random-tiny", "--method", "zipar", "--window", "3", "--class", "1", "2",
                 "--out", str(tmp_path / "z")]) == 0
    assert json.loads((tmp_path / "z" / "stats.json").read_text())["target_forwards"] == 34
    assert main(["generate", "--model", "random-tiny", "--method", "pjd", "--lag", "4", "--accept", "gsd",
                 "--out", str(tmp_path / "p")]) == 0
    j = tmp_path / "b.json"
    assert main(["bench", "--model", "random-tiny", "--methods", "zipar:window=4,pjd:window=4:lag=4", "--num", "2",
                 "--batch-size", "2", "--json", str(j)]) == 0
    runs = json.loads(j.read_text())["runs"]
    assert [r["method"] for r in runs] == ["ar", "zipar", "pjd"] and not runs[1]["lossless"]
    assert runs[1]["config"] == {"window": 4} and runs[1]["step_compression"] > 1.0


@pytest.mark.parametrize("name", ["llamagen", "row-end"])
def test_same_output_with_live_spans(layouts, name):
    """Live attention spans (a bucket of 3 slots, every forward checked to attend nothing past its span)
    give the tokens, forwards and accept maps of whole-cache attention: the rows' out-of-order cache
    stays inside the bound the spans assume."""
    from test_live_attention import live

    m = layouts[name]
    sampling = sv.Sampling(temperature=1.0, cfg_scale=2.0, noise="stream")
    for method in (sv.ZipAR(window=2), sv.PJD(window=4, lag=2, init="vertical-repeat")):
        outs = []
        for bucket in (0, 3):
            with live(bucket):
                outs.append(_run(m, method, [0, 1, 2, 1], sampling, seed=5))
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        assert outs[0].stats.target_forwards == outs[1].stats.target_forwards
        assert torch.equal(outs[0].stats.accept_map, outs[1].stats.accept_map)
