"""Decoding methods: each a frozen dataclass with ``decode(ctx)`` (see ``methods.base``)."""

from .ar import AR
from .base import Stats
from .sjd import SJD, Jacobi
from .speculative import Speculative
from .tree import ADTTree, EagleTree

__all__ = ["ADTTree", "AR", "EagleTree", "SJD", "Jacobi", "Speculative", "Stats"]
