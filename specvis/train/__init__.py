"""Training: emoji dataset, VQ tokenizer, AR models, tokenisation and reports."""

from specvis.io import atomic_write

__all__ = ["atomic_write"]
