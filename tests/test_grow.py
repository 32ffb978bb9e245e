"""Function-preserving widening of a LlamaGen (specvis.train.grow), the start of the wide draft."""

import pytest
import torch

import specvis
from specvis.models.llamagen import LlamaGen, LlamaGenConfig
from specvis.sampling import Sampling
from specvis.train.grow import main, widen


def tiny(seed: int = 0) -> LlamaGen:
    torch.manual_seed(seed)
    m = LlamaGen(LlamaGenConfig(vocab_size=16, dim=16, n_layer=2, n_head=2, multiple_of=8, num_classes=3,
                                block_size=16)).eval()
    with torch.no_grad():  # trained-looking: norms away from 1, laws far from uniform
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        m.output.weight.mul_(20.0)
    return m


def test_widened_model_computes_the_same_laws_and_samples():
    """Catches a head block copied to the wrong rows, a missing zero on a write, or a norm rescale without
    the matching eps (the embeddings' mean square is ~4e-4, so eps = 1e-5 moves the logits ~1%)."""
    m = tiny()
    w = widen(m, 32, 4, seed=1)
    assert (w.config.dim, w.config.n_head, w.layers[0].feed_forward.w1.weight.shape[0]) == (32, 4, 88)
    y, t = torch.tensor([0, 2, 3]), torch.randint(0, 16, (3, 15), generator=torch.Generator().manual_seed(0))
    a, b = m.logits(y, t), w.logits(y, t)
    assert a.std() > 1.0
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    # the cached path (2D RoPE per head, KV cache of the new width) samples the same sequences
    s = Sampling(temperature=1.0, cfg_scale=3.0)
    labels = torch.arange(6) % 3
    ref = specvis.generate(m, labels, specvis.AR(), s, seed=5).tokens
    assert torch.equal(specvis.generate(w, labels, specvis.AR(), s, seed=5).tokens, ref)


def test_widened_model_learns_in_its_new_coordinates():
    """The new residual coordinates start at zero; a gradient step must reach their writes (a growth that
    zeroed the reads as well would leave the extra width dead)."""
    w = widen(tiny(), 32, 4, seed=1).train()
    y, t = torch.tensor([0, 1]), torch.randint(0, 16, (2, 15), generator=torch.Generator().manual_seed(1))
    w.logits(y, t).logsumexp(-1).sum().backward()
    assert w.tok_embeddings.weight.grad[:, 16:].abs().sum() > 0  # columns: the new coordinates
    for name in ("layers.0.attention.wo.weight", "layers.1.feed_forward.w2.weight"):  # rows: writes into them
        assert w.get_parameter(name).grad[16:].abs().sum() > 0, name


def test_bad_widths_are_refused(tmp_path, capsys):
    m = tiny()
    with pytest.raises(ValueError, match="dim must be n_head x 8"):
        widen(m, 36, 4)  # heads of 9: the RoPE frequencies would change
    with pytest.raises(ValueError, match="n_head > 2"):
        widen(m, 16, 2)
    m.save_pretrained(tmp_path / "src")
    with pytest.raises(SystemExit):
        main(["--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--dim", "30", "--n-head", "4"])
    assert "dim must be n_head x 8" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--dim", "24", "--n-head", "3"]) == 0
    assert LlamaGen.from_pretrained(tmp_path / "out").config.dim == 24
