"""The keyed noise of a decode's rows (``Sampling(noise="keyed")``, ``specvis.noise``).

Row r holds image k of the call, whose seed is s + k; every draw of the row at stream position m races
against E(s + k, m, .): ``draw`` (AR's tokens, first tokens, drafts), ``noise`` (drafters that race
themselves: SJD's Gumbel coupling, Gumbel-top-k trees) and ``choices`` (the point masses ``accept.Coupled``
verifies against). A row restarted by continuous batching takes its new image's seed (``start``).
"""

from __future__ import annotations

import torch

from ..noise import exponentials, race, seed_tensor


class KeyedNoise:
    """The image seeds of a call (``image_seeds``, image k: seed + k) and the seed each row holds (B,)."""

    def __init__(self, image_seeds: list[int], rows: int, width: int, device: torch.device) -> None:
        self.image_seeds = list(image_seeds)
        self.table = seed_tensor(image_seeds, device)  # (Q,) every image's seed, int64
        self.seeds = self.table[:rows].clone()  # (B,) the seed of each row's image
        self.width = width  # codes and structural ids of a law

    def noise(self, positions: torch.Tensor) -> torch.Tensor:
        """E (B, n, V) of each row's image at stream ``positions`` (B, n)."""
        return exponentials(self.seeds, positions, self.width)

    def draw(self, probs: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """argmax_v probs(v) / E(s, m, v) for laws (R, V) at positions (R,), or (R, n, V) at (R, n); ``rows``:
        the rows the laws belong to (default all)."""
        seeds = self.seeds if rows is None else self.seeds[rows]
        at = positions[:, None] if positions.ndim == 1 else positions
        p = probs.reshape(*at.shape, probs.shape[-1])
        return race(p, exponentials(seeds, at, p.shape[-1])).reshape(positions.shape)

    def choices(self, probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The point masses (B, n, V) at each position's keyed choice of the laws ``probs``."""
        return torch.zeros_like(probs).scatter_(-1, self.draw(probs, positions)[..., None], 1.0)

    def start(self, rows: torch.Tensor, samples: torch.Tensor) -> None:
        """Rows ``rows`` now hold the call's images ``samples``."""
        self.seeds[rows] = self.table[samples]
