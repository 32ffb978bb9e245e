"""Emoji dataset helpers and tokenisation, on the font-free synthetic stand-in (one real-font test)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specvis.models.vq import VQConfig, VQModel
from specvis.train import emoji_data as ed
from specvis.train import tokenize as tk


def test_synthetic_dataset_shapes_and_determinism():
    x, y = ed.synthetic_dataset(5, 8, seed=3)
    assert x.shape == (40, 64, 64, 3) and x.dtype == np.uint8
    assert y.tolist() == np.repeat(np.arange(8), 5).tolist()
    x2, _ = ed.synthetic_dataset(5, 8, seed=3)
    assert np.array_equal(x, x2)
    assert not np.array_equal(x, ed.synthetic_dataset(5, 8, seed=4)[0])
    assert (x.reshape(40, -1).min(1) < 200).all()  # every image has a visible shape
    assert np.array_equal(x[:, 0, 0], np.full((40, 3), 255))  # white background corner
    means = np.stack([x[y == k].mean(0) for k in range(8)]).reshape(8, -1)
    dist = np.abs(means[:, None] - means[None]).mean(-1)
    assert (dist + np.eye(8) * 1e9).min() > 1.0  # classes look different


@pytest.mark.parametrize("kw,field", [({"n_per_class": 0}, "n_per_class"), ({"num_classes": 0}, "num_classes"),
                                      ({"size": 4}, "size")])
def test_synthetic_bad_args(kw, field):
    args = {"n_per_class": 2, "num_classes": 2, "seed": 0, **kw}
    with pytest.raises(ValueError, match=field):
        ed.synthetic_dataset(**args)


def test_class_rule():
    assert len(ed.CLASSES) >= 8
    starts = [c.start for c in ed.CLASSES]
    assert starts == sorted(starts) and starts[0] >= 0x1F300
    for a, b in zip(ed.CLASSES, ed.CLASSES[1:]):
        assert a.start <= a.end < b.start  # disjoint ranges
    assert len({c.name for c in ed.CLASSES}) == len(ed.CLASSES)
    assert ed.CLASSES[ed.class_of(0x1F600)].name == "smileys"
    assert ed.CLASSES[ed.class_of(0x1F431)].name == "animals"
    for cp in (0x1F3FB, 0x1F9B0, 0x1F7E0, 0x2600, 0x1F1E6, 0xE0030):
        assert ed.class_of(cp) is None


def test_holdout_every_tenth_by_codepoint():
    labels = np.repeat([0, 1], 30)
    cps = np.concatenate([np.arange(100, 130), np.arange(200, 230)])
    perm = np.random.default_rng(0).permutation(60)
    mask = ed.holdout_mask(labels[perm], cps[perm])
    held = sorted(cps[perm][mask].tolist())
    assert held == [109, 119, 129, 209, 219, 229]
    with pytest.raises(ValueError, match="every"):
        ed.holdout_mask(labels, cps, every=1)


def test_flip_safe():
    m = ed.flip_safe(np.array([0x1F600, 0x1F550, 0x1F521, 0x1F400]))
    assert m.tolist() == [True, False, False, True]


def test_augment_properties():
    x, _ = ed.synthetic_dataset(2, 4, seed=0)
    a = ed.augment(x, seed=7)
    assert a.shape == x.shape and a.dtype == np.uint8
    assert np.array_equal(a, ed.augment(x, seed=7))
    assert not np.array_equal(a, ed.augment(x, seed=8))
    same = ed.augment(x, seed=1, max_shift=0.0, scale=(1.0, 1.0), flip=False)
    assert np.abs(same.astype(int) - x).max() <= 1  # identity transform
    flipped = ed.augment(x, seed=1, max_shift=0.0, scale=(1.0, 1.0), flip=True)
    for orig, out in zip(x, flipped):
        assert min(np.abs(out.astype(int) - orig).max(), np.abs(out.astype(int) - orig[:, ::-1]).max()) <= 1
    mask = np.zeros(len(x), bool)
    never = ed.augment(x, seed=1, max_shift=0.0, scale=(1.0, 1.0), flip=mask)
    assert np.abs(never.astype(int) - x).max() <= 1
    with pytest.raises(ValueError, match="images"):
        ed.augment(x.astype(np.float32), seed=0)
    with pytest.raises(ValueError, match="scale"):
        ed.augment(x, seed=0, scale=(0.0, 1.0))


def _write_synthetic(directory, n_per_class=10, num_classes=3):
    x, y = ed.synthetic_dataset(n_per_class, num_classes, seed=0, size=16)
    cps = 0x1F600 + np.arange(len(y))
    held = ed.holdout_mask(y, cps)
    directory.mkdir(parents=True, exist_ok=True)
    for name, m in (("train", ~held), ("eval", held)):
        ed.atomic_save_npz(directory / f"{name}.npz", images=x[m], labels=y[m], codepoints=cps[m])
    return x, y, held


def test_split_files_round_trip(tmp_path):
    x, y, held = _write_synthetic(tmp_path / "d")
    tx, ty, tc = ed.load_split(tmp_path / "d", "train")
    assert np.array_equal(tx, x[~held]) and np.array_equal(ty, y[~held]) and len(tc) == len(ty)
    ex, ey, _ = ed.load_split(tmp_path / "d", "eval")
    assert len(ex) == 3 and set(ey.tolist()) == {0, 1, 2}
    assert not list((tmp_path / "d").glob("*.tmp"))
    with pytest.raises(ValueError, match="split"):
        ed.load_split(tmp_path / "d", "test")
    with pytest.raises(ValueError, match="cannot read"):
        ed.load_split(tmp_path / "missing", "train")


def test_missing_font_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        ed.main(["--out", str(tmp_path / "o"), "--font", str(tmp_path / "none.ttf")])
    assert ed.FONT_PACKAGE in str(err.value) and "\n" not in str(err.value)


def _synthetic_with_vq(root) -> None:
    """A synthetic dataset in ``root/d`` and a seeded tiny random VQ saved in ``root/vq``."""
    _write_synthetic(root / "d")
    torch.manual_seed(0)
    vq = VQModel(VQConfig(codebook_size=32, codebook_embed_dim=4, encoder_ch_mult=[1, 2, 2],
                          decoder_ch_mult=[1, 2, 2], z_channels=8, ch=8, num_res_blocks=1, norm_groups=4))
    vq.save_pretrained(root / "vq")


def test_tokenize_synthetic(tmp_path):
    _synthetic_with_vq(tmp_path)
    out = tmp_path / "tokens.npz"
    rc = tk.main(["--vq", str(tmp_path / "vq"), "--data", str(tmp_path / "d"), "--out", str(out), "--augment", "2"])
    assert rc == 0
    with np.load(out) as z:
        n_train = 27  # 30 images - 3 held out; all flip-safe codepoints
        assert z["train_codes"].shape == (n_train * 4, 16) and z["train_codes"].dtype == np.int16
        assert z["train_variant"].tolist() == [0] * n_train + [1] * n_train + [2] * n_train + [3] * n_train
        assert np.array_equal(z["train_labels"][:n_train], z["train_labels"][n_train:2 * n_train])
        assert z["eval_codes"].shape == (3, 16) and z["grid"].tolist() == [4, 4]
        assert int(z["codebook_size"]) == 32 and json.loads(str(z["meta"]))["augment"] == 2
        assert z["train_codes"].min() >= 0 and z["train_codes"].max() < 32
        tx, _, _ = ed.load_split(tmp_path / "d", "train")
        direct = tk.encode_images(VQModel.from_pretrained(tmp_path / "vq"), tx)
        assert np.array_equal(z["train_codes"][:n_train], direct)
    assert tk.main(["--vq", str(tmp_path / "nope"), "--data", str(tmp_path / "d"), "--out", str(out)]) == 2


@pytest.mark.skipif(ed.find_font() is None, reason="Noto Color Emoji font not installed")
def test_real_glyphs_render():
    font = ed.load_font(ed.find_font())
    for cp in (0x1F600, 0x1F431, 0x1F680, 0x1F98A):
        img = ed.render_emoji(cp, font)
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8
        assert img.min() < 128 and img.std() > 20  # a coloured picture, not a blank tile
        assert (img[0] > 200).all()  # margin rows stay white
    assert ed.render_emoji(0x1F545, font) is None  # unassigned in the font: empty glyph
