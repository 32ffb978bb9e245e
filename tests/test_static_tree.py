"""StaticTree (LANTERN++ static trees): exact law (chi-square on the tiny LlamaGen with CFG / top-k),
greedy equals greedy AR (class-conditional and a prompt model with forced row ends), the sibling-wise
recursive rejection against the enumeration of its output law, siblings drawn without replacement,
topology checks, LANTERN++ (the relative LANTERN rule on static trees: enumerated walk within its
bound, lam = 1 token for token Exact), GSD's refusal and the registry / CLI names.
"""

import itertools

import pytest
import torch
from exactness import check_method, condition_rows, tiny_prompt_model

import specvis as sv
import specvis.methods.static_tree as st
from specvis.accept import Exact, RuleTables, normalise
from specvis.cli import _method, build_parser
from specvis.registry import describe, method_from_spec
from specvis.models.drafter import EagleDrafter

P_MIN = 1e-3
N = 8000
WIDE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 3 siblings at the root
CASES = {
    "wide_t1_cfg_topk": (WIDE, sv.Sampling(temperature=1.0, top_k=3, cfg_scale=2.0, noise="stream")),
    "four_three_t1_cfg": ([[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0]], sv.Sampling(temperature=1.0, cfg_scale=2.5, noise="stream")),
    "chainlike_t07_topk": ([[0], [1], [0, 0], [0, 0, 0]], sv.Sampling(temperature=0.7, top_k=2, cfg_scale=1.5, noise="stream")),
    # one child per node: verified as a chain (round._verify_path), deeper than the grid and shorter than it
    "chain_t1_cfg": ("chain", sv.Sampling(temperature=1.0, cfg_scale=2.5, noise="stream")),
    "chain2_t07_topk": ([[0], [0, 0]], sv.Sampling(temperature=0.7, top_k=2, cfg_scale=1.5, noise="stream")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_static_tree_is_exact(target, drafter, case):
    tree, sampling = CASES[case]
    assert check_method(target, sv.StaticTree(tree=tree), sampling, n=N, batch=N, drafter=drafter) > P_MIN


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "naive_extend_57", WIDE, "chain"], ids=["mc_sim", "naive57", "wide", "chain"])
def test_greedy_static_tree_equals_greedy_ar(target, drafter, tree):
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
    cond = torch.arange(48) % 3
    ar = sv.generate(target, cond, sv.AR(), greedy, seed=0).tokens
    out = sv.generate(target, cond, sv.StaticTree(tree=tree), greedy, seed=5, drafter=drafter)
    assert torch.equal(ar, out.tokens)
    assert out.stats.target_forwards <= ar.shape[1] and out.stats.draft_forwards > 0


def test_prompt_model_with_row_ends(drafter):
    """Emu3-shaped prompt model, a forced row end after each image row: runs (the node at a forced
    position has one child, its structural id), temperature-1 output is well formed, greedy equals AR."""
    model = tiny_prompt_model(0, janus=False, row_end=1)
    head = EagleDrafter.from_target(model, seed=1).eval()
    cond = condition_rows(model, [0, 1, 2], torch.arange(12) % 3)
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream")
    ar = sv.generate(model, cond, sv.AR(), greedy, seed=0).tokens
    out = sv.generate(model, cond, sv.StaticTree(tree=WIDE), greedy, seed=3, drafter=head)
    assert torch.equal(ar, out.tokens)
    hot = sv.generate(model, cond, sv.StaticTree(tree="mc_sim_7b_63"), sv.Sampling(cfg_scale=2.0, noise="stream"), seed=3, drafter=head)
    assert hot.tokens.shape == ar.shape and int(hot.tokens.max()) < model.layout.vocab_size


@pytest.mark.parametrize("tree", [WIDE, "chain"], ids=["wide", "chain"])
def test_prompt_model_with_row_ends_is_exact(tree):
    model = tiny_prompt_model(0, janus=False, row_end=1)
    head = EagleDrafter.from_target(model, seed=1).eval()
    assert check_method(model, sv.StaticTree(tree=tree), sv.Sampling(cfg_scale=2.5, top_k=2, noise="stream"), n=N, batch=N,
                        drafter=head) > P_MIN


# ---------------------------------------------------------------- the sibling rule, enumerated


def without_replacement(q: torch.Tensor, k: int):
    """Every ordered k-tuple of distinct tokens with its probability under k draws from q without
    replacement (each draw from q restricted to the undrawn tokens, renormalised); written here, not
    with specvis's helpers. Tuples stop early where q has no mass left."""
    support = [i for i in range(q.shape[0]) if q[i] > 0]
    out = []
    for tup in itertools.permutations(support, min(k, len(support))):
        prob, left = 1.0, 1.0
        for x in tup:
            prob *= float(q[x]) / left
            left -= float(q[x])
        out.append((tup, prob))
    return out


