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
