"""Text-to-image emoji dataset: every single-codepoint Noto Color Emoji glyph with its names and captions.

Glyphs: every codepoint from U+00A9 to U+1FAFF that Unicode names (``unicodedata``) and that the font
renders to a non-empty, non-white 64x64 image (rendering as :func:`specvis.train.emoji_data.render_emoji`),
minus the emoji components that are not pictures (skin-tone modifiers, hair components, regional
indicator letters, ``emoji_data.EXCLUDED``). The font's cmap decides: a codepoint it lacks renders
empty and is dropped.

Words: the CLDR English annotations (Debian package ``unicode-cldr-core``,
``/usr/share/unicode/cldr/common/annotations/en.xml``, read at build time only): the short name
(``type="tts"``) and the keywords. A glyph CLDR does not annotate keeps its lower-cased Unicode name.

Captions of a glyph (deduplicated, in this order): the short name ("red apple"); the Unicode name
when it differs ("smiling face with smiling eyes"); the name followed by its first two keywords not
already in it ("red apple, fruit"); all keywords ("apple, fruit, red").

Split: in codepoint order, every 10th glyph (index % 10 == 9) is held out: its picture and all of its
captions are never trained on. ``labels`` keep the 11-class id of :mod:`specvis.train.emoji_data`
(-1 outside those classes) so the shipped classifier can score what a prompt asks for.

    python -m specvis.train.emoji_captions --out data/emoji_t2i

writes ``train.npz`` / ``eval.npz`` (``images``, ``labels``, ``codepoints``, as ``emoji_data``) and
``captions.json`` (``{"U+1F34E": {"name": ..., "keywords": [...], "captions": [...]}, ...}`` plus the
split and sources).
"""
from __future__ import annotations

import argparse
import json
import sys
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from specvis.train import atomic_write
from specvis.train.emoji_data import (EXCLUDED, IMAGE_SIZE, atomic_save_npz, class_of, ensure_font, load_font,
                                      render_emoji)

__all__ = ["CLDR_ANNOTATIONS", "read_annotations", "captions_for", "candidate_codepoints", "build", "main"]

CLDR_ANNOTATIONS = Path("/usr/share/unicode/cldr/common/annotations/en.xml")
CLDR_PACKAGE = "unicode-cldr-core"
FIRST, LAST = 0x00A9, 0x1FAFF
NOT_PICTURES = (*EXCLUDED, (0x1F1E6, 0x1F1FF), (0xFE00, 0xFE0F), (0x200D, 0x200D), (0x20E3, 0x20E3))
HOLDOUT_EVERY = 10


def read_annotations(path: str | Path = CLDR_ANNOTATIONS) -> dict[int, dict]:
    """Single-codepoint CLDR annotations: ``{codepoint: {"name": tts, "keywords": [...]}}`` (a trailing
    U+FE0F presentation selector is dropped; sequences are skipped)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"cannot read CLDR annotations {path} ({exc}); install the Debian package {CLDR_PACKAGE}") from None
    out: dict[int, dict] = {}
    for node in root.iter("annotation"):
        cp = node.get("cp", "").rstrip("\ufe0f")
        if len(cp) != 1 or not node.text:
            continue
        entry = out.setdefault(ord(cp), {"name": None, "keywords": []})
        if node.get("type") == "tts":
            entry["name"] = node.text.strip()
        else:
            entry["keywords"] = [w.strip() for w in node.text.split("|") if w.strip()]
    return out


def captions_for(name: str, keywords: list[str], unicode_name: str | None = None) -> list[str]:
    """The captions of one glyph (module docstring), deduplicated, lower case."""
    name = name.lower()
    kws = [k.lower() for k in keywords]
    extra = [k for k in kws if k not in name.split() and k != name][:2]
    options = [name, (unicode_name or "").lower(), ", ".join([name, *extra]) if extra else "", ", ".join(kws)]
    seen: list[str] = []
    for c in options:
        if c and c not in seen:
            seen.append(c)
    return seen


def candidate_codepoints() -> list[int]:
    """Named codepoints in [U+00A9, U+1FAFF] that are not emoji components (module docstring)."""
    return [cp for cp in range(FIRST, LAST + 1)
            if unicodedata.name(chr(cp), None) and not any(a <= cp <= b for a, b in NOT_PICTURES)]


def build(font_path: str | Path, annotations: dict[int, dict], codepoints: list[int] | None = None,
          size: int = IMAGE_SIZE) -> tuple[dict[str, np.ndarray], dict[int, dict]]:
    """Render every candidate the font draws: arrays (images, labels, codepoints) and word entries."""
    font = load_font(font_path)
    images, labels, cps, words = [], [], [], {}
    for cp in codepoints if codepoints is not None else candidate_codepoints():
        ann = annotations.get(cp)
        if ann is None and cp < 0x1F000:  # below the pictographic planes only CLDR-annotated glyphs are emoji
            continue
        img = render_emoji(cp, font, size)
        if img is None or img.min() >= 250:
            continue
        uname = unicodedata.name(chr(cp)).lower()
        name = (ann or {}).get("name") or uname
        keywords = (ann or {}).get("keywords", [])
        images.append(img)
        labels.append(-1 if class_of(cp) is None else class_of(cp))
        cps.append(cp)
        words[cp] = {"name": name, "keywords": keywords, "captions": captions_for(name, keywords, uname)}
    arrays = {"images": np.stack(images) if images else np.zeros((0, size, size, 3), np.uint8),
              "labels": np.asarray(labels, np.int64), "codepoints": np.asarray(cps, np.int64)}
    return arrays, words


def write(out: str | Path, font_path: str | Path, annotations_path: str | Path = CLDR_ANNOTATIONS) -> dict:
    """Build and write the dataset (atomic files); returns the summary stored in captions.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arrays, words = build(font_path, read_annotations(annotations_path))
    held = np.arange(len(arrays["codepoints"])) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    for split, mask in (("train", ~held), ("eval", held)):
        atomic_save_npz(out / f"{split}.npz", **{k: v[mask] for k, v in arrays.items()})
    summary = {
        "num_glyphs": len(words), "num_train": int((~held).sum()), "num_eval": int(held.sum()),
        "num_captions": sum(len(w["captions"]) for w in words.values()),
        "holdout": f"codepoint order, index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}",
        "eval_codepoints": [f"U+{cp:04X}" for cp in arrays["codepoints"][held]],
        "sources": {"font": str(font_path), "annotations": str(annotations_path),
                    "unicode_names": f"python unicodedata {unicodedata.unidata_version}"},
        "glyphs": {f"U+{cp:04X}": w for cp, w in words.items()},
    }
    atomic_write(out / "captions.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=1, ensure_ascii=False)))
    return summary


def load_captions(directory: str | Path) -> dict[int, list[str]]:
    """``{codepoint: captions}`` from a dataset directory's captions.json."""
    path = Path(directory) / "captions.json"
    try:
        glyphs = json.loads(path.read_text())["glyphs"]
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    return {int(k[2:], 16): v["captions"] for k, v in glyphs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.emoji_captions", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="data/emoji_t2i", help="dataset directory")
    p.add_argument("--font", default=None, help="NotoColorEmoji.ttf (default: the Debian location)")
    p.add_argument("--annotations", default=str(CLDR_ANNOTATIONS), help="CLDR annotations/en.xml")
    args = p.parse_args(argv)
    try:
        s = write(args.out, ensure_font(args.font), args.annotations)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{s['num_glyphs']} glyphs ({s['num_train']} train, {s['num_eval']} held out), {s['num_captions']} captions -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
