"""The SJD successors' relaxed rules: LANTERN++'s relative budget (``Lantern(budget="relative")``), the
min-TV residual (Cool-SD) of relaxed rules, and GSD (``specvis.gsd``), checked against loop references
on tiny enumerable models with the measurement helpers of tests/test_lantern.py (tol, conditional_tvs)."""

from __future__ import annotations

import pytest
import torch
from exactness import condition_rows, exact_law, sample_counts, tiny_prompt_model
from test_lantern import _cache, codebook, draft, target  # noqa: F401 (the same fixtures)
from test_lantern import PLAIN, V, conditional_tvs, ref_neighbours, tol, tv

import specvis as sv
from specvis.accept import Exact, RuleTables, verify_chain
from specvis.generate import bind_rule
from specvis.bench.relaxed_tv import one_step_law
from specvis.gsd import GSD, input_embeddings, normalised_table
from specvis.lantern import Lantern
from specvis.registry import method_from_spec


# ---------------------------------------------------------------- references (loops, float64)

def ref_relative_set(p, x, nb, lam):
    """A_x of the relative budget: neighbours in table order while their mass <= (lam - 1) p(x)."""
    a_set, moved = [x], 0.0
    for y in nb[x].tolist()[1:]:
        if moved + p[y].item() > (lam - 1) * p[x].item():
            break
        a_set.append(y)
        moved += p[y].item()
    return a_set


def ref_gsd_alpha(p, q, x, below, above, delta_p, dist=None, max_dist=None):
    order = sorted(range(p.shape[-1]), key=lambda i: (p[i].item(), i))
    r = order.index(x)
    window = order[max(0, r - below): r + above + 1]
    c = [y for y in window if y == x or (abs(p[y].item() - p[x].item()) < delta_p
                                         and (max_dist is None or dist[x, y].item() < max_dist))]
    big_p, big_q = sum(p[y].item() for y in c), sum(q[y].item() for y in c)
    return 1.0 if big_q == 0 else min(1.0, big_p / big_q)


def ref_gsd_law(p, q, below, above, delta_p, residual, dist=None, max_dist=None):
    """The committed token's law after one GSD step with x ~ q (every x enumerated)."""
    p, q = p.double(), q.double()
    f = torch.tensor([ref_gsd_alpha(p, q, y, below, above, delta_p, dist, max_dist) for y in range(p.shape[-1])],
                     dtype=torch.float64)
    res = (p - q).clamp_min(0) if residual == "paper" else (p - q * f).clamp_min(0)
    r = res / res.sum() if res.sum() > 1e-12 else p
    return q * f + (q * (1 - f)).sum() * r


# ---------------------------------------------------------------- config, registry, CLI

def test_validation_registry_and_cli():
    for cls, bad, field in [(Lantern, {"lam": 0.5}, "lam"), (Lantern, {"lam": True}, "lam"),
                            (Lantern, {"residual": "tv"}, "residual"), (Lantern, {"budget": "lam"}, "budget"),
                            (GSD, {"group": -1}, "group"), (GSD, {"group": 2.5}, "group"), (GSD, {"delta_p": 1.5}, "delta_p"),
                            (GSD, {"max_dist": -1.0}, "max_dist"), (GSD, {"embedding": "vq"}, "embedding"),
                            (GSD, {"residual": "exact"}, "residual"), (GSD, {"ranks": "7"}, "ranks"),
                            (GSD, {"ranks": (-1, 2)}, "ranks")]:
        with pytest.raises(ValueError, match=f"{cls.__name__}.{field}"):
            cls(**bad)
    from specvis.registry import method_from_spec
    assert GSD(ranks=(7, 6)).window == (7, 6) == GSD(group=3, ranks="official").window and GSD(group=25).window == (12, 12)
    assert method_from_spec("sjd:accept=gsd:ranks=7,6").acceptance.window == (7, 6)  # the --gsd-ranks spelling
    assert method_from_spec("sjd:accept=gsd:ranks=7/6").acceptance.window == (7, 6)  # inside a bench --methods list
    m = method_from_spec("sjd:window=8:accept=gsd:group=25")
    assert m.window == 8 and m.acceptance == GSD(group=25) and not m.lossless
    m = method_from_spec("speculative:gamma=2:accept=lantern:budget=relative:lam=3:residual=min-tv")
    assert m.acceptance == Lantern(budget="relative", lam=3, residual="min-tv")
    from specvis.cli import _method, build_parser
    a = build_parser().parse_args(["generate", "--method", "sjd", "--accept", "gsd", "--gsd-group", "6", "--gsd-delta-p",
                                   "0.1", "--gsd-max-dist", "0.5", "--gsd-embedding", "codebook", "--residual", "min-tv"])
    assert _method(a).acceptance == GSD(group=6, delta_p=0.1, max_dist=0.5, embedding="codebook", residual="min-tv")
    a = build_parser().parse_args(["generate", "--method", "speculative", "--accept", "lantern", "--lantern-budget",
                                   "relative", "--lantern-lam", "4"])
    assert _method(a).acceptance == Lantern(budget="relative", lam=4.0)


