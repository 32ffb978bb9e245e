"""Class-conditional colour-emoji dataset (64x64 RGB) rendered from Noto Color Emoji.

Source: Debian package ``fonts-noto-color-emoji`` (NotoColorEmoji.ttf, a CBDT bitmap font that Pillow
renders only at size 109 with ``embedded_color=True``). Each glyph is composited onto white, cropped
to a square around its alpha bounding box (centred, 6% margin per side) and resized to 64x64.

Which codepoints: single codepoints in the class ranges below (all >= U+1F300) whose rendered glyph
is non-empty, minus the emoji *components* that are not standalone pictures: skin-tone modifiers
U+1F3FB-1F3FF and hair components U+1F9B0-1F9B3.

Class rule (fixed, reproducible): one class per Unicode block at or above U+1F300 with at least
60 rendered glyphs; the large Miscellaneous Symbols and Pictographs block (1F300-1F5FF) is split at
its chart subheading boundaries into 6 ranges, and Supplemental Symbols and Pictographs (1F900-1F9FF)
into two halves. Blocks with fewer than 60 glyphs (Geometric Shapes Extended 1F780-1F7FF: 13) are
dropped. See ``CLASSES`` for the names and ranges.

Split: within each class, sorted by codepoint, every 10th glyph (index % 10 == 9) is held out for
evaluation (10% per class, deterministic).

Rebuild: ``python -m specvis.train.emoji_data --out data/emoji`` writes ``train.npz`` and
``eval.npz`` (``images`` uint8 (N, 64, 64, 3), ``labels`` int64, ``codepoints`` int64) and
``classes.json``. ``synthetic_dataset`` is a font-free stand-in for tests.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from specvis.train import atomic_write

__all__ = [
    "CLASSES", "EXCLUDED", "FONT_PACKAGE", "EmojiClass", "augment", "build_dataset", "class_of",
    "find_font", "flip_safe", "holdout_mask", "load_split", "render_emoji", "synthetic_dataset",
]

IMAGE_SIZE = 64
FONT_PACKAGE = "fonts-noto-color-emoji"
FONT_SIZE = 109  # the only size of the CBDT strike
FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf",
    "/usr/share/fonts/noto/NotoColorEmoji.ttf",
    "/usr/share/fonts/google-noto-emoji/NotoColorEmoji.ttf",
)
MARGIN = 0.06
HOLDOUT_EVERY = 10


@dataclass(frozen=True)
class EmojiClass:
    name: str
    start: int  # first codepoint, inclusive
    end: int  # last codepoint, inclusive
    source: str  # Unicode block / chart subheadings the range covers


CLASSES: tuple[EmojiClass, ...] = (
    EmojiClass("sky_weather_plants_food", 0x1F300, 0x1F37F,
               "Misc Symbols and Pictographs: weather, landscape, sky, plants, food and drink"),
    EmojiClass("celebration_sport_places", 0x1F380, 0x1F3FF,
               "Misc Symbols and Pictographs: celebration, entertainment, sport, buildings, flags"),
    EmojiClass("animals", 0x1F400, 0x1F43F, "Misc Symbols and Pictographs: animal symbols"),
    EmojiClass("people_body_hearts", 0x1F440, 0x1F4AF,
               "Misc Symbols and Pictographs: facial parts, portraits, fairy tale, romance, hearts, comic style"),
    EmojiClass("money_office_media", 0x1F4B0, 0x1F4FF,
               "Misc Symbols and Pictographs: money, office, communication, audio and video"),
    EmojiClass("ui_clocks_misc", 0x1F500, 0x1F5FF,
               "Misc Symbols and Pictographs: user interface, religious, clock faces, misc, map"),
    EmojiClass("smileys", 0x1F600, 0x1F64F, "Emoticons block"),
    EmojiClass("transport_map", 0x1F680, 0x1F6FF, "Transport and Map Symbols block"),
    EmojiClass("faces_sport_food", 0x1F900, 0x1F97F, "Supplemental Symbols and Pictographs, first half"),
    EmojiClass("animals_people_objects", 0x1F980, 0x1F9FF, "Supplemental Symbols and Pictographs, second half"),
    EmojiClass("objects_extended", 0x1FA70, 0x1FAFF, "Symbols and Pictographs Extended-A block"),
)

EXCLUDED: tuple[tuple[int, int], ...] = ((0x1F3FB, 0x1F3FF), (0x1F9B0, 0x1F9B3))  # inclusive ranges

# Glyphs whose mirror image is wrong (text, digits, clock faces): do not flip these.
FLIP_UNSAFE: tuple[tuple[int, int], ...] = (
    (0x1F51F, 0x1F524),  # keycap 10, input symbols (letters/numbers)
    (0x1F550, 0x1F567),  # clock faces
    (0x1F4AF, 0x1F4AF),  # hundred points
    (0x1F6AB, 0x1F6AD),  # no-entry style signs with text-like strokes
)


def class_of(codepoint: int) -> int | None:
    """Class id of a codepoint under the documented rule, or None if it is not in the dataset."""
    if any(a <= codepoint <= b for a, b in EXCLUDED):
        return None
    for i, c in enumerate(CLASSES):
        if c.start <= codepoint <= c.end:
            return i
    return None


def flip_safe(codepoints: np.ndarray) -> np.ndarray:
    """Boolean mask: True where horizontally flipping the glyph is harmless."""
    cps = np.asarray(codepoints)
    bad = np.zeros(cps.shape, dtype=bool)
    for a, b in FLIP_UNSAFE:
        bad |= (cps >= a) & (cps <= b)
    return ~bad


def holdout_mask(labels: np.ndarray, codepoints: np.ndarray, every: int = HOLDOUT_EVERY) -> np.ndarray:
    """True for held-out items: per class, sorted by codepoint, index % every == every - 1."""
    labels, codepoints = np.asarray(labels), np.asarray(codepoints)
    if labels.shape != codepoints.shape or labels.ndim != 1:
        raise ValueError("labels and codepoints must be 1-D arrays of the same length")
    if every < 2:
        raise ValueError(f"every must be >= 2, got {every}")
    mask = np.zeros(len(labels), dtype=bool)
    for k in np.unique(labels):
        idx = np.flatnonzero(labels == k)
        idx = idx[np.argsort(codepoints[idx], kind="stable")]
        mask[idx[every - 1::every]] = True
    return mask


# --------------------------------------------------------------------------- rendering


def find_font(path: str | os.PathLike | None = None) -> Path | None:
    """The emoji font: ``path``, $SPECVIS_EMOJI_FONT, or a standard Debian/Fedora location."""
    options = [path] if path else [os.environ.get("SPECVIS_EMOJI_FONT"), *FONT_CANDIDATES]
    for p in options:
        if p and Path(p).is_file():
            return Path(p)
    return None


def ensure_font(path: str | os.PathLike | None = None) -> Path:
    """Find the font; as root try ``apt-get install``; else exit with a one-line message."""
    found = find_font(path)
    if found is None and path is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", FONT_PACKAGE], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found = find_font(path)
    if found is None:
        where = path or FONT_CANDIDATES[0]
        raise SystemExit(f"error: emoji font not found at {where}; install the Debian package {FONT_PACKAGE}")
    return found


def load_font(path: str | os.PathLike) -> ImageFont.FreeTypeFont:
    try:
        return ImageFont.truetype(str(path), FONT_SIZE)
    except OSError as exc:
        raise ValueError(f"font {path} cannot be opened at size {FONT_SIZE}: {exc}") from None


def render_emoji(codepoint: int, font: ImageFont.FreeTypeFont, size: int = IMAGE_SIZE,
                 margin: float = MARGIN) -> np.ndarray | None:
    """Render one codepoint to (size, size, 3) uint8 on white, or None if the glyph is empty."""
    canvas = 256
    rgba = Image.new("RGBA", (canvas, canvas), (255, 255, 255, 0))
    ImageDraw.Draw(rgba).text((48, 48), chr(codepoint), font=font, embedded_color=True)
    bbox = rgba.getchannel("A").getbbox()
    if bbox is None:
        return None
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, rgba).convert("RGB")
    x0, y0, x1, y1 = bbox
    side = max(x1 - x0, y1 - y0) * (1.0 + 2.0 * margin)
    cx, cy = (x0 + x1) / 2.0, (y0 + y1) / 2.0
    box = (cx - side / 2.0, cy - side / 2.0, cx + side / 2.0, cy + side / 2.0)
    out = rgb.resize((size, size), Image.Resampling.LANCZOS, box=box)
    return np.asarray(out, dtype=np.uint8).copy()


def build_dataset(font_path: str | os.PathLike, size: int = IMAGE_SIZE) -> dict[str, np.ndarray]:
    """Render every dataset glyph: images (N, size, size, 3) uint8, labels, codepoints (codepoint order)."""
    font = load_font(font_path)
    images, labels, cps = [], [], []
    for k, cls in enumerate(CLASSES):
        for cp in range(cls.start, cls.end + 1):
            if class_of(cp) != k:
                continue
            img = render_emoji(cp, font, size)
            if img is None or img.min() >= 250:  # empty or all-white glyph
                continue
            images.append(img)
            labels.append(k)
            cps.append(cp)
    return {
        "images": np.stack(images) if images else np.zeros((0, size, size, 3), np.uint8),
        "labels": np.asarray(labels, dtype=np.int64),
        "codepoints": np.asarray(cps, dtype=np.int64),
    }


# --------------------------------------------------------------------------- files


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    atomic_write(path, write)


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def load_split(directory: str | os.PathLike, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images uint8 (N, H, W, 3), labels, codepoints) of ``train`` or ``eval`` in ``directory``."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    path = Path(directory) / f"{split}.npz"
    try:
        with np.load(path) as z:
            images, labels = z["images"], z["labels"]
            cps = z["codepoints"] if "codepoints" in z else np.full(len(labels), -1, np.int64)
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"cannot read dataset split {path}: {exc}") from None
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or len(images) != len(labels):
        raise ValueError(f"{path}: images must be uint8 (N, H, W, 3) matching labels")
    return images, labels.astype(np.int64), cps.astype(np.int64)


def write_dataset(out: str | os.PathLike, font_path: str | os.PathLike, size: int = IMAGE_SIZE) -> dict:
    """Render, split and write ``train.npz``, ``eval.npz`` and ``classes.json``; return the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = build_dataset(font_path, size)
    held = holdout_mask(data["labels"], data["codepoints"])
    for name, mask in (("train", ~held), ("eval", held)):
        atomic_save_npz(out / f"{name}.npz", **{k: v[mask] for k, v in data.items()})
    font_sha = hashlib.sha256(Path(font_path).read_bytes()).hexdigest()
    classes = []
    for k, c in enumerate(CLASSES):
        sel = data["labels"] == k
        classes.append({
            "id": k, "name": c.name, "start": f"U+{c.start:04X}", "end": f"U+{c.end:04X}", "source": c.source,
            "num_train": int((sel & ~held).sum()), "num_eval": int((sel & held).sum()),
        })
    summary = {
        "image_size": size, "num_classes": len(CLASSES), "classes": classes,
        "excluded": [f"U+{a:04X}-U+{b:04X}" for a, b in EXCLUDED],
        "holdout": f"per class, sorted by codepoint, index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}",
        "font": str(font_path), "font_sha256": font_sha,
        "num_train": int((~held).sum()), "num_eval": int(held.sum()),
    }
    _atomic_write_text(out / "classes.json", json.dumps(summary, indent=2) + "\n")
    return summary


