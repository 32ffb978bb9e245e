"""Model families implementing ``CachedTokenModel`` (see ``models.base``)."""

from .base import CachedTokenModel, Condition, KVCache, Layout, Prompts, TokenModel
from .continuous import ContinuousAR, ContinuousARConfig, DiffusionHead
from .decoder import DecoderConfig, PromptDecoder
from .drafter import DrafterConfig, EagleDrafter
from .llamagen import LlamaGen, LlamaGenConfig
from .vq import VQConfig, VQModel

__all__ = ["CachedTokenModel", "Condition", "ContinuousAR", "ContinuousARConfig", "DecoderConfig", "DiffusionHead",
           "DrafterConfig", "EagleDrafter", "KVCache", "Layout", "LlamaGen", "LlamaGenConfig", "PromptDecoder", "Prompts",
           "TokenModel", "VQConfig", "VQModel"]
