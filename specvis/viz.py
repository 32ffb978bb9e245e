"""Images from tensors: decoded grids, contact sheets and acceptance heatmaps (Pillow + numpy)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

# a perceptual dark-blue -> teal -> yellow ramp (viridis-like anchor colours)
_RAMP = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """(B, 3, H, W) in [-1, 1] -> RGB PIL images."""
    arr = ((images.detach().float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a, "RGB") for a in arr]


def contact_sheet(images: list[Image.Image], ncol: int | None = None, pad: int = 2) -> Image.Image:
    """Tile equally sized images on a white sheet, ``ncol`` per row (default: about square)."""
    if not images:
        raise ValueError("contact_sheet needs at least one image")
    ncol = ncol or int(np.ceil(np.sqrt(len(images))))
    nrow = -(-len(images) // ncol)
    w, h = images[0].size
    sheet = Image.new("RGB", (ncol * (w + pad) + pad, nrow * (h + pad) + pad), "white")
    for i, im in enumerate(images):
        sheet.paste(im, (pad + (i % ncol) * (w + pad), pad + (i // ncol) * (h + pad)))
    return sheet


def colormap(values: np.ndarray, vmin: float, vmax: float) -> np.ndarray:
    """Map values to RGB uint8 along the ramp."""
    t = np.clip((values - vmin) / max(vmax - vmin, 1e-9), 0, 1) * (len(_RAMP) - 1)
    lo = np.floor(t).astype(int).clip(0, len(_RAMP) - 2)
    frac = (t - lo)[..., None]
    return (_RAMP[lo] * (1 - frac) + _RAMP[lo + 1] * frac).round().astype(np.uint8)


def heatmaps(maps: torch.Tensor, cell: int = 8, vmax: float | None = None) -> list[Image.Image]:
    """One heatmap image per (H, W) map of ``maps`` (B, H, W), on a shared colour scale."""
    arr = maps.float().cpu().numpy()
    vmax = float(arr.max()) if vmax is None else vmax
    rgb = colormap(arr, 1.0 if vmax > 1 else 0.0, max(vmax, 1.0))
    return [Image.fromarray(a, "RGB").resize((a.shape[1] * cell, a.shape[0] * cell), Image.NEAREST) for a in rgb]
