"""LlamaGen: cached decoding agrees with the teacher-forced forward, per-row rollback and tree
compaction keep the cache consistent, official checkpoint files load back exactly."""

import pytest
import torch

import specvis as sv
from specvis.models.llamagen import rope_2d_table


def make(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=16, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=9, multiple_of=32)
    cfg.update(kw)
    return sv.models.LlamaGen(sv.models.LlamaGenConfig(**cfg)).eval()


def test_rope_table_conventions():
    """Row angles fill the first half of the pairs, column angles the second; prefix rows are zero."""
    t = rope_2d_table(grid=3, head_dim=8, base=10000.0, prefix=1)
    assert t.shape == (1 + 9, 4, 2)
    assert torch.all(t[0] == 0)
    angles = torch.atan2(t[1:, :, 1], t[1:, :, 0]).reshape(3, 3, 4)
    # pair 0 rotates with frequency 1 by the row index, pair 2 by the column index
    assert torch.allclose(angles[:, :, 0], torch.arange(3.0)[:, None].expand(3, 3), atol=1e-5)
    assert torch.allclose(angles[:, :, 2], torch.arange(3.0)[None, :].expand(3, 3), atol=1e-5)
    assert torch.allclose(angles[1, 1, 1], torch.tensor(10000.0 ** -0.5), atol=1e-5)  # base^(-4i/head_dim), i=1


def test_condition_queries_and_keys_are_zeroed():
    """cos = sin = 0 at the prefix: the condition token's attention output is independent of its
    query/key, so changing the wqkv rows of q/k cannot change the first logits."""
    m = make()
    c = torch.tensor([1, 2])
    ref = m.logits(c, torch.zeros(2, 0, dtype=torch.long))
    with torch.no_grad():
        m.layers[0].attention.wqkv.weight[: 2 * 64].normal_()
    assert torch.allclose(ref, m.logits(c, torch.zeros(2, 0, dtype=torch.long)), atol=1e-5)


def test_cached_chain_matches_teacher_forcing_with_ragged_rows():
    m = make(n_kv_head=2)
    B, L = 3, 9
    cond = torch.tensor([0, 3, 5])  # 5 = null class
    toks = torch.randint(0, 16, (B, L))
    ref = m.logits(cond, toks[:, :-1])  # (B, 9, V)
    m.setup_cache(B, extra=4)
    first, _ = m.prefill(cond)
    assert torch.allclose(first, ref[:, 0], atol=1e-4)
    # rows advance by different amounts: 1, 2 and 3 tokens per step
    fed = torch.zeros(B, dtype=torch.long)
    for _ in range(4):
        step = torch.tensor([1, 2, 3])
        n = int(step.max())
        pos = fed[:, None] + torch.arange(n)
        logits, _ = m.forward_tokens(toks.gather(1, pos.clamp_max(L - 1)), pos)
        for r in range(B):
            k = int(min(step[r], L - 1 - fed[r]))
            if k > 0:
                assert torch.allclose(logits[r, :k], ref[r, fed[r] + 1: fed[r] + 1 + k], atol=1e-4)
        fed = (fed + step).clamp_max(L - 1)
        m.set_committed(fed)


def test_rollback_discards_rejected_tokens():
    m = make()
    cond = torch.tensor([1, 2])
    toks = torch.randint(0, 16, (2, 9))
    ref = m.logits(cond, toks[:, :-1])
    m.setup_cache(2, extra=4)
    m.prefill(cond)
    junk = torch.randint(0, 16, (2, 4))
    m.forward_tokens(junk, torch.arange(4).expand(2, 4))
    m.set_committed(torch.zeros(2, dtype=torch.long))  # reject everything
    logits, _ = m.forward_tokens(toks[:, :3], torch.arange(3).expand(2, 3))
    assert torch.allclose(logits, ref[:, 1:4], atol=1e-4)


def test_tree_mask_and_compaction():
    """A tree with two branches gives each node the logits of its own root path; keeping one
    branch with keep_block leaves a cache equal to having fed that path as a chain."""
    m = make()
    cond = torch.tensor([2])
    a, b, c = 3, 7, 11
    m.setup_cache(1, extra=8)
    m.prefill(cond)
    # nodes: 0 = a (pos 0), 1 = b child of a (pos 1), 2 = c child of a (pos 1), 3 = b child of c (pos 2)
    tokens = torch.tensor([[a, b, c, b]])
    pos = torch.tensor([[0, 1, 1, 2]])
    tree = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], dtype=torch.bool)
    logits, _ = m.forward_tokens(tokens, pos, tree)
    ref_ab = m.logits(cond, torch.tensor([[a, b]]))
    ref_acb = m.logits(cond, torch.tensor([[a, c, b]]))
    assert torch.allclose(logits[0, 1], ref_ab[0, 2], atol=1e-4)
    assert torch.allclose(logits[0, 3], ref_acb[0, 3], atol=1e-4)
    m.keep_block(torch.tensor([[0, 2, 3]]), torch.tensor([3]))
    nxt, _ = m.forward_tokens(torch.tensor([[5]]), torch.tensor([[3]]))
    assert torch.allclose(nxt[0, 0], m.logits(cond, torch.tensor([[a, c, b, 5]]))[0, 4], atol=1e-4)


@pytest.mark.parametrize("wrap", ["model", "ema", "bare"])
def test_official_checkpoint_roundtrip(tmp_path, wrap):
    m = make(seed=3, dim=128, n_head=2, n_kv_head=2, block_size=16, multiple_of=64)
    sd = {f"_orig_mod.{k}": v for k, v in m.state_dict().items()}
    sd["_orig_mod.freqs_cis"] = torch.zeros(1 + 16, 32, 2)  # stale buffer some checkpoints carry
    obj = sd if wrap == "bare" else {wrap: sd, "args": None}
    torch.save(obj, tmp_path / "c2i.pt")
    names = set(k.removeprefix("_orig_mod.") for k in sd)
    for key in ["tok_embeddings.weight", "cls_embedding.embedding_table.weight", "layers.0.attention.wqkv.weight",
                "layers.1.feed_forward.w1.weight", "layers.1.feed_forward.w2.weight", "layers.1.feed_forward.w3.weight",
                "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight", "layers.0.attention.wo.weight",
                "norm.weight", "output.weight"]:
        assert key in names
    loaded = sv.models.LlamaGen.from_checkpoint(tmp_path / "c2i.pt", n_head=2).eval()
    assert loaded.config.block_size == 16 and loaded.config.num_classes == 5
    cond, toks = torch.tensor([0, 4]), torch.randint(0, 16, (2, 15))
    assert torch.equal(loaded.logits(cond, toks), m.logits(cond, toks))


def test_bad_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        sv.models.LlamaGen.from_checkpoint(tmp_path / "x.pt")
    torch.save({"model": {"foo": torch.zeros(1)}}, tmp_path / "y.pt")
    with pytest.raises(ValueError, match="not a LlamaGen c2i checkpoint"):
        sv.models.LlamaGen.from_checkpoint(tmp_path / "y.pt")


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="block_size"):
        sv.models.LlamaGenConfig(vocab_size=4, dim=32, n_layer=1, n_head=2, num_classes=2, block_size=5)
