"""The EAGLE draft head: EAGLE/LANTERN checkpoint layout, cached tree forward, training script."""

import json

import numpy as np
import pytest
import torch
from exactness import tiny_llamagen

from specvis.models.drafter import DrafterConfig, EagleDrafter
from specvis.train import train_drafter

EAGLE_KEYS = ["embed_tokens.weight", "fc.weight", "fc.bias",
              "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
              "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
              "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
              "layers.0.post_attention_layernorm.weight"]


@pytest.fixture(scope="module")
def target():
    return tiny_llamagen(0, vocab=8, grid=3, sharpness=5.0)


def random_head(target, layers=1, seed=1):
    d = EagleDrafter.from_target(target, num_hidden_layers=layers, seed=seed).eval()
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms and biases away from their init
    return d


@pytest.mark.parametrize("fmt", ["pytorch_model.bin", "model.safetensors"])
@pytest.mark.parametrize("layers", [1, 2])
def test_eagle_checkpoint_roundtrip(tmp_path, target, fmt, layers):
    head = random_head(target, layers)
    sd = head.eagle_state_dict()
    expected = set(EAGLE_KEYS) | {k.replace("layers.0.", f"layers.{i}.") for i in range(1, layers) for k in EAGLE_KEYS
                                  if k.startswith("layers.0.")} | {f"layers.{i}.input_layernorm.weight" for i in range(1, layers)}
    assert set(sd) == expected  # EAGLE: no input_layernorm on layer 0
    cfg = head.config
    # the config.json an EAGLE/LANTERN run writes: HF Llama fields only (no block_size, grid from the target)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": cfg.hidden_size,
              "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "num_hidden_layers": layers,
              "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "vocab_size": cfg.vocab_size}
    (tmp_path / "config.json").write_text(json.dumps(config))
    if fmt == "pytorch_model.bin":
        torch.save(sd, tmp_path / fmt)
    else:
        from safetensors.torch import save_file
        save_file(sd, str(tmp_path / fmt))
    loaded = EagleDrafter.from_pretrained(tmp_path, target)
    assert loaded.config.block_size == 9 and loaded.config.fc_bias and not loaded.config.first_input_norm
    tokens, hidden = torch.randint(0, 8, (2, 9)), torch.randn(2, 9, 32)
    with torch.no_grad():
        assert torch.equal(loaded.forward_train(tokens, hidden)[0], head.forward_train(tokens, hidden)[0])
    # our own writer produces the same layout and loads back
    head.save_pretrained(tmp_path / "ours")
    again = EagleDrafter.from_pretrained(tmp_path / "ours", target)
    with torch.no_grad():
        assert torch.equal(again.forward_train(tokens, hidden)[0], head.forward_train(tokens, hidden)[0])


def test_bad_checkpoint_is_a_clear_error(tmp_path, target):
    head = random_head(target)
    sd = head.eagle_state_dict()
    del sd["layers.0.mlp.up_proj.weight"]
    torch.save(sd, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(head.config.to_json()))
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        EagleDrafter.from_pretrained(tmp_path, target)
    with pytest.raises(ValueError, match="cannot read drafter config"):
        EagleDrafter.from_pretrained(tmp_path / "nowhere", target)
    with pytest.raises(ValueError, match="intermediate_size"):
        DrafterConfig(hidden_size=32, intermediate_size=0)


