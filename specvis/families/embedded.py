"""The families of the embedded class-conditional bundles (``specvis.zoo``: ``emoji``, ``random-tiny``
and their continuous-token models): no checkpoint format to detect, only what their one ``Pipeline``
asks (``families.base.ClassFamily``): class ids in, images out through the tokenizer the bundle ships."""

from __future__ import annotations

import torch

from ..viz import to_pil
from .base import ClassFamily


class ClassCodes(ClassFamily):
    """A class-conditional model of discrete codes (LlamaGen layout): the tokenizer (the emoji VQ, or a
    palette for random models) decodes them and its codebook serves the acceptance rules (LANTERN)."""

    name = "class-codes"
    tokens = "discrete"


class ClassLatents(ClassFamily):
    """A class-conditional model of continuous tokens (``ContinuousAR``): the decoder's
    ``decode_continuous`` renders its latents; no codebook (methods: ``sv.CSpD`` and ``sv.AR``)."""

    name = "class-latents"
    tokens = "continuous"

    def check_method(self, pipe, method, sampling) -> None:
        """Continuous tokens run AR and CSpD only (as ``specvis generate`` refuses the others); ``sv.Auto``
        resolves to AR on them (``specvis.tune``)."""
        from ..methods.ar import AR
        from ..methods.auto import Auto
        from ..methods.cspd import CSpD

        if not isinstance(method, (AR, CSpD, Auto)):
            raise ValueError(f"model {pipe.name} has continuous tokens: method must be sv.AR() or sv.CSpD(...) "
                             f"(ar or cspd), got {type(method).__name__}")

    def codebook(self, pipe) -> None:
        return None

    def to_images(self, pipe, latents: torch.Tensor) -> list:
        return to_pil(pipe.tokenizer.decode_continuous(latents))


CODES = ClassCodes()
LATENTS = ClassLatents()
