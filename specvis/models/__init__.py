"""Model families implementing ``CachedTokenModel`` (see ``models.base``)."""

from .base import CachedTokenModel, KVCache, Layout, TokenModel
from .drafter import DrafterConfig, EagleDrafter
from .llamagen import LlamaGen, LlamaGenConfig
from .vq import VQConfig, VQModel

__all__ = ["CachedTokenModel", "DrafterConfig", "EagleDrafter", "KVCache", "Layout", "LlamaGen", "LlamaGenConfig",
           "TokenModel", "VQConfig", "VQModel"]
