"""Image codes to encoded pictures, run off the engine thread: VQ decode of a (possibly partial) grid,
PNG/JPEG/WebP encoding and base64."""

from __future__ import annotations

import base64
import io

import torch
from PIL import Image

from ..viz import to_pil

GREY = 128
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}


@torch.no_grad()
def render(pipe, codes: torch.Tensor, grid: tuple[int, int], committed: int | None = None) -> Image.Image:
    """The picture of image codes (H*W,) on ``grid``; ``committed``: only the first ``committed`` codes
    are real (a partial image): the token rows after the last complete one are grey."""
    H, W = grid
    codes = codes.to(pipe.device)[None]
    if committed is not None:
        codes = torch.where(torch.arange(H * W, device=codes.device) < committed, codes, 0)
    if pipe.conditioning == "class":
        pixels = pipe.decoder.decode(codes)
    else:
        pixels = pipe.family.decode_images(pipe.decoder, codes, H, W)
    image = to_pil(pixels)[0]
    if committed is not None:
        rows = committed // W
        top = image.height * rows // H
        if top < image.height:
            image.paste((GREY, GREY, GREY), (0, top, image.width, image.height))
    return image


def encoded(image: Image.Image, fmt: str) -> str:
    """Base64 of the image in ``fmt`` (png, jpeg or webp)."""
    buf = io.BytesIO()
    image.save(buf, format=PIL_FORMATS[fmt])
    return base64.b64encode(buf.getvalue()).decode("ascii")


def picture(pipe, codes: torch.Tensor, grid: tuple[int, int], fmt: str, committed: int | None = None) -> str:
    return encoded(render(pipe, codes, grid, committed), fmt)
