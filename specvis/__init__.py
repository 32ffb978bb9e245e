"""specvis: speculative decoding for autoregressive image generators."""

from .interrupt import during_import

_restore_hook = during_import()  # Ctrl+C while torch and the rest import: one line (specvis.interrupt)

from . import models  # noqa: E402
from .accept import Coupled, Exact  # noqa: E402
from .generate import Generation, generate  # noqa: E402
from .gsd import GSD  # noqa: E402
from .lantern import Lantern  # noqa: E402
from .methods import AR, SJD, Auto, ADTTree, CSpD, EagleTree, Jacobi, PJD, Speculative, StaticTree, Stats, ZipAR  # noqa: E402
from .models.base import Condition, Prompts, TokenModel  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .sampling import Sampling  # noqa: E402
from .zoo import load  # noqa: E402

__version__ = "0.1.0"
_restore_hook()

__all__ = ["ADTTree", "AR", "Auto", "CSpD", "Condition", "Coupled", "EagleTree", "Exact", "GSD", "Generation", "Jacobi", "Lantern", "PJD", "Pipeline",
           "Prompts", "SJD", "Sampling", "Speculative", "StaticTree", "Stats", "TokenModel", "ZipAR", "generate", "load", "models"]
