"""Ctrl+C while specvis is still importing (torch and the rest take seconds): one line, not a
KeyboardInterrupt traceback. ``during_import()`` sets ``sys.excepthook`` so that a KeyboardInterrupt
that ends the process prints ``specvis: interrupted``; the caller restores the previous hook once its
imports are done, so nothing of it outlives a completed import (the command line then handles Ctrl+C
itself). Any other exception goes to the previous hook."""

from __future__ import annotations

import sys
from typing import Callable


def during_import() -> Callable[[], None]:
    """Install the hook; returns the function that puts the previous one back."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print("specvis: interrupted", file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook

    def restore() -> None:
        if sys.excepthook is hook:
            sys.excepthook = previous

    return restore
