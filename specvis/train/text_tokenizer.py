"""A byte-level BPE caption tokenizer trained with Hugging Face ``tokenizers`` (the kind Janus-Pro ships).

Lower-casing NFKC normaliser, byte-level pre-tokenizer (any text encodes; no unknown token), BPE
merges learnt from the training captions only, Janus-Pro's special tokens (``janus_format.SPECIAL_TOKENS``)
at ids 0-5, BOS prepended by the post-processor. ``wrap`` gives the ``PreTrainedTokenizerFast`` that
``JanusProcessor`` needs (its ``image_token`` / ``boi_token`` / ``eoi_token`` attributes).

    python -m specvis.train.text_tokenizer --data data/emoji_t2i --out data/emoji_t2i/tokenizer --vocab 2048
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from specvis.train.emoji_captions import load_captions
from specvis.train.janus_format import SPECIAL_TOKENS

__all__ = ["train_tokenizer", "wrap", "load", "main"]


def train_tokenizer(texts: list[str], vocab_size: int = 2048):
    """A ``tokenizers.Tokenizer`` (byte-level BPE) learnt from ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = list(SPECIAL_TOKENS.values())
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B:1",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def wrap(tok):
    """The transformers tokenizer around ``tok`` (left padding, Janus's named special tokens)."""
    from transformers import PreTrainedTokenizerFast

    t = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=t["bos"], eos_token=t["eos"], pad_token=t["pad"],
                                   padding_side="left", model_max_length=4096,
                                   extra_special_tokens={"image_token": t["image"], "boi_token": t["boi"],
                                                         "eoi_token": t["eoi"]})


def load(directory: str | Path):
    """A tokenizer saved by ``main`` (``tokenizer.json`` + ``tokenizer_config.json``)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.text_tokenizer", description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/emoji_t2i", help="dataset directory (captions.json, train.npz)")
    p.add_argument("--out", default="data/emoji_t2i/tokenizer", help="where tokenizer.json and its config go")
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary size including the special tokens")
    args = p.parse_args(argv)
    if args.vocab < len(SPECIAL_TOKENS) + 256:
        p.error(f"--vocab must be >= {len(SPECIAL_TOKENS) + 256} (specials + the byte alphabet)")
    try:
        captions = load_captions(args.data)
        with np.load(Path(args.data) / "train.npz") as z:
            train = [int(c) for c in z["codepoints"]]
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    texts = [c for cp in train for c in captions[cp]]
    tokenizer = wrap(train_tokenizer(texts, args.vocab))
    tokenizer.save_pretrained(args.out)
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    print(f"vocab {len(tokenizer)} from {len(texts)} training captions; tokens per caption (with BOS) "
          f"mean {np.mean(lengths):.1f}, max {max(lengths)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