# ---------------------------------------------------------------- LANTERN++ relative budget

def test_relative_budget_never_exceeds_lam(codebook):
    g = torch.Generator().manual_seed(4)
    cb = torch.randn(40, 3, generator=g)
    nb = ref_neighbours(cb, "l2")
    p = torch.softmax(torch.randn(300, 40, generator=g) * 2, -1)
    x = torch.randint(40, (300,), generator=g)
    for lam in (1.0, 1.5, 3.0, 10.0):
        rule = Lantern(k=40, budget="relative", lam=lam).bind(RuleTables(cb))
        ids, in_a, p_a = rule.neighbourhood(p, x)
        px = p.gather(-1, x[:, None]).squeeze(-1)
        assert (p_a <= lam * px * (1 + 1e-6)).all()
        for r in range(0, 300, 7):  # the longest such prefix, as the loop reference
            a_set = ref_relative_set(p[r].double(), x[r].item(), nb, lam)
            assert ids[r][in_a[r]].tolist() == a_set
    # lam = 1 is Exact bitwise (softmax: no zero-mass neighbours)
    q = torch.softmax(torch.randn(300, 40, generator=g), -1)
    for residual in ("paper", "min-tv"):
        got = Lantern(k=40, budget="relative", lam=1.0, residual=residual).bind(RuleTables(cb))(p, q, x)
        assert all(torch.equal(a, b) for a, b in zip(got, Exact()(p, q, x)))
    # residuals: "paper" resamples from the distorted target, "min-tv" from max(0, p - q) (module docstring)
    rule = Lantern(k=40, budget="relative", lam=3.0).bind(RuleTables(cb))
    assert torch.equal(rule(p, q, x)[1], (rule.distorted(p, x, q) - q).clamp_min(0))
    assert torch.equal(Lantern(k=40, budget="relative", lam=3.0, residual="min-tv").bind(RuleTables(cb))(p, q, x)[1],
                       (p - q).clamp_min(0))
    assert not torch.equal(rule(p, q, x)[1], (p - q).clamp_min(0))


