"""Assemble the embedded emoji bundle (``specvis/assets/emoji``) from finished training runs.

    python -m specvis.train.bundle --runs runs --data data/emoji --out specvis/assets/emoji
    python -m specvis.train.bundle --runs runs --add continuous_target continuous_draft
    python -m specvis.train.bundle --runs runs --add mar_target mar_draft
    python -m specvis.train.bundle --add draft drafter --source draft=runs/distill_draft --source drafter=runs/distill_drafter

Copies each component's ``final/`` model as fp16 safetensors + config (the VQ, the target and the
draft are required; the classifier, the EAGLE drafter and the continuous models are added when their
runs exist) and writes ``bundle.json`` with class names, default sampling and where each part came from.
The MAR parts come from ``specvis.train.train_mar`` runs (``runs/mar_emoji``, ``runs/mar_emoji_draft``)
and stay in MAR's official ``checkpoint-last.pth`` layout, slimmed to the EMA weights in fp16
(``model_ema`` and ``args``; ``load_mar_checkpoint`` reads them).
``--add`` puts optional parts into an existing bundle and updates its ``bundle.json``, leaving the rest.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from ..io import write_text
from ..models.checkpoint import CONFIG_NAME, WEIGHTS_NAME, read_pretrained

REQUIRED = ("vq", "target", "draft")
MAR_RUNS = {"mar_target": "mar_emoji", "mar_draft": "mar_emoji_draft"}  # bundle part -> train_mar run directory
OPTIONAL = ("classifier", "drafter", "continuous_target", "continuous_draft", *MAR_RUNS)
DEFAULT_SAMPLING = {"temperature": 1.0, "top_k": None, "top_p": None, "cfg_scale": 3.0}


def _copy_fp16(src: Path, dst: Path) -> int:
    """Copy a ``final/`` directory, casting float tensors to fp16; returns bytes written."""
    from safetensors.torch import save_file

    config, tensors = read_pretrained(src)
    dst.mkdir(parents=True, exist_ok=True)
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    tmp = dst / f".{WEIGHTS_NAME}.tmp"
    save_file(half, str(tmp))
    tmp.replace(dst / WEIGHTS_NAME)
    write_text(dst / CONFIG_NAME, json.dumps(config, indent=2))
    return (dst / WEIGHTS_NAME).stat().st_size


def _copy_mar(src: Path, dst: Path) -> int:
    """Copy a MAR run's ``checkpoint-last.pth`` keeping ``model_ema`` (fp16) and ``args``; returns bytes."""
    import argparse

    from ..models.mar import CHECKPOINT_NAME

    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(str(src / CHECKPOINT_NAME), map_location="cpu", weights_only=True)
    ema = {k: (v.half() if v.is_floating_point() else v) for k, v in ckpt["model_ema"].items()}
    dst.mkdir(parents=True, exist_ok=True)
    tmp = dst / f".{CHECKPOINT_NAME}.tmp"
    torch.save({"model_ema": ema, "epoch": ckpt.get("epoch", 0), "args": ckpt["args"]}, str(tmp))
    tmp.replace(dst / CHECKPOINT_NAME)
    return (dst / CHECKPOINT_NAME).stat().st_size


def _source(runs: Path, name: str, sources: dict[str, Path] | None = None) -> Path:
    """Where part ``name`` comes from: ``<run>/final`` of ``sources[name]`` (default ``runs/<name>``),
    or a MAR run directory."""
    if name in MAR_RUNS:
        return (sources or {}).get(name) or runs / MAR_RUNS[name]
    return ((sources or {}).get(name) or runs / name) / "final"


def _report_path(runs: Path, name: str, sources: dict[str, Path] | None = None) -> Path:
    src = _source(runs, name, sources)
    return (src if name in MAR_RUNS else src.parent) / "report.json"


def _copy_part(runs: Path, name: str, dst: Path, sources: dict[str, Path] | None = None) -> int:
    src = _source(runs, name, sources)
    return _copy_mar(src, dst) if name in MAR_RUNS else _copy_fp16(src, dst)


