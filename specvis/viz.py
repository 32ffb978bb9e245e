"""Images from tensors: decoded grids, contact sheets and acceptance heatmaps (Pillow + numpy)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

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


def heatmap_scale(maps: torch.Tensor, vmax: float | None = None) -> tuple[float, float]:
    """(vmin, vmax) of the colour scale of ``maps``: from 1 (one token a forward, AR) to the largest
    value (0 to 1 where nothing exceeds 1)."""
    vmax = float(maps.max()) if vmax is None else vmax
    return (1.0 if vmax > 1 else 0.0), max(vmax, 1.0)


def heatmaps(maps: torch.Tensor, cell: int = 8, vmax: float | None = None) -> list[Image.Image]:
    """One heatmap image per (H, W) map of ``maps`` (B, H, W), on a shared colour scale (``heatmap_scale``)."""
    arr = maps.float().cpu().numpy()
    rgb = colormap(arr, *heatmap_scale(maps.float(), vmax))
    return [Image.fromarray(a, "RGB").resize((a.shape[1] * cell, a.shape[0] * cell), Image.NEAREST) for a in rgb]


def colour_bar(vmin: float, vmax: float, height: int, label: str, width: int = 14) -> Image.Image:
    """A vertical colour bar for the ramp over [vmin, vmax], ``height`` pixels tall (vmax at the top),
    with integer ticks and ``label`` written along it, on white."""
    font = ImageFont.load_default()
    text = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), label, font=font)
    caption = Image.new("RGB", (text[2] + 2, text[3] + 2), "white")
    ImageDraw.Draw(caption).text((1, 0), label, fill="black", font=font)
    caption = caption.rotate(90, expand=True)
    height = max(height, caption.height)
    column = colormap(np.linspace(vmax, vmin, height), vmin, vmax)  # (height, 3): top row is vmax
    span = int(vmax - vmin)
    step = max(1, -(-span * 16 // height))  # integer ticks at least 16 pixels apart
    ticks = [vmin + k for k in range(0, span + 1, step)]
    if ticks[-1] != vmax:  # the top of the scale is always labelled
        ticks = ticks[:-1] if (vmax - ticks[-1]) * height < 16 * max(vmax - vmin, 1e-9) else ticks
        ticks.append(vmax)
    tick_w = max(ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), f"{t:g}", font=font)[2] for t in ticks)
    bar = Image.new("RGB", (width + 4 + tick_w + 4 + caption.width, height), "white")
    bar.paste(Image.fromarray(np.repeat(column[:, None], width, 1), "RGB"), (0, 0))
    draw = ImageDraw.Draw(bar)
    for t in ticks:
        y = round((vmax - t) / max(vmax - vmin, 1e-9) * (height - 1))
        draw.line([(width, y), (width + 2, y)], fill="black")
        draw.text((width + 4, min(max(y - 5, 0), height - 11)), f"{t:g}", fill="black", font=font)
    bar.paste(caption, (width + 4 + tick_w + 4, max((height - caption.height) // 2, 0)))
    return bar


def heatmap_sheet(maps: torch.Tensor, cell: int = 8) -> Image.Image:
    """The heatmaps of ``maps`` (B, H, W) tiled on one sheet, with a colour bar on its right that says
    what the colours mean: the tokens committed by the target forward that committed each token."""
    sheet = contact_sheet(heatmaps(maps, cell=cell))
    bar = colour_bar(*heatmap_scale(maps.float()), height=sheet.height - 4, label="tokens committed by the forward")
    out = Image.new("RGB", (sheet.width + bar.width + 4, max(sheet.height, bar.height + 4)), "white")
    out.paste(sheet, (0, 0))
    out.paste(bar, (sheet.width, 2))
    return out
