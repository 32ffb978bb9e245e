"""Progress of long work on stderr: a tqdm bar of images done, tokens per second and the time left
(tqdm's ETA from the rate so far). Shown on a terminal, or anywhere when asked (``--progress``,
``progress=True``); ``--quiet`` shows none. Nothing of it reaches stdout."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def wanted(progress: bool = False, quiet: bool = False) -> bool:
    """Whether a command shows its bar: never with ``quiet``, always with ``progress``, else when stderr
    is a terminal."""
    if quiet:
        return False
    return bool(progress) or sys.stderr.isatty()


class ImageBar:
    """A bar over ``images`` images of ``tokens_per_image`` tokens each: images done (fractions while a
    batch is under way), tokens per second since the bar started, ETA. ``enabled=False``: a bar that
    counts and shows nothing."""

    def __init__(self, images: int, tokens_per_image: int, desc: str = "images", enabled: bool = True) -> None:
        self.images, self.tokens_per_image = images, tokens_per_image
        self.done = 0.0  # images, fractional within a call
        self.tokens = 0.0  # tokens decoded
        self.start = time.monotonic()
        self.bar = tqdm(total=images, desc=desc, unit="img", file=sys.stderr, disable=not enabled, leave=False,
                        dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} img [{elapsed}<{remaining}{postfix}]")

    def update(self, images: float, tokens: float | None = None) -> None:
        """``images`` more images done, of ``tokens`` decoded tokens (default: theirs; 0 for images found
        already written)."""
        self.done += images
        self.tokens += images * self.tokens_per_image if tokens is None else tokens
        self.bar.update(images)
        seconds = time.monotonic() - self.start
        if seconds > 0:
            self.bar.set_postfix_str(f"{self.tokens / seconds:.1f} tok/s", refresh=False)

    def fraction(self, done: float) -> None:
        """The fraction of every image's tokens done (``generate(progress=)``'s callback)."""
        self.update(max(0.0, done * self.images - self.done))

    def set_description(self, text: str) -> None:
        self.bar.set_description(text)

    def close(self) -> None:
        self.bar.close()
