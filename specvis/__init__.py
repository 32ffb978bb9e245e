"""specvis: speculative decoding for autoregressive image generators."""

from . import models
from .accept import Exact
from .generate import Generation, generate
from .lantern import Lantern
from .methods import ADTTree, AR, EagleTree, SJD, Jacobi, Speculative, Stats
from .models.base import TokenModel
from .sampling import Sampling

__version__ = "0.1.0"

__all__ = ["ADTTree", "AR", "EagleTree", "Exact", "Generation", "Jacobi", "SJD", "Sampling", "Speculative", "Stats", "TokenModel", "generate", "models"]
