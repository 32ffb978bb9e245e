"""EAGLE draft trees (EagleTree, ADTTree) on text-to-image decoders of both families' shapes (Janus:
codes only; Emu3: a forced row-end token after each image row), with an EAGLE head that borrows the
target's image embedding and head and places stream tokens by 1D RoPE; and ``train-drafter --model``
on tiny Hugging Face checkpoints.

What each test would catch is said in it. Statistical tests use fixed seeds.
"""

from __future__ import annotations

import json

import pytest
import torch

import specvis as sv
import specvis.methods.eagle as tree_mod
from exactness import check_method, condition_rows, tiny_llamagen, tiny_prompt_model
from specvis.models.drafter import EagleDrafter

P_MIN = 1e-3
N = 8000  # grids per exactness case: a residual that keeps a rejected candidate fails with half as many
SHAPES = {"janus": dict(janus=True), "emu3": dict(janus=False, row_end=1)}
CFG = sv.Sampling(cfg_scale=2.5, top_k=2, noise="stream")
TREES = {"eagle": sv.EagleTree(depth=3, top_k=2, total_tokens=6),
         # open bounds: depths 1..3, top-k 1..2
         "adt": sv.ADTTree(depth_range=(0, 4), topk_range=(0, 3), topk_step=1, total_tokens=6)}


def models(shape: str, height: int = 2, width: int = 2):
    target = tiny_prompt_model(0, height=height, width=width, **SHAPES[shape])
    return target, EagleDrafter.from_target(target, seed=1).eval()


def sharpen(drafter: EagleDrafter, attention: float = 30.0) -> EagleDrafter:
    """A fresh head attends almost uniformly (weights ~ N(0, 0.02)), so where a key sits barely moves
    its output; scaling the query/key projections as ``tiny_prompt_model`` does makes attention sharp
    and position-selective, so a wrong position or a clobbered cache slot shows in its logits."""
    with torch.no_grad():
        for layer in drafter.layers:
            a = layer.attention
            a.wqkv.weight[: (a.n_head + a.n_kv_head) * a.head_dim].mul_(attention)
    return drafter


@pytest.mark.parametrize("method", TREES)
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_is_exact_on_prompt_models(shape: str, method: str) -> None:
    """Chi-square (8,000 grids, 3 prompts mixed in one batch) of the tree's output law against the
    enumerated law of a 2x2 prompt model with CFG (the family's unconditional rows) and top-k: catches
    a forced row end that is sampled or verified against an image-code law, a tree node at the wrong
    target position, a drafter row that is not its CFG half, and every tree error the class-conditional
    tests catch (tests/test_tree.py)."""
    target, drafter = models(shape)
    assert check_method(target, TREES[method], CFG, n=N, batch=N, drafter=drafter) > P_MIN


@pytest.mark.parametrize("method", TREES)
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_tree_equals_greedy_ar_on_prompt_models(shape: str, method: str) -> None:
    """Greedy (deterministic) trees commit exactly greedy AR's tokens on a 3x3 grid (three row ends for
    Emu3), and rows accept drafts (an untrained head: not many): catches any wrong target law in the
    tree forward, and a greedy walk that is not deterministic."""
    target, drafter = models(shape, 3, 3)
    greedy = sv.Sampling(temperature=0.0, cfg_scale=3.0, noise="stream")
    rows = condition_rows(target, [0, 1, 2, 1, 0, 2])
    ar = sv.generate(target, rows, sv.AR(), greedy).tokens
    out = sv.generate(target, rows, TREES[method], greedy, seed=5, drafter=drafter)
    assert torch.equal(out.tokens, ar)
    assert out.stats.draft_forwards > 0 and out.stats.mean_accepted_length > 1.0


