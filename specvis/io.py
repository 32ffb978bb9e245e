"""Atomic file output: nothing is ever left half-written."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable


def atomic_write(target: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` on a sibling temporary name, then rename it onto ``target``."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write(target, lambda tmp: Path(tmp).write_text(text))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporaries that ``atomic_write`` left in ``directory`` when its process was killed
    (``.NAME.PID.HEX.tmp`` whose PID is no longer running); those of live processes stay. Returns
    what could not be removed (the caller says so)."""
    left = []
    for p in Path(directory).glob(".*.tmp"):
        parts = p.name.split(".")
        if len(parts) < 5 or not parts[-3].isdigit() or _alive(int(parts[-3])):
            continue
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(p)
    return left