def test_relative_budget_measured_within_its_bound(target, draft, codebook):
    """Speculative + relative budget + min-TV residual: token 1's measured law matches the one-step law,
    and TV(O, p) = sum_x [min(q, p(A_x)) - min(q, p(x))] <= min(TV(p, q), (lam - 1) p(q > p))."""
    lam, n = 3.0, 12_000
    rule = Lantern(k=V, budget="relative", lam=lam, residual="min-tv")
    law = exact_law(target, [1], PLAIN)
    counts = sample_counts(target, [1], sv.Speculative(2, acceptance=rule), PLAIN, n=n, draft=draft, codebook=codebook)
    with torch.no_grad():
        x0 = torch.arange(V)[:, None]
        c = torch.ones(V, dtype=torch.long)
        p = PLAIN.probs(target.logits(c, x0))[:, 1].double()
        q = PLAIN.probs(draft.logits(c, x0))[:, 1].double()
    nb = ref_neighbours(codebook, "l2")
    bound_seen = 0
    for i, _, pre, m, emp_tv in conditional_tvs(counts, law, 4):
        if i != 1:
            continue
        pp, qq = p[pre], q[pre]
        gain = sum(min(qq[x].item(), pp[ref_relative_set(pp, x, nb, lam)].sum().item()) - min(qq[x].item(), pp[x].item())
                   for x in range(V))
        bound = min(tv(pp, qq), (lam - 1) * pp[qq > pp].sum().item())
        assert gain <= bound + 1e-9
        assert emp_tv <= gain + tol(m)
        bound_seen += gain > 2 * tol(m)
        exact1, _ = one_step_law(rule.bind(RuleTables(codebook)), pp[None].float(), qq[None].float())
        assert abs(tv(exact1[0], pp) - gain) < 1e-4  # the min-TV residual attains D exactly
        cnt = counts.reshape(V, V, -1).sum(-1)[pre]
        assert tv(cnt / cnt.sum(), exact1[0]) <= tol(m)
    assert bound_seen >= 1  # the relaxation is visible


# ---------------------------------------------------------------- GSD