def walk_law(rule, p: torch.Tensor, q: torch.Tensor, tup) -> torch.Tensor:
    """Exact output law of the sibling walk over children ``tup`` (the walk of verify_tree, with the
    acceptance coins integrated out)."""
    out, mass, cur_p, cur_q = torch.zeros_like(p), 1.0, p, q
    for x in tup:
        alpha, residual, q_next = rule.sibling_q(cur_p, cur_q, torch.tensor(x))
        out[x] += mass * float(alpha)
        mass *= 1.0 - float(alpha)
        cur_p, cur_q = normalise(residual, cur_p), q_next
    return out + mass * cur_p


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sibling_recursive_rejection_is_exact(k, seed):
    g = torch.Generator().manual_seed(seed)
    V = 5
    p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    p[seed % V] = 0.0  # a token the target never emits
    q[(seed + 2) % V] = 0.0  # and one the drafter never drafts
    p, q = p / p.sum(), q / q.sum()
    law = sum(prob * walk_law(Exact(), p, q, tup) for tup, prob in without_replacement(q, k))
    assert 0.5 * float((law - p).abs().sum()) < 1e-6
    # teeth: a walk that forgets to remove the rejected sibling from q is not exact
    if k >= 2:
        stale = sum(prob * walk_law(StaleQ(), p, q, tup) for tup, prob in without_replacement(q, k))
        assert 0.5 * float((stale - p).abs().sum()) > 1e-3


