"""Decoding methods: each a frozen dataclass with ``decode(ctx)`` (see ``methods.base``)."""

from .ar import AR
from .auto import Auto
from .base import Stats
from .cspd import CSpD
from .sjd import SJD, Jacobi
from .speculative import Speculative
from .static_tree import StaticTree
from .tree import ADTTree, EagleTree

__all__ = ["ADTTree", "AR", "Auto", "CSpD", "EagleTree", "SJD", "Jacobi", "Speculative", "StaticTree", "Stats"]
