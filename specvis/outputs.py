"""Everything the commands write, each file atomically (``io.atomic_write``: a temporary sibling
renamed onto the target, so a reader never sees half a file and a killed run leaves only a temporary
that ``io.clean_stale_temps`` removes): text and JSON, PNG images and figures, a generation's images
with their contact sheet, acceptance heatmap and ``stats.json``, and the uint8 ``samples.npz`` of FID
evaluators. Output paths are checked before the work starts (``io.check_output_file``,
``io.check_output_dir``); a user's unrelated file is never taken for an output."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .io import atomic_write, write_text

__all__ = ["write_text", "write_json", "write_arrays", "write_png", "write_figure", "write_generation", "write_npz"]

Target = str | os.PathLike


def write_json(path: Target, data: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(data, indent=indent))


def write_arrays(path: Target, arrays: dict[str, np.ndarray]) -> None:
    """Named arrays in a compressed npz (``np.savez_compressed``)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    atomic_write(path, write)


def write_png(image, path: Target) -> None:
    """A PIL image as a PNG."""
    atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


def write_figure(fig, path: Target, **savefig: Any) -> None:
    """A matplotlib figure as a PNG (``savefig``: its keyword arguments, e.g. ``dpi``)."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", **savefig))


def write_generation(out_dir: Target, images: list, accept_map, cell: int, stats: dict[str, Any]) -> None:
    """``specvis generate``'s outputs in ``out_dir`` (made on first write): ``NNN.png`` per image,
    ``grid.png`` (their contact sheet), ``heatmap.png`` (the acceptance map, ``cell`` pixels a
    token), ``stats.json``."""
    from .viz import contact_sheet, heatmap_sheet

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    for i, im in enumerate(images):
        write_png(im, out / f"{i:03d}.png")
    write_png(contact_sheet(images), out / "grid.png")
    write_png(heatmap_sheet(accept_map, cell=cell), out / "heatmap.png")
    write_json(out / "stats.json", stats)


def _rgb(p: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(p) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except FileNotFoundError:
        raise ValueError(f"{p}: missing; rerun to regenerate it") from None
    except (OSError, SyntaxError, ValueError) as e:  # PIL: truncated or not an image
        raise ValueError(f"{p}: unreadable image ({' '.join(str(e).split())[:80]}); delete it and rerun "
                         "to regenerate it") from None


def write_npz(path: Target, pngs: list[Path]) -> tuple[int, ...]:
    """``pngs`` as one uint8 (N, H, W, 3) array ``arr_0`` in an npz (what ``np.savez`` writes),
    streamed one image at a time into a temp file, then renamed onto ``path``."""
    first = _rgb(pngs[0])
    shape = (len(pngs), *first.shape)

    def write(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            with zf.open("arr_0.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
                                                         "fortran_order": False, "shape": shape})
                for p in pngs:
                    a = first if p == pngs[0] else _rgb(p)
                    if a.shape != first.shape:
                        raise ValueError(f"{p}: image is {a.shape[1]}x{a.shape[0]}, the first is "
                                         f"{first.shape[1]}x{first.shape[0]}")
                    f.write(np.ascontiguousarray(a).tobytes())

    atomic_write(path, write)
    return shape