def test_forced_positions_hold_their_structural_id_in_every_tree(monkeypatch) -> None:
    """Every node of every tree (nodes some parent lists as a child) at a row-end position carries the
    row-end id, and no node at an image position carries a structural id; trees reach across row ends.
    Catches a drafter ranking that proposes image codes at a forced position (still exact, but every
    row end would cost a rejected tree branch) or forces the wrong position."""
    target, drafter = models("emu3", 3, 3)
    build, seen = tree_mod.build_tree, {"forced": 0, "image": 0}

    def spy(ctx, *a, **kw):
        tree = build(ctx, *a, **kw)
        B, T, K = tree.children.shape
        kept = torch.zeros(B, T, dtype=torch.bool)
        kids = tree.children.flatten(1)
        kept.scatter_(1, kids.clamp_min(0), kids >= 0)
        kept[:, 0] = False  # the root is committed, not drafted
        forced = ctx.forced[tree.positions.clamp(0, ctx.forced.shape[0] - 1)]
        at = kept & (forced >= 0)
        assert torch.equal(tree.tokens[at], forced[at])
        image = kept & (forced < 0) & (tree.positions < ctx.L)
        assert bool((tree.tokens[image] < ctx.layout.vocab_size).all())
        seen["forced"] += int(at.sum())
        seen["image"] += int(image.sum())
        return tree

    monkeypatch.setattr(tree_mod, "build_tree", spy)
    rows = condition_rows(target, [0, 1, 2, 0])
    for method in TREES.values():
        sv.generate(target, rows, method, sv.Sampling(cfg_scale=2.0, noise="stream"), seed=0, drafter=drafter)
    assert seen["forced"] > 0 and seen["image"] > 0


class DrafterOracle:
    """Checks every drafter forward inside a tree method against the drafter's own teacher-forced
    forward: a node fed at stream position s must sit at s = (committed drafter tokens) + (its
    ancestors in the uncommitted block) - 1, the catch-up must feed the committed tokens at their
    positions, and its logits must equal ``forward_train`` over exactly its context (committed tokens
    and features, then its ancestors). Rows are drafter rows (both CFG halves)."""

    def __init__(self, drafter: EagleDrafter) -> None:
        self.d, self.ctx, self.checked = drafter, None, 0
        self.fwd, self.commit_, self.setup = drafter.forward_tokens, drafter.commit, drafter.setup_cache
        drafter.forward_tokens, drafter.commit, drafter.setup_cache = self.forward_tokens, self.commit, self.setup_cache

    def setup_cache(self, rows, extra):
        self.setup(rows, extra)
        self.tok = [torch.zeros(0, dtype=torch.long) for _ in range(rows)]
        self.feat = [torch.zeros(0, self.d.config.hidden_size) for _ in range(rows)]
        self.region_tok, self.region_feat = [dict() for _ in range(rows)], [dict() for _ in range(rows)]

    def commit(self, count):
        for r in range(len(self.tok)):
            c = int(count[r])
            self.tok[r] = torch.cat([self.tok[r], self.last[0][r, :c]])
            self.feat[r] = torch.cat([self.feat[r], self.last[1][r, :c]])
        self.commit_(count)

    def forward_tokens(self, tokens, hidden, positions, tree_mask=None, start=0):
        length = self.d.length.clone()
        logits, f = self.fwd(tokens, hidden, positions, tree_mask, start)
        ctx, B = self.ctx, self.ctx.n.shape[0]
        if tree_mask is None:
            self.last = (tokens, hidden)
        contexts = []
        for r in range(tokens.shape[0]):
            b, n0 = r % B, int(length[r])
            for j in range(tokens.shape[1]):
                self.region_tok[r][start + j], self.region_feat[r][start + j] = tokens[r, j], hidden[r, j]
            for j in range(tokens.shape[1]):
                if tree_mask is None:  # catch-up: the tokens committed since the drafter last saw the row
                    if n0 + j >= int(ctx.n[b]):
                        continue
                    anc = list(range(j + 1))
                    assert int(tokens[r, j]) == int(ctx.tokens[b, n0 + j]), "catch-up feeds a token not committed there"
                else:
                    if int(ctx.n[b]) >= ctx.L:
                        continue
                    anc = torch.nonzero(tree_mask[r, j, : start + tokens.shape[1]]).flatten().tolist()
                want = n0 + len(anc) - 1
                assert int(positions[r, j]) == want, f"drafter row {r} node {j}: position {int(positions[r, j])}, context says {want}"
                toks = torch.stack([self.region_tok[r][i] for i in anc]) if tree_mask is not None else tokens[r, : j + 1]
                feats = torch.stack([self.region_feat[r][i] for i in anc]) if tree_mask is not None else hidden[r, : j + 1]
                contexts.append((r, j, torch.cat([self.tok[r], toks]), torch.cat([self.feat[r], feats])))
        for r, j, toks, feats in contexts:
            ref, _ = self.d.forward_train(toks[None], feats[None])
            assert (ref[0, -1] - logits[r, j]).abs().max() < 1e-4, f"drafter row {r} node {j}: logits differ from teacher forcing"
            self.checked += 1
        return logits, f


