"""Files in and out: output is atomic (nothing is ever left half-written), an output path is checked
before the work starts, and a file read is a regular file of bounded size (a FIFO would block the
read for ever, ``/dev/zero`` would fill memory)."""

from __future__ import annotations

import os
import stat
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


TEXT_LIMIT = 64 << 20  # bytes of a config, index, prompt list or report: far above any real one


def regular_file(path: str | os.PathLike, what: str) -> None:
    """A one-line ValueError naming ``what`` unless ``path`` (symbolic links followed) is a regular
    file: reading a FIFO blocks until a writer comes, a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # the reader says what is missing, in its own words
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read ({e.strerror or type(e).__name__})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} {path}: not a regular file (a directory, FIFO, socket or device)")


def check_directory_files(directory: str | os.PathLike, what: str) -> None:
    """Every entry of a model directory is a regular file or a directory (symbolic links followed): a
    FIFO or device among them (config.json, a tokenizer file) would block or flood whichever reader
    opens it. One-line ValueError naming ``what`` and the entry."""
    for entry in sorted(Path(directory).iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: the reader that needs it says so
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ValueError(f"{what} {directory}: {entry.name} is not a regular file (a FIFO, socket or device)")


def read_regular(path: str | os.PathLike, what: str, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes, else a one-line
    ValueError naming ``what``. Opened without blocking (a FIFO with no writer) and checked on the
    open descriptor, so a path swapped after the check is still refused."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ValueError(f"{what} {path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read ({e.strerror or type(e).__name__})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path}: not a regular file (a directory, FIFO, socket or device)")
        if st.st_size > limit:
            raise ValueError(f"{what} {path}: {st.st_size} bytes, more than the {limit >> 20} MiB a file read here may have")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {path}: grew past {limit >> 20} MiB while read")
    return data


def read_text(path: str | os.PathLike, what: str, limit: int = TEXT_LIMIT) -> str:
    """``read_regular`` decoded as UTF-8 (one line naming ``what`` when it is not)."""
    try:
        return read_regular(path, what, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path}: not UTF-8 text") from None


def _writable_parent(path: Path, what: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists():  # the first existing ancestor is where the directories get made
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: cannot write in {parent} (permission denied)")


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """An output file, checked before the work starts: a non-empty path that is absent or a regular
    file, in a directory that exists (or can be made) and is writable. One-line ValueError naming ``what``."""
    if not str(path).strip():
        raise ValueError(f"{what} is empty: give a file path")
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {p}: exists and is not a regular file")
    if p.is_file() and not os.access(p, os.W_OK):
        raise ValueError(f"{what} {p}: not writable (permission denied)")
    _writable_parent(p, what)
    return p


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """An output directory, checked before the work starts: a non-empty path that is absent or a
    directory, writable (or makeable). One-line ValueError naming ``what``."""
    if not str(path).strip():
        raise ValueError(f"{what} is empty: give a directory")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {p}: exists and is not a directory")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{what} {p}: cannot write in it (permission denied)")
    else:
        _writable_parent(p, what)
    return p
