"""Decoding methods: each a frozen dataclass with ``decode(ctx)`` (see ``methods.base``)."""

from .ar import AR
from .base import Stats
from .speculative import Speculative

__all__ = ["AR", "Speculative", "Stats"]
