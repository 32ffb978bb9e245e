"""Assemble the embedded ``emoji-t2i`` bundle (``specvis/assets/emoji_t2i``) from finished runs.

    python -m specvis.train.t2i_bundle --target runs/t2i_target/final --draft runs/t2i_draft/final \\
        --vq specvis/assets/emoji/vq --tokenizer data/emoji_t2i/tokenizer --data data/emoji_t2i \\
        [--drafter runs/t2i_drafter/final] --out specvis/assets/emoji_t2i

``target/`` and ``draft/``: Janus-Pro checkpoints (:func:`specvis.train.janus_export.export_janus`,
fp32, default CFG scale ``--cfg``); ``drafter/``: the EAGLE head trained on the exported target
(``specvis train-drafter --model OUT/target``), copied when given; ``prompts.json``: every glyph's
short name with its emoji class (-1 outside the 11 classes), split and codepoint, the table the
benchmark's quality proxy reads; ``bundle.json``: sources and the training reports. Everything is
written to a staging directory and renamed into place.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from specvis.io import write_text

__all__ = ["prompt_table", "build", "main"]


def prompt_table(data: str | Path) -> dict[str, dict]:
    """``{short name (lower case): {"class", "split", "codepoint"}}`` for every glyph of the dataset
    (the first glyph wins when two share a name)."""
    data = Path(data)
    glyphs = json.loads((data / "captions.json").read_text())["glyphs"]
    table: dict[str, dict] = {}
    for split in ("train", "eval"):
        with np.load(data / f"{split}.npz") as z:
            for cp, label in zip(z["codepoints"].tolist(), z["labels"].tolist()):
                name = glyphs[f"U+{cp:04X}"]["name"].lower()  # the tokenizer lower-cases too
                table.setdefault(name, {"class": int(label), "split": split, "codepoint": f"U+{cp:04X}"})
    return table


def build(target: Path, draft: Path, vq: Path, tokenizer: Path, data: Path, out: Path,
          drafter: Path | None = None, cfg: float = 3.0) -> dict:
    from specvis.models.vq import VQModel
    from specvis.train.janus_export import export_janus
    from specvis.train.text_tokenizer import load as load_tokenizer
    from specvis.train.train_t2i import load_final

    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    vq_model, tok = VQModel.from_pretrained(vq).eval(), load_tokenizer(tokenizer)
    reports = {}
    for name, run in (("target", target), ("draft", draft)):
        model, spec = load_final(run)
        export_janus(model, spec, vq_model, tok, staging / name, guidance_scale=cfg)
        report = run.parent / "report.json"
        reports[name] = json.loads(report.read_text()) if report.exists() else {}
    if drafter is not None:
        shutil.copytree(drafter, staging / "drafter")
        report = drafter.parent / "report.json"
        reports["drafter"] = json.loads(report.read_text()) if report.exists() else {}
    table = prompt_table(data)
    write_text(staging / "prompts.json", json.dumps(table, indent=0, ensure_ascii=False))
    meta = {"name": "emoji-t2i", "family": "janus", "components": sorted(reports), "cfg_scale": cfg,
            "num_prompts": len(table), "data": json.loads((data / "captions.json").read_text())["sources"],
            "training": reports}
    write_text(staging / "bundle.json", json.dumps(meta, indent=1))
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.t2i_bundle", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="train_t2i final/ of the target")
    p.add_argument("--draft", required=True, help="train_t2i final/ of the draft")
    p.add_argument("--drafter", default=None, help="train_drafter final/ of the EAGLE head (optional)")
    p.add_argument("--vq", default="specvis/assets/emoji/vq", help="the VQ the codes were made with")
    p.add_argument("--tokenizer", default="data/emoji_t2i/tokenizer")
    p.add_argument("--data", default="data/emoji_t2i", help="emoji_captions dataset directory")
    p.add_argument("--out", default="specvis/assets/emoji_t2i")
    p.add_argument("--cfg", type=float, default=3.0, help="default CFG scale (generation_config.json)")
    a = p.parse_args(argv)
    try:
        meta = build(Path(a.target), Path(a.draft), Path(a.vq), Path(a.tokenizer), Path(a.data), Path(a.out),
                     Path(a.drafter) if a.drafter else None, a.cfg)
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {', '.join(meta['components'])}, {meta['num_prompts']} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