# --------------------------------------------------------------------------- augmentation


def augment(images: np.ndarray, seed: int, *, max_shift: float = 0.06, scale: tuple[float, float] = (0.9, 1.1),
            flip: bool | np.ndarray = True) -> np.ndarray:
    """Random scale + shift (white fill) and optional horizontal flip; seeded, returns a new array.

    ``max_shift`` is a fraction of the image side; ``flip`` is a bool or a per-image boolean mask
    (e.g. :func:`flip_safe` of the codepoints) saying where flipping is allowed (probability 1/2).
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
    if not (0 < scale[0] <= scale[1]):
        raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi, got {scale}")
    if max_shift < 0:
        raise ValueError(f"max_shift must be >= 0, got {max_shift}")
    n, h, w, _ = images.shape
    allow = np.broadcast_to(np.asarray(flip, dtype=bool), (n,))
    rng = np.random.default_rng(seed)
    s = rng.uniform(scale[0], scale[1], n)
    dx = rng.uniform(-max_shift, max_shift, n) * w
    dy = rng.uniform(-max_shift, max_shift, n) * h
    do_flip = (rng.random(n) < 0.5) & allow
    out = np.empty_like(images)
    cx, cy = w / 2.0, h / 2.0
    for i in range(n):
        img = Image.fromarray(images[i])
        if do_flip[i]:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        # output pixel (x, y) samples input at ((x - cx - dx) / s + cx, (y - cy - dy) / s + cy)
        inv = 1.0 / s[i]
        coeffs = (inv, 0.0, cx - (cx + dx[i]) * inv, 0.0, inv, cy - (cy + dy[i]) * inv)
        img = img.transform((w, h), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BICUBIC,
                            fillcolor=(255, 255, 255))
        out[i] = np.asarray(img)
    return out


# --------------------------------------------------------------------------- synthetic stand-in

_SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "hbar", "star")
_COLOURS = ((220, 40, 40), (40, 160, 60), (40, 80, 220), (240, 180, 20), (150, 50, 200), (20, 180, 200),
            (240, 110, 20), (90, 90, 90))


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, colour) -> None:
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    elif shape == "cross":
        t = r / 3
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=colour)
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=colour)
    elif shape == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=colour, width=max(2, int(r / 3)))
    elif shape == "hbar":
        draw.rectangle((cx - r, cy - r / 3, cx + r, cy + r / 3), fill=colour)
    else:  # star: two overlaid triangles
        draw.polygon([(cx, cy - r), (cx + r, cy + r / 2), (cx - r, cy + r / 2)], fill=colour)
        draw.polygon([(cx, cy + r), (cx + r, cy - r / 2), (cx - r, cy - r / 2)], fill=colour)


def synthetic_dataset(n_per_class: int, num_classes: int, seed: int = 0,
                      size: int = IMAGE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Font-free stand-in: one shape type/colour per class on white, jittered position and size.

    Returns (images uint8 (n_per_class * num_classes, size, size, 3), labels int64), class-major order.
    """
    if n_per_class < 1:
        raise ValueError(f"n_per_class must be >= 1, got {n_per_class}")
    if not 1 <= num_classes <= len(_SHAPES) * len(_COLOURS):
        raise ValueError(f"num_classes must be in [1, {len(_SHAPES) * len(_COLOURS)}], got {num_classes}")
    if size < 8:
        raise ValueError(f"size must be >= 8, got {size}")
    rng = np.random.default_rng(seed)
    images = np.empty((n_per_class * num_classes, size, size, 3), np.uint8)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), n_per_class)
    for i, k in enumerate(labels):
        shape = _SHAPES[k % len(_SHAPES)]
        colour = _COLOURS[(k // len(_SHAPES) + k) % len(_COLOURS)]
        img = Image.new("RGB", (size, size), (255, 255, 255))
        r = size * rng.uniform(0.25, 0.4)
        cx, cy = size / 2 + rng.uniform(-0.1, 0.1, 2) * size
        _draw_shape(ImageDraw.Draw(img), shape, cx, cy, r, colour)
        images[i] = np.asarray(img)
    return images, labels


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specvis.train.emoji_data", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/emoji", help="output directory")
    parser.add_argument("--font", default=None, help="path to NotoColorEmoji.ttf (default: system font)")
    parser.add_argument("--size", type=int, default=IMAGE_SIZE, help="image side in pixels")
    args = parser.parse_args(argv)
    if args.size < 8:
        raise SystemExit(f"error: --size must be >= 8, got {args.size}")
    font = ensure_font(args.font)
    summary = write_dataset(args.out, font, args.size)
    for c in summary["classes"]:
        print(f"{c['id']:2d} {c['name']:<26} {c['start']}-{c['end']}  train {c['num_train']:4d}  eval {c['num_eval']:3d}")
    print(f"wrote {args.out}: {summary['num_train']} train, {summary['num_eval']} eval, {summary['num_classes']} classes")
    small = [c["name"] for c in summary["classes"] if c["num_train"] + c["num_eval"] < 60]
    if small:
        print(f"warning: classes with fewer than 60 images: {', '.join(small)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
