"""Model families implementing ``CachedTokenModel`` (see ``models.base``)."""

from .base import CachedTokenModel, KVCache, Layout, TokenModel
from .llamagen import LlamaGen, LlamaGenConfig

__all__ = ["CachedTokenModel", "KVCache", "Layout", "LlamaGen", "LlamaGenConfig", "TokenModel"]

try:  # the VQ tokenizer lives in its own module
    from .vq import VQConfig, VQModel  # noqa: F401

    __all__ += ["VQConfig", "VQModel"]
except ImportError:  # pragma: no cover
    pass
