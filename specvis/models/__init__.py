"""Model families implementing ``CachedTokenModel`` (see ``models.base``)."""

from .base import CachedTokenModel, KVCache, Layout, TokenModel
from .continuous import ContinuousAR, ContinuousARConfig, DiffusionHead
from .drafter import DrafterConfig, EagleDrafter
from .llamagen import LlamaGen, LlamaGenConfig
from .vq import VQConfig, VQModel

__all__ = ["CachedTokenModel", "ContinuousAR", "ContinuousARConfig", "DiffusionHead", "DrafterConfig", "EagleDrafter",
           "KVCache", "Layout", "LlamaGen", "LlamaGenConfig", "TokenModel", "VQConfig", "VQModel"]
