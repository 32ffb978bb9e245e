"""Decoding methods: each a frozen dataclass with ``decode(ctx)`` (see ``methods.base``), most handing their
drafter to a shared loop (``methods.proposer``: chains and 2-D rows; ``methods.trees``: trees)."""

from .adt import ADTTree
from .ar import AR
from .auto import Auto
from .base import Stats
from .cspd import CSpD
from .eagle import EagleTree
from .pjd import PJD
from .jacobi import Jacobi
from .sjd import SJD
from .speculative import Speculative
from .static_tree import StaticTree
from .zipar import ZipAR

__all__ = ["ADTTree", "AR", "Auto", "CSpD", "EagleTree", "PJD", "SJD", "Jacobi", "Speculative", "StaticTree", "Stats", "ZipAR"]