@torch.no_grad()
def test_cached_tree_forward_equals_teacher_forcing(target):
    """A chain, then a tree drafted depth by depth (blocks at growing offsets, tree masks): every
    node's output equals the teacher-forced forward over its root path; keep_block then leaves a
    cache equal to having fed the kept path as a chain."""
    torch.manual_seed(0)
    d = random_head(target)
    B, D = 2, 32
    d.setup_cache(B, 16)
    prefix_tok, prefix_h = torch.randint(0, 8, (B, 3)), torch.randn(B, 3, D)
    logits, _ = d.forward_tokens(prefix_tok, prefix_h, torch.arange(3).expand(B, -1))
    assert torch.allclose(logits, d.forward_train(prefix_tok, prefix_h)[0], atol=1e-5)
    d.commit(torch.tensor([3, 3]))
    # depth 1: nodes 0, 1 (grid 3); depth 2: node 2 child of 0, nodes 3, 4 children of 1 (grid 4)
    tok = torch.randint(0, 8, (B, 5))
    h = torch.randn(B, 5, D)
    parent = [None, None, 0, 1, 1]
    eye2 = torch.eye(2, dtype=torch.bool).expand(B, -1, -1)
    out1, _ = d.forward_tokens(tok[:, :2], h[:, :2], torch.full((B, 2), 3), eye2, start=0)
    m2 = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [0, 1, 0, 0, 1]], dtype=torch.bool).expand(B, -1, -1)
    out2, _ = d.forward_tokens(tok[:, 2:], h[:, 2:], torch.full((B, 3), 4), m2, start=2)
    out = torch.cat([out1, out2], 1)
    for j in range(5):
        path = [j] if parent[j] is None else [parent[j], j]
        ref, _ = d.forward_train(torch.cat([prefix_tok, tok[:, path]], 1), torch.cat([prefix_h, h[:, path]], 1))
        assert torch.allclose(out[:, j], ref[:, -1], atol=1e-5), j
    # keep path 1 -> 4 in row 0 and 0 -> 2 in row 1 (row 1 keeps only one of them)
    d.keep_block(torch.tensor([[1, 4], [0, 2]]), torch.tensor([2, 1]))
    nxt_tok, nxt_h = torch.randint(0, 8, (B, 1)), torch.randn(B, 1, D)
    got, _ = d.forward_tokens(nxt_tok, nxt_h, torch.tensor([[5], [4]]))
    ref0, _ = d.forward_train(torch.cat([prefix_tok[:1], tok[:1, [1, 4]], nxt_tok[:1]], 1),
                              torch.cat([prefix_h[:1], h[:1, [1, 4]], nxt_h[:1]], 1))
    ref1, _ = d.forward_train(torch.cat([prefix_tok[1:], tok[1:, [0]], nxt_tok[1:]], 1),
                              torch.cat([prefix_h[1:], h[1:, [0]], nxt_h[1:]], 1))
    assert torch.allclose(got[0, 0], ref0[0, -1], atol=1e-5)
    assert torch.allclose(got[1, 0], ref1[0, -1], atol=1e-5)


def test_head_is_the_targets_and_not_saved(target):
    d = EagleDrafter.from_target(target, seed=0)
    assert d.head is target.output
    assert not any(k.startswith(("head", "output")) for k in d.state_dict())
    assert torch.equal(d.embed_tokens.weight, target.tok_embeddings.weight)


def test_train_drafter_reduces_loss_and_resumes(tmp_path):
    # attention at its random init (nearly uniform): features a 25-step run can fit halfway
    target = tiny_llamagen(0, vocab=8, grid=3, sharpness=5.0, attention=1.0, value=1.0, embed=20.0)
    target.save_pretrained(tmp_path / "target")
    rng = np.random.default_rng(0)
    codes, labels = rng.integers(0, 8, (64, 9)).astype(np.int16), rng.integers(0, 3, 64)
    np.savez(tmp_path / "tok.npz", train_codes=codes[:48], train_labels=labels[:48],
             eval_codes=codes[48:], eval_labels=labels[48:], codebook_size=np.array(8))
    args = ["--target", str(tmp_path / "target"), "--tokens", str(tmp_path / "tok.npz"), "--out", str(tmp_path / "run"),
            "--lr", "3e-3", "--warmup", "5", "--log-every", "5", "--minutes", "5"]
    assert train_drafter.main(args + ["--max-steps", "25"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps"] == 25
    first, last = report["initial_eval"], report["final_eval"]
    assert last["v_loss"] < 0.5 * first["v_loss"] and last["p_loss"] < first["p_loss"]
    assert train_drafter.main(args + ["--max-steps", "30"]) == 0  # resumes at step 25
    assert json.loads((tmp_path / "run" / "report.json").read_text())["steps"] == 30
    head = EagleDrafter.from_pretrained(tmp_path / "run" / "final", target)
    assert head.config.hidden_size == 32 and head.head is target.output
    assert train_drafter.main(args[:2] + ["--tokens", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "x")]) == 2