def walk_bound(rule, p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """BoundLantern.sibling_q's bound: TV of the chain rule's one-step law on (p, q), plus, for every
    first sibling x, P(x drawn and rejected) times the bound of the rest of the walk on its residual."""
    if k == 0:
        return 0.0
    chain, rest = torch.zeros_like(p), 0.0
    for x in range(p.shape[0]):
        if q[x] == 0:
            continue
        alpha, residual, q_next = rule.sibling_q(p, q, torch.tensor(x))
        p_next = normalise(residual, p)
        chain[x] += q[x] * alpha
        chain += q[x] * (1 - alpha) * p_next
        if float(q.sum() - q[x]) > 1e-12:
            rest += float(q[x] * (1 - alpha)) * walk_bound(rule, p_next, q_next, k - 1)
    return 0.5 * float((chain - p).abs().sum()) + rest


@pytest.mark.parametrize("budget", [{"budget": "relative", "lam": 3.0}, {"budget": "paper", "delta": 0.2},
                                    {"budget": "output", "delta": 0.2, "residual": "min-tv"}])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_lantern_sibling_walk_within_its_bound(budget, k):
    """LANTERN++ on a static node: the enumerated law of the walk is within BoundLantern.sibling_q's
    bound and (paper, relative) really distorted, so the bound is exercised; lam = 1 is Exact's walk (law p).
    Catches a relaxed walk whose q is not updated (StaleQ-like) only through the lam = 1 case."""
    g = torch.Generator().manual_seed(k)
    V = 6
    p = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    q = torch.rand(V, generator=g, dtype=torch.float64) ** 2
    p, q = p / p.sum(), q / q.sum()
    codebook = torch.randn(V, 3, generator=g)
    rule = sv.Lantern(k=4, **budget).bind(RuleTables(codebook))
    seqs = without_replacement(q, k)
    law = sum(prob * walk_law(rule, p, q, tup) for tup, prob in seqs)
    tv = 0.5 * float((law - p).abs().sum())
    assert tv <= walk_bound(rule, p, q, k) + 1e-9
    assert tv > 1e-4 or budget["budget"] == "output"  # "output" may accept nothing more than Exact here
    exact = sv.Lantern(k=4, budget="relative", lam=1.0).bind(RuleTables(codebook))
    law1 = sum(prob * walk_law(exact, p, q, tup) for tup, prob in seqs)
    assert 0.5 * float((law1 - p).abs().sum()) < 1e-9


def test_lantern_pp_runs_and_lam_one_is_exact_token_for_token(target, drafter):
    """StaticTree with LANTERN++'s relative rule: lam = 1 draws the same tokens as Exact under the same
    seed (same draws, bitwise the same alpha and residual); lam = 50 accepts more (measured on 512
    images of the 4-code model: 1.67 tokens a forward against 1.57); greedy runs."""
    cond, cb = torch.arange(512) % 3, torch.randn(target.layout.vocab_size, 4, generator=torch.Generator().manual_seed(0))
    s = sv.Sampling(cfg_scale=2.0, noise="stream")
    ex = sv.generate(target, cond, sv.StaticTree(tree=WIDE), s, seed=4, drafter=drafter)
    one = sv.generate(target, cond, sv.StaticTree(tree=WIDE, acceptance=sv.Lantern(k=4, budget="relative", lam=1.0)),
                      s, seed=4, drafter=drafter, codebook=cb)
    assert torch.equal(ex.tokens, one.tokens)
    five = sv.generate(target, cond, sv.StaticTree(tree=WIDE, acceptance=sv.Lantern(k=4, budget="relative", lam=50.0)),
                       s, seed=4, drafter=drafter, codebook=cb)
    assert five.stats.mean_accepted_length > ex.stats.mean_accepted_length + 0.05
    greedy = sv.generate(target, cond, sv.StaticTree(tree=WIDE, acceptance=sv.Lantern(k=4, budget="relative", lam=5.0)),
                         sv.Sampling(temperature=0.0, cfg_scale=2.0, noise="stream"), seed=4, drafter=drafter, codebook=cb)
    assert greedy.tokens.shape == ex.tokens.shape


class StaleQ(Exact):
    def sibling_q(self, p, q, x, soft=None):
        alpha, residual = self(p, q, x)
        return alpha, residual, q


def test_sibling_q_exhausted_support_and_point_masses():
    """q with support of size 2 and 3 siblings: the walk stops after 2 (no mass left) and stays exact;
    a forced position (p = q = point mass) accepts its structural id with probability 1."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.0, 0.7, 0.0, 0.3], dtype=torch.float64)
    law = sum(prob * walk_law(Exact(), p, q, tup) for tup, prob in without_replacement(q, 3))
    assert 0.5 * float((law - p).abs().sum()) < 1e-6
    point = torch.tensor([0.0, 0.0, 1.0, 0.0])
    alpha, _, q_next = Exact().sibling_q(point, point, torch.tensor(2))
    assert float(alpha) == 1.0 and torch.equal(q_next, point)  # nothing left to draw: q itself


def test_siblings_are_distinct_and_forced_nodes_have_one_child(monkeypatch):
    """Every present sibling group holds distinct tokens (drawn without replacement), and a node whose
    children sit at a forced stream position has exactly one child, the structural id."""
    model = tiny_prompt_model(0, janus=False, row_end=1)
    head = EagleDrafter.from_target(model, seed=1).eval()
    build, seen = st.build_static_tree, []

    def spy(ctx, *a, **kw):
        tree = build(ctx, *a, **kw)
        seen.append((tree, ctx.forced.clone()))
        return tree

    monkeypatch.setattr(st, "build_static_tree", spy)
    sv.generate(model, condition_rows(model, [0, 1, 2], torch.arange(6) % 3), sv.StaticTree(tree=WIDE),
                sv.Sampling(cfg_scale=2.0, noise="stream"), seed=1, drafter=head)
    assert seen
    forced_nodes = 0
    for tree, forced in seen:
        B, T, K = tree.children.shape
        for b in range(B):
            for t in range(T):
                kids = tree.children[b, t][tree.children[b, t] >= 0]
                toks = tree.tokens[b, kids].tolist()
                assert len(set(toks)) == len(toks)
                if len(kids):
                    pos = int(tree.positions[b, kids[0]])
                    if pos < forced.shape[0] and forced[pos] >= 0:
                        forced_nodes += 1
                        assert toks == [int(forced[pos])]
    assert forced_nodes > 0


# ---------------------------------------------------------------- configuration


def test_topology_and_presets():
    assert sv.StaticTree().tree == "mc_sim_7b_63" and sv.StaticTree().total_tokens == 26
    for name, paths in st.PRESETS.items():
        assert st.tree_paths(name) == paths  # every preset is a valid, (depth, path)-sorted topology
    m = sv.StaticTree(tree=[[1], [0], [0, 0]])
    assert m.tree == ((1,), (0,), (0, 0)) and m.paths == ((0,), (1,), (0, 0))
    topo = st.Topology(m.paths, torch.device("cpu"))
    assert topo.children.tolist() == [[1, 2], [3, -1], [-1, -1], [-1, -1]] and topo.D == 2
    for bad, msg in [("nope", "must be one of mc_sim_7b_63, "), ([], "non-empty"), ([[0], [0, 1]], "elder sibling"),
                     ([[0, 0]], "no parent"), ([[0], [0]], "twice"), ([[0], [-1]], r"integers in \[0, 1023\]")]:
        with pytest.raises(ValueError, match=msg):
            sv.StaticTree(tree=bad)


def test_gsd_is_refused_and_drafter_needed(target, drafter):
    with pytest.raises(ValueError, match="not supported with StaticTree"):  # when it is built
        sv.StaticTree(acceptance=sv.GSD(group=3))
    with pytest.raises(ValueError, match="drafter"):
        sv.generate(target, torch.tensor([0]), sv.StaticTree(), sv.Sampling(noise="stream"))


def test_registry_and_cli_names():
    m = method_from_spec("static-tree:tree=reverse_balanced_25")
    assert m == sv.StaticTree(tree="reverse_balanced_25") and m.lossless
    name, config, rule = describe(m)
    assert (name, config, rule) == ("static-tree", {"tree": "reverse_balanced_25"}, "exact")
    cli = _method(build_parser().parse_args(["generate", "--method", "static-tree", "--tree", "chain"]))
    assert cli == sv.StaticTree(tree="chain")
    # a custom tree's config is what its JSON holds (lists), in memory too: the Markdown table shows the same
    assert describe(sv.StaticTree(tree=[[0], [0, 0]]))[1] == {"tree": [[0], [0, 0]]}