@pytest.mark.parametrize("method", TREES)
@pytest.mark.parametrize("shape", SHAPES)
def test_drafter_sees_its_context_at_its_positions(shape: str, method: str, monkeypatch) -> None:
    """The drafter oracle (``DrafterOracle``) over whole tree runs with CFG on a 3x3 grid, with a head
    made for the model's 2x2 grid before the grid grew (as ``pipe(height=, width=)`` does): catches a
    drafter fed at a position off by one (catch-up or tree depth), a catch-up that feeds or commits the
    wrong tokens, a tree mask that lets a node see a non-ancestor, a drafter RoPE that ignores the
    given positions, and a drafter cache sized for the grid it was made on (2x2 here, decoding 4x4)."""
    target, drafter = models(shape, 2, 2)
    sharpen(drafter)
    target.set_grid(4, 4)
    oracle = DrafterOracle(drafter)
    build = tree_mod.build_tree

    def spy(ctx, *a, **kw):
        oracle.ctx = ctx
        return build(ctx, *a, **kw)

    monkeypatch.setattr(tree_mod, "build_tree", spy)
    sv.generate(target, condition_rows(target, [0, 1, 2]), TREES[method], sv.Sampling(cfg_scale=2.0, noise="stream"), seed=1,
                drafter=drafter)
    assert oracle.checked > 50


@pytest.mark.parametrize("shape", SHAPES)
def test_drafter_borrows_embedding_and_head_and_files_roundtrip(shape: str, tmp_path) -> None:
    """A prompt-model head uses the target's image embedding (row-end ids included) and head, saves
    neither, records its positions in config.json and loads back equal; a LlamaGen head and a prompt
    head refuse each other's targets (one-line ValueError)."""
    target, drafter = models(shape, 2, 3)
    assert drafter.head is target.head and drafter.borrowed_embed is target.image_embed
    ids = torch.arange(target.layout.law_size)  # codes and row-end ids
    assert torch.equal(drafter.embed(ids), target.image_embed(ids))
    assert not any(k.startswith(("embed", "head", "image_embed")) for k in drafter.state_dict())
    assert "embed_tokens.weight" not in drafter.eagle_state_dict()
    drafter.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["positions"] == "stream" and cfg["own_embeddings"] is False
    loaded = EagleDrafter.from_pretrained(tmp_path, target)
    S = target.layout.stream_len
    stream = torch.where(target.layout.forced() >= 0, target.layout.forced(), torch.randint(0, 3, (2, S)))
    h = torch.randn(2, S, 32)
    with torch.no_grad():
        assert torch.equal(loaded.forward_train(stream, h)[0], drafter.forward_train(stream, h)[0])
    with pytest.raises(ValueError, match="does not fit"):
        EagleDrafter.from_target(tiny_llamagen(0)).attach(target)
    with pytest.raises(ValueError, match="does not fit"):
        drafter.attach(tiny_llamagen(0))


