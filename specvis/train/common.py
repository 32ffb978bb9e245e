"""What every training script shares: CSV logs that survive resumes, machine facts, the entry point."""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from specvis.io import atomic_write, write_text


def append_row(path: Path, fields: list[str], row: dict) -> None:
    """Append ``row`` to a CSV log, writing the header when the file is new."""
    header = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if header:
            w.writeheader()
        w.writerow(row)


def drop_rows_after(path: Path, step: int) -> None:
    """On resume, forget log rows written after the checkpoint's step."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], [r for r in reader if int(r["step"]) <= step]

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


def machine_info(threads: int) -> dict[str, Any]:
    """Where a run happened, for the training records."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
            "python": platform.python_version()}


def save_final(model: torch.nn.Module, out: Path, report: dict, summary: str) -> None:
    """``OUT/final/`` (``save_pretrained``), ``OUT/report.json``, and one summary line on stdout."""
    model.save_pretrained(out / "final")
    write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    print(f"{summary}; wrote {out / 'final'} and {out / 'report.json'}", flush=True)


def run_main(train: Callable[[Any], object], args: Any) -> int:
    """Run ``train(args)``; a ValueError (bad input) or OSError (a path that cannot be written) becomes
    one line on stderr and exit status 2."""
    try:
        train(args)
    except (ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0
