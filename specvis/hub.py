"""Model arguments that name a Hugging Face Hub repository (``owner/name``) instead of a local directory.

The snapshot is looked up in huggingface_hub's cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``) and, unless
``HF_HUB_OFFLINE`` is set, downloaded. Environment variables are read at call time, not at import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"{_PART}/{_PART}")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a Hub repository id: ``owner/name`` with ``[A-Za-z0-9_.-]``."""
    return (bool(_HUB_ID.fullmatch(name)) and "--" not in name and ".." not in name
            and not name.endswith(".git"))


def hub_cache_dir() -> Path:
    """The hub cache directory huggingface_hub would use, from the current environment."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _offline() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def resolve_model_dir(name: str) -> Path:
    """Map a model argument to a checkpoint directory.

    An existing local directory is returned as is (it wins over a Hub id of the same name). Otherwise
    ``name`` must be a Hub id: its cached snapshot is returned, or, unless ``HF_HUB_OFFLINE`` is set,
    the snapshot is downloaded first. Any failure raises ValueError with a one-line message.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if not is_hub_id(name):
        raise ValueError(f"{name}: not a local directory, and not a Hugging Face Hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{name}: not a local directory; to load it from the Hugging Face Hub, "
                         "pip install specvis[hf]") from None
    cache = hub_cache_dir()
    missing = f"{name}: neither a local directory nor in the Hugging Face cache ({cache})"
    try:
        return Path(snapshot_download(name, cache_dir=cache, local_files_only=True))
    except Exception as err:
        if _offline():
            why = "" if type(err).__name__ == "LocalEntryNotFoundError" else f": {type(err).__name__}"
            raise ValueError(f"{missing}{why}; HF_HUB_OFFLINE is set, so it was not downloaded") from err
    try:
        return Path(snapshot_download(name, cache_dir=cache))
    except Exception as err:
        raise ValueError(f"{missing}, and downloading it failed: {type(err).__name__}") from err