def test_harness_rejects_a_broken_sibling_rule_on_prompt_models() -> None:
    """The chi-square above has power on these models: a sibling rule whose residual keeps rejected
    candidates (the law leans towards drafts) fails with half the samples (measured p ~ 1e-260)."""
    from test_tree import StickyResidual

    target, drafter = models("emu3")
    method = sv.EagleTree(depth=3, top_k=2, total_tokens=6, acceptance=StickyResidual())
    assert check_method(target, method, CFG, n=4000, batch=4000, drafter=drafter) < 1e-6


@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_train_drafter_on_a_checkpoint_then_trees_use_it(family: str, tmp_path) -> None:
    """``specvis train-drafter --model DIR`` on a tiny Hugging Face checkpoint (samples the checkpoint
    generates from a prompt file, a few steps) exits 0 and writes a head that ``sv.load(DIR,
    drafter=RUN_DIR)`` and ``generate --drafter HEAD_DIR`` load; greedy EagleTree with it equals greedy
    AR and drafts. Catches a head saved in a layout the loader does not read, the target's modules
    saved with it, a stream that is not the target's (row ends), and a pipeline that drops the head."""
    pytest.importorskip("transformers")
    from hf_tiny import EMU3_GRID, JANUS_GRID, make_emu3, make_janus
    from specvis import cli

    ckpt = (make_janus if family == "janus" else make_emu3)(tmp_path / family)
    H, W = JANUS_GRID if family == "janus" else EMU3_GRID
    grid = ["--height", str(H), "--width", str(W)]
    (tmp_path / "prompts.txt").write_text("a red apple\n\na cat on a mat\n")
    run = tmp_path / "run"
    assert cli.main(["train-drafter", "--model", str(ckpt), "--prompts", str(tmp_path / "prompts.txt"), "--samples", "6",
                     "--sample-batch", "3", *grid, "--out", str(run), "--max-steps", "3", "--log-every", "1",
                     "--warmup", "1", "--lr", "3e-3"]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 3 and report["samples"] == 6 and report["grid"] == [H, W]
    saved = json.loads((run / "final" / "config.json").read_text())
    assert saved["positions"] == "stream" and not saved["own_embeddings"]
    assert saved["rope_theta"] == (500.0 if family == "janus" else 2000.0)  # the fixture's, not the default
    samples = torch.load(run / "samples.pt", weights_only=False)  # the rows the pipeline's CFG decoded from
    assert samples["streams"].shape == (6, H * (W + (family == "emu3")))
    assert all(u is not None and u != c for c, u in zip(samples["cond"], samples["uncond"]))

    pipe = sv.load(str(ckpt), drafter=str(run))
    assert pipe.drafter.head is pipe.target.head and pipe.drafter.borrowed_embed is pipe.target.image_embed
    greedy, prompts = sv.Sampling(temperature=0.0, cfg_scale=3.0, noise="stream"), ["a red apple", "a cat on a mat", "a dog"]
    ar = pipe(prompts=prompts, method=sv.AR(), sampling=greedy, decode=False, height=H, width=W)
    for method in TREES.values():
        out = pipe(prompts=prompts, method=method, sampling=greedy, decode=False, height=H, width=W)
        assert torch.equal(out.tokens, ar.tokens) and out.stats.draft_forwards > 0
    assert cli.main(["generate", "--model", str(ckpt), "--drafter", str(run / "final"), "--method", "eagle",
                     "--prompt", "a cat", *grid, "--out", str(tmp_path / "images")]) == 0
    assert json.loads((tmp_path / "images" / "stats.json").read_text())["draft_forwards"] > 0
    with pytest.raises(ValueError, match="drafter= is for checkpoint directories"):
        sv.load("random-tiny", drafter=str(run))
