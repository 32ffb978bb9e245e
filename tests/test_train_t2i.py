"""The text-to-image emoji pipeline's data, tokenizer and trainer on a tiny synthetic dataset."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specvis.models.base import Prompts
from specvis.train import emoji_captions, train_t2i
from specvis.train.text_tokenizer import load as load_tokenizer
from specvis.train.text_tokenizer import train_tokenizer, wrap

WORDS = ["red apple", "green tree", "blue car", "yellow sun", "black cat", "white cloud"]


def test_captions_follow_the_documented_order():
    assert emoji_captions.captions_for("Red Apple", ["apple", "fruit", "red"], "red apple") == [
        "red apple", "red apple, fruit", "apple, fruit, red"]
    caps = emoji_captions.captions_for("grinning face", ["face", "grin", "grinning face"], "grinning face")
    assert caps == ["grinning face", "grinning face, grin", "face, grin, grinning face"]


def test_read_annotations_single_codepoints_only(tmp_path):
    xml = tmp_path / "en.xml"
    xml.write_text('<ldml><annotations>'
                   '<annotation cp="\U0001F34E">apple | fruit | red</annotation>'
                   '<annotation cp="\U0001F34E" type="tts">red apple</annotation>'
                   '<annotation cp="\u2764\ufe0f" type="tts">red heart</annotation>'
                   '<annotation cp="\U0001F468\u200d\U0001F373" type="tts">man cook</annotation>'
                   '</annotations></ldml>')
    ann = emoji_captions.read_annotations(xml)
    assert ann == {0x1F34E: {"name": "red apple", "keywords": ["apple", "fruit", "red"]},
                   0x2764: {"name": "red heart", "keywords": []}}
    with pytest.raises(ValueError, match="unicode-cldr-core"):
        emoji_captions.read_annotations(tmp_path / "missing.xml")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A dataset of 6 'glyphs' whose 16 codes are a function of the glyph; tokenizer; token file."""
    root = tmp_path_factory.mktemp("t2i")
    data = root / "data"
    data.mkdir()
    cps = np.arange(0x1F300, 0x1F300 + len(WORDS))
    glyphs = {f"U+{cp:04X}": {"name": w, "keywords": [], "captions": [w, w.split()[1]]} for cp, w in zip(cps, WORDS)}
    (data / "captions.json").write_text(json.dumps({"glyphs": glyphs}))
    np.savez(data / "train.npz", images=np.zeros((5, 4, 4, 3), np.uint8), labels=np.zeros(5, np.int64), codepoints=cps[:5])
    rng = np.random.default_rng(0)
    base = rng.integers(0, 32, (len(WORDS), 16))
    source = np.repeat(np.arange(5), 8)
    np.savez(root / "tokens.npz", train_codes=base[source].astype(np.int16), train_labels=np.zeros(40, np.int64),
             train_source=source, eval_codes=base[5:].astype(np.int16), eval_labels=np.zeros(1, np.int64),
             eval_codepoints=cps[5:], codebook_size=np.array(32))
    wrap(train_tokenizer([c for g in glyphs.values() for c in g["captions"]], 300)).save_pretrained(root / "tok")
    return root


def run(root, out, *extra):
    args = ["--tokens", str(root / "tokens.npz"), "--data", str(root / "data"), "--tokenizer", str(root / "tok"),
            "--out", str(out), "--dim", "48", "--n-layer", "2", "--n-head", "2", "--ffn-hidden", "64",
            "--batch-size", "8", "--lr", "3e-3", "--warmup", "5", "--log-every", "5", *extra]
    return train_t2i.main(args)


def test_trains_learns_the_caption_and_resumes(tiny_run, tmp_path):
    """Catches: prompts not reaching the model (conditional codes unlearnable), a broken resume, a
    final model that does not reload. Greedy codes of a training caption must be its glyph's codes."""
    out = tmp_path / "run"
    assert run(tiny_run, out, "--max-steps", "300") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 300 and report["final_train_loss"] < 0.5 * report["uniform_loss"]
    assert run(tiny_run, out, "--max-steps", "310") == 0  # resumes from the final checkpoint
    assert json.loads((out / "report.json").read_text())["steps"] == 310
    model, spec = train_t2i.load_final(out / "final")
    tok = load_tokenizer(tiny_run / "tok")
    with np.load(tiny_run / "tokens.npz") as z:
        want = torch.from_numpy(z["train_codes"][[0, 8]].astype(np.int64))
    ids = [tok(w + tok.boi_token)["input_ids"] for w in WORDS[:2]]
    logits = model.logits(Prompts.of(ids, "cpu"), want[:, :-1])
    assert (logits.argmax(-1) == want).float().mean() > 0.9


def test_unconditional_prompt_is_janus_rule(tiny_run):
    tok = load_tokenizer(tiny_run / "tok")
    table = train_t2i.CaptionTable(tok, emoji_captions.load_captions(tiny_run / "data"), np.array([0x1F300, 0x1F301]))
    ids, lengths = table.batch(torch.tensor([0, 1]), torch.Generator().manual_seed(0), dropout=0.999)
    boi = tok.convert_tokens_to_ids(tok.boi_token)
    for row, n in zip(ids, lengths):
        real = row[len(row) - n:].tolist()
        assert real[0] == tok.bos_token_id and real[-1] == boi
        assert set(real[1:-1]) == {tok.pad_token_id}


def test_forward_train_equals_per_row_logits():
    """The batched training forward (left-padded prompts of different lengths) computes, row by row,
    exactly the plain causal forward of that row's own sequence. Catches: padding attended, RoPE
    positions counted from the padded start, logits shifted by one."""
    from specvis.train.janus_format import JanusSpec, new_decoder

    spec = JanusSpec(text_vocab_size=40, bos=0, pad=1, boi=2, dim=32, n_layer=2, n_head=4, ffn_hidden=64, grid=3, codes=16)
    model = new_decoder(spec, init_std=0.3).eval()
    rows = [[0, 5, 6, 7, 8, 2], [0, 9, 2], [0, 3, 4, 2]]
    codes = torch.randint(0, 16, (3, 9), generator=torch.Generator().manual_seed(0))
    P = max(map(len, rows))
    ids = torch.full((3, P), spec.pad)
    for r, row in enumerate(rows):
        ids[r, P - len(row):] = torch.tensor(row)
    with torch.no_grad():
        got = model.forward_train(ids, torch.tensor([len(r) for r in rows]), codes)
        want = model.logits(Prompts.of(rows), codes[:, :-1])
    assert got.shape == want.shape == (3, 9, 16)
    assert (got - want).abs().max() < 1e-5