def build_bundle(runs: Path, data: Path, out: Path, sampling: dict | None = None) -> dict:
    missing = [name for name in REQUIRED if not (runs / name / "final").is_dir()]
    if missing:
        raise ValueError(f"cannot build the bundle: runs/{missing[0]}/final is missing (train it first)")
    classes = json.loads((data / "classes.json").read_text())["classes"]
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    parts, sizes = {}, {}
    for name in REQUIRED + OPTIONAL:
        if _source(runs, name).is_dir():
            sizes[name] = _copy_part(runs, name, staging / name)
            report = _report_path(runs, name)
            parts[name] = json.loads(report.read_text()) if report.exists() else {}
    meta = {
        "name": "emoji",
        "class_names": [c["name"] for c in classes],
        "classes": classes,
        "default_sampling": sampling or DEFAULT_SAMPLING,
        "components": sorted(parts),
        "bytes": sizes,
        "training": parts,
        "torch": torch.__version__,
    }
    write_text(staging / "bundle.json", json.dumps(meta, indent=1))
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return meta


def add_parts(runs: Path, out: Path, names: list[str], sampling: dict | None = None,
              sources: dict[str, Path] | None = None) -> dict:
    """Copy parts ``names`` from ``runs/<name>/final`` (or ``sources[name]/final``) into the bundle at
    ``out``; a part already there is replaced and its earlier training record kept under ``replaced``
    (e.g. the draft and drafter distilled by ``specvis.train.distill`` replacing the first ones)."""
    meta_path = out / "bundle.json"
    if not meta_path.exists():
        raise ValueError(f"no bundle at {out} (bundle.json missing): build it first")
    bad = [n for n in names if n not in REQUIRED + OPTIONAL]
    if bad:
        raise ValueError(f"--add takes bundle parts ({', '.join(REQUIRED + OPTIONAL)}), got {bad[0]}")
    missing = [n for n in names if not _source(runs, n, sources).is_dir()]
    if missing:
        raise ValueError(f"cannot add {missing[0]}: {_source(runs, missing[0], sources)} is missing (train it first)")
    meta = json.loads(meta_path.read_text())
    for name in names:
        staging = out / f".{name}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        meta["bytes"][name] = _copy_part(runs, name, staging, sources)
        shutil.rmtree(out / name, ignore_errors=True)
        staging.rename(out / name)
        report = _report_path(runs, name, sources)
        record = json.loads(report.read_text()) if report.exists() else {}
        if (sources or {}).get(name) is not None and meta["training"].get(name):
            record["replaced"] = meta["training"][name]
        meta["training"][name] = record
    meta["components"] = sorted(set(meta["components"]) | set(names))
    if sampling is not None:
        meta["continuous_sampling"] = sampling
    write_text(meta_path, json.dumps(meta, indent=1))
    return meta


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="runs")
    p.add_argument("--data", default="data/emoji")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "assets" / "emoji"))
    p.add_argument("--add", nargs="+", metavar="PART", help=f"add or replace parts of an existing bundle: {', '.join(REQUIRED + OPTIONAL)}")
    p.add_argument("--source", action="append", default=[], metavar="PART=RUN",
                   help="with --add: take PART from RUN/final (e.g. draft=runs/distill_draft) instead of runs/PART")
    p.add_argument("--continuous-sampling", type=json.loads, help='with --add: JSON default sampling of the continuous models, e.g. \'{"cfg_scale": 3.0}\'')
    a = p.parse_args(argv)
    try:
        if a.add:
            sources = {}
            for item in a.source:
                part, sep, run = item.partition("=")
                if not sep or not run:
                    raise ValueError(f"--source {item!r}: give PART=RUN_DIR")
                sources[part] = Path(run)
            meta = add_parts(Path(a.runs), Path(a.out), a.add, a.continuous_sampling, sources)
        else:
            meta = build_bundle(Path(a.runs), Path(a.data), Path(a.out))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    total = sum(meta["bytes"].values())
    print(f"bundle {a.out}: {', '.join(meta['components'])}; {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
