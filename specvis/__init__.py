"""specvis: speculative decoding for autoregressive image generators."""

from . import models
from .accept import Coupled, Exact
from .generate import Generation, generate
from .gsd import GSD
from .lantern import Lantern
from .methods import AR, SJD, Auto, ADTTree, CSpD, EagleTree, Jacobi, PJD, Speculative, StaticTree, Stats, ZipAR
from .models.base import Condition, Prompts, TokenModel
from .pipeline import Pipeline
from .sampling import Sampling
from .zoo import load

__version__ = "0.1.0"

__all__ = ["ADTTree", "AR", "Auto", "CSpD", "Condition", "Coupled", "EagleTree", "Exact", "GSD", "Generation", "Jacobi", "Lantern", "PJD", "Pipeline",
           "Prompts", "SJD", "Sampling", "Speculative", "StaticTree", "Stats", "TokenModel", "ZipAR", "generate", "load", "models"]