def test_gsd_rule_matches_loop_reference_and_is_vectorised():
    g = torch.Generator().manual_seed(5)
    B, W, Vb = 3, 4, 12
    p = torch.softmax(torch.randn(B, W, Vb, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(B, W, Vb, generator=g) * 1.5, -1)
    x = torch.randint(Vb, (B, W), generator=g)
    emb = torch.randn(Vb, 3, generator=g)
    table = normalised_table(emb)
    dist = torch.cdist(table.double(), table.double()).square()
    for kw in ({"group": 4, "delta_p": 0.2}, {"ranks": (7, 6), "delta_p": 0.15},
               {"group": 6, "delta_p": 0.3, "max_dist": 0.9}):
        for residual in ("paper", "min-tv"):
            rule = GSD(**kw, residual=residual).bind(RuleTables(embeddings=emb))
            alpha, res = rule(p, q, x)
            below, above = rule.below, rule.above
            for b in range(B):
                a_row, r_row = rule(p[b:b + 1], q[b:b + 1], x[b:b + 1])  # one row at a time: the same
                assert torch.equal(a_row[0], alpha[b]) and torch.equal(r_row[0], res[b])
                for j in range(W):
                    a_one, r_one = rule(p[b, j], q[b, j], x[b, j])  # one position: the same values
                    assert torch.allclose(a_one, alpha[b, j]) and torch.allclose(r_one, res[b, j])
                    ref = ref_gsd_alpha(p[b, j].double(), q[b, j].double(), x[b, j].item(), below, above,
                                        kw["delta_p"], dist, kw.get("max_dist"))
                    assert abs(alpha[b, j].item() - ref) < 1e-5
                    f = torch.tensor([ref_gsd_alpha(p[b, j].double(), q[b, j].double(), y, below, above, kw["delta_p"],
                                                    dist, kw.get("max_dist")) for y in range(Vb)])
                    want = (p[b, j] - q[b, j] * (f.float() if residual == "min-tv" else 1.0)).clamp_min(0)
                    assert torch.allclose(res[b, j], want, atol=1e-6)
    # the window: group 4 = 2 ranks each side; the (7, 6) preset: 7 below, 6 above
    assert (GSD(group=4).bind().below, GSD(group=4).bind().above) == (2, 2)
    # one-step law of the enumeration helper (used by docs/results/archive/relaxed-tv) vs the loop reference
    for residual in ("paper", "min-tv"):
        out, _ = one_step_law(GSD(group=4, delta_p=0.2, residual=residual).bind(), p[0].double(), q[0].double())
        for j in range(W):
            assert torch.allclose(out[j], ref_gsd_law(p[0, j], q[0, j], 2, 2, 0.2, residual), atol=1e-9)


def test_gsd_singleton_cluster_is_exact(target, draft):
    s = sv.Sampling(temperature=0.9, cfg_scale=2.0, top_k=4, noise="stream")
    cond = torch.arange(200) % 3
    ref_sp = sv.generate(target, cond, sv.Speculative(3), s, seed=7, draft=draft).tokens
    ref_sjd = sv.generate(target, cond, sv.SJD(window=3, acceptance=Exact()), s, seed=7).tokens
    for rule in (GSD(group=0), GSD(group=8, delta_p=0.0), GSD(group=1, residual="min-tv"),
                 GSD(group=8, max_dist=0.0, embedding="input")):
        assert torch.equal(sv.generate(target, cond, sv.Speculative(3, acceptance=rule), s, seed=7, draft=draft).tokens,
                           ref_sp)
        assert torch.equal(sv.generate(target, cond, sv.SJD(window=3, acceptance=rule), s, seed=7).tokens, ref_sjd)


def test_gsd_distance_filter_on_a_row_end_layout():
    """Emu3's layout (a row-end id after each grid row; laws over 3 codes + 1 structural id, the input
    embeddings over the codes only). The distance filter runs through ``sv.generate`` (it raised "GSD
    embedding table has 3 rows for a vocabulary of 4"), commits codes only, and with singleton clusters
    (max_dist 0) is Exact token for token. The structural id joins no code's cluster: below it passes
    the rank, probability and (huge max_dist) distance filters, and its q of 0.2 would make x = 1's
    acceptance P/Q = 0.2 / 0.9 instead of 0.2 / 0.7; at a forced position x is the row end, accepted."""
    model = tiny_prompt_model(0, janus=False, row_end=1, height=2, width=3)
    cond = condition_rows(model, [0, 1, 2, 0, 1, 2])
    out = sv.generate(model, cond, sv.SJD(window=4, acceptance=GSD(group=4, delta_p=0.5, max_dist=2.0)), PLAIN, seed=0)
    assert out.tokens.shape == (6, 6) and int(out.tokens.max()) < 3
    exact = sv.generate(model, cond, sv.SJD(window=4, acceptance=Exact()), PLAIN, seed=0).tokens
    single = GSD(group=4, delta_p=0.5, max_dist=0.0)
    assert torch.equal(sv.generate(model, cond, sv.SJD(window=4, acceptance=single), PLAIN, seed=0).tokens, exact)

    rule = bind_rule(GSD(group=4, delta_p=0.5, max_dist=1e6), None, model)
    p, q = torch.tensor([[0.1, 0.1, 0.8, 0.0]]), torch.tensor([[0.4, 0.3, 0.1, 0.2]])
    alpha, _ = rule(p, q, torch.tensor([1]))
    assert alpha.item() == pytest.approx(0.2 / 0.7)
    codes_only = GSD(group=4, delta_p=0.5, max_dist=1e6).bind(RuleTables(embeddings=input_embeddings(model)))
    assert alpha.item() == pytest.approx(codes_only(p[:, :3], q[:, :3], torch.tensor([1]))[0].item())
    point = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    assert rule(point, point, torch.tensor([3]))[0].item() == 1.0


def test_gsd_measured_law_matches_enumeration(target):
    """SJD + GSD: token 1 (always a random-init draft, q uniform) follows the enumerated one-step law,
    whose TV to p is visibly > 0 (GSD is lossy)."""
    rule, n = GSD(group=4, delta_p=0.8), 12_000
    law = exact_law(target, [1], PLAIN)
    counts = sample_counts(target, [1], sv.SJD(window=3, acceptance=rule), PLAIN, n=n)
    with torch.no_grad():
        p = PLAIN.probs(target.logits(torch.ones(V, dtype=torch.long), torch.arange(V)[:, None]))[:, 1].double()
    q = torch.full((V,), 1.0 / V, dtype=torch.float64)
    lossy = 0
    for i, _, pre, m, emp_tv in conditional_tvs(counts, law, 4):
        if i != 1:
            continue
        exact1 = ref_gsd_law(p[pre], q, 2, 2, 0.8, "paper")
        cnt = counts.reshape(V, V, -1).sum(-1)[pre]
        assert tv(cnt / cnt.sum(), exact1) <= tol(m)
        if tv(exact1, p[pre]) > 2 * tol(m):
            assert emp_tv > tol(m)
            lossy += 1
    assert lossy >= 1


def test_min_tv_residual_beats_paper_residual_measured():
    """A case where GSD accepts less than Exact: the paper residual max(0, p - q) overshoots; the
    min-TV residual's measured TV is lower (and equals sum max(0, q f - p))."""
    p = torch.tensor([0.8347, 0.0042, 0.0070, 0.1411, 0.0131], dtype=torch.float64)
    q = torch.tensor([0.1309, 0.1233, 0.4456, 0.1392, 0.1611], dtype=torch.float64)
    p, q = p / p.sum(), q / q.sum()
    n = 400_000
    gen = torch.Generator().manual_seed(11)
    measured = {}
    for residual in ("paper", "min-tv"):
        rule = GSD(group=2, delta_p=0.3, residual=residual)
        x = torch.multinomial(q.float().expand(n, -1), 1, replacement=True, generator=gen)
        walk = verify_chain(rule, p.float().expand(n, 2, -1), q.float().expand(n, 1, -1), x, gen)
        accepted, nxt = walk.accepted, walk.next
        out = torch.where(accepted > 0, x[:, 0], nxt)
        emp = torch.bincount(out, minlength=5).double() / n
        exact = ref_gsd_law(p, q, 1, 1, 0.3, residual)
        assert tv(emp, exact) <= tol(n)
        measured[residual] = tv(emp, p)
        if residual == "min-tv":
            f = torch.tensor([ref_gsd_alpha(p, q, y, 1, 1, 0.3) for y in range(5)], dtype=torch.float64)
            assert abs(tv(exact, p) - (q * f - p).clamp_min(0).sum().item()) < 1e-12
    assert measured["min-tv"] + 2 * tol(n) < measured["paper"]


def test_gsd_binding_and_trees(target, draft, codebook):
    cond = torch.arange(6) % 3
    emb = input_embeddings(target)
    assert torch.equal(emb, target.tok_embeddings.weight[:V])
    rule = GSD(group=4, max_dist=1.0)
    with pytest.raises(ValueError, match="GSD.max_dist"):
        rule(torch.full((1, V), 1 / V), torch.full((1, V), 1 / V), torch.zeros(1, dtype=torch.long))
    out = sv.generate(target, cond, sv.SJD(window=3, acceptance=rule), PLAIN, seed=1)  # input embeddings, no codebook
    bound = rule.bind(RuleTables(embeddings=emb))
    assert torch.equal(out.tokens, sv.generate(target, cond, sv.SJD(window=3, acceptance=bound), PLAIN, seed=1).tokens)
    with pytest.raises(ValueError, match="codebook"):
        sv.generate(target, cond, sv.SJD(window=3, acceptance=GSD(max_dist=1.0, embedding="codebook")), PLAIN)
    sv.generate(target, cond, sv.SJD(window=3, acceptance=GSD(max_dist=1.0, embedding="codebook")), PLAIN,
                codebook=codebook)
    # a tree method is refused GSD when it is built (GSD declares walks={"chain"}), not when it runs
    for make in (lambda: sv.EagleTree(depth=2, top_k=2, total_tokens=4, acceptance=GSD()),
                 lambda: sv.ADTTree(acceptance=GSD(group=4)), lambda: sv.StaticTree(acceptance=GSD()),
                 lambda: method_from_spec("eagle:accept=gsd")):
        with pytest.raises(ValueError) as e:
            make()
        assert "rule gsd is not supported with" in str(e.value) and "walks chain only" in str(e.value)
        assert "use exact or coupled or lantern" in str(e.value) and "\n" not in str(e.value)
    assert "(no sibling rule for draft trees)" in str(pytest.raises(ValueError, sv.EagleTree, acceptance=GSD()).value)
