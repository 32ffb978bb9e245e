"""The loop contract shared by every method: a guided model view, the committed-token buffer, Stats.

A method is a frozen dataclass with ``name``, ``lossless`` and
``decode(ctx: DecodeContext) -> None``; it drafts, verifies with its acceptance rule and calls
``ctx.commit``. ``specvis.generate`` builds the context, times the loop and assembles ``Stats``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..models.base import CachedTokenModel
from ..sampling import Sampling
from .rounds import run_rounds


@dataclass
class Stats:
    """Per-call statistics (API.md). Forward counts are batched calls; the condition pass that
    yields the first image token counts as a target forward, so AR has step_compression 1.0."""

    tokens: int
    target_forwards: int
    draft_forwards: int
    step_compression: float
    mean_accepted_length: float
    wall_s: float
    accept_map: torch.Tensor = field(repr=False)
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("accept_map", "extra")}
        d.update(self.extra)
        return d


class GuidedModel:
    """A ``CachedTokenModel`` bound to B samples and a ``Sampling``: runs both CFG halves as one
    batch of 2B rows and returns the sampling law of API.md for the B samples.

    ``keep_soft``: under greedy sampling every ``prefill``/``forward`` also stores in ``soft`` the
    temperature-1 law of the same positions (``Sampling.soft_probs``), for rules that relax greedy
    decoding on it (LANTERN). Otherwise ``soft`` stays None and nothing extra is computed."""

    def __init__(self, model: CachedTokenModel, conditions: torch.Tensor, sampling: Sampling, extra: int,
                 keep_soft: bool = False) -> None:
        self.model, self.sampling = model, sampling
        self.keep_soft = keep_soft
        self.soft: torch.Tensor | None = None  # temperature-1 law of the last call (greedy + keep_soft only)
        self.batch = conditions.shape[0]
        self.cfg = sampling.uses_cfg
        null = torch.full_like(conditions, model.null_condition)
        self.conditions = torch.cat([conditions, null]) if self.cfg else conditions
        model.setup_cache(self.conditions.shape[0], extra)
        self.forwards = 0
        self.hidden: torch.Tensor | None = None  # last hidden states of all rows (rows, n, D)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t]) if self.cfg else t

    def _law(self, logits: torch.Tensor) -> torch.Tensor:
        cond, uncond = logits.chunk(2) if self.cfg else (logits, None)
        if self.keep_soft and self.sampling.greedy:
            self.soft = self.sampling.soft_probs(cond, uncond)
        return self.sampling.probs(cond, uncond)

    def prefill(self) -> torch.Tensor:
        """Law (B, V) of image token 0."""
        logits, self.hidden = self.model.prefill(self.conditions)
        self.forwards += 1
        return self._law(logits)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Laws (B, n, V) after each of the n fed tokens (see ``CachedTokenModel.forward_tokens``)."""
        mask = None if tree_mask is None else self._rows(tree_mask)
        logits, self.hidden = self.model.forward_tokens(self._rows(tokens), self._rows(positions), mask)
        self.forwards += 1
        return self._law(logits)

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.model.set_committed(self._rows(n_fed))

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        self.model.keep_block(self._rows(index), self._rows(count))


class Counter:
    """A forward count that a method advances from inside a round (``DecodeContext.counted``)."""

    forwards: int = 0


class DecodeContext:
    """Everything a method's loop needs: the target (and draft) views, the generator and the
    committed-token buffer with per-row lengths (rows never wait for each other)."""

    def __init__(self, target: GuidedModel, generator: torch.Generator, pad: int,
                 draft: GuidedModel | None = None, drafter: Any = None, codebook: torch.Tensor | None = None,
                 graphs: bool = False) -> None:
        self.target, self.draft, self.drafter, self.codebook = target, draft, drafter, codebook
        self.generator = generator
        self.graphs = graphs  # on CUDA: replay each round as a captured CUDA graph (methods/rounds.py)
        self.counted: list = [v for v in (target, draft) if v is not None]  # objects whose .forwards rounds advance
        self.rule: Any = None  # the method's acceptance rule, bound to the codebook if it needs one
        layout = target.model.layout
        self.layout, self.L = layout, layout.num_tokens
        B, dev = target.batch, target.conditions.device
        self.tokens = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        self.accept_map = torch.zeros(B, self.L + pad, dtype=torch.long, device=dev)
        self.n = torch.zeros(B, dtype=torch.long, device=dev)  # committed tokens per row
        self.active_forwards = torch.zeros(B, dtype=torch.long, device=dev)
        self.extra: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return self.n.device

    def run(self, round_fn, rounds: int | None = None) -> None:
        """Call ``round_fn`` (one round, state updated in place) until every row is done, or exactly
        ``rounds`` times; captured and replayed as a CUDA graph when ``graphs`` is on and the device is
        CUDA (``methods/rounds.py``)."""
        run_rounds(self, round_fn, self.graphs, rounds)

    def done(self) -> bool:
        """True when every row has its whole grid (one host sync per decoding step)."""
        return bool((self.n >= self.L).all())

    def commit(self, block: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Append ``block[r, :count[r]]`` to row r, all by one target forward. Finished rows ignore it.
        Returns the per-row count actually committed."""
        active = self.n < self.L
        count = torch.where(active, torch.minimum(count, self.L - self.n), torch.zeros_like(count))
        m = block.shape[1]
        j = torch.arange(m, device=self.device)
        idx = (self.n[:, None] + j).clamp_max(self.tokens.shape[1] - 1)
        write = j[None, :] < count[:, None]
        self.tokens.scatter_(1, idx, torch.where(write, block, self.tokens.gather(1, idx)))
        self.accept_map.scatter_(1, idx, torch.where(write, count[:, None].expand(-1, m), self.accept_map.gather(1, idx)))
        self.active_forwards += active.long()
        self.n += count
        return count

    def positions(self, start: torch.Tensor, n: int) -> torch.Tensor:
        """Grid indices (B, n) start, start+1, ... for a chain of n tokens."""
        return start[:, None] + torch.arange(n, device=self.device)

    def stats(self, wall_s: float, draft_forwards: int) -> Stats:
        B = self.n.shape[0]
        H, W = self.layout.height, self.layout.width
        fwd = self.target.forwards
        return Stats(
            tokens=self.L,
            target_forwards=fwd,
            draft_forwards=draft_forwards,
            step_compression=self.L / max(fwd, 1),
            mean_accepted_length=float((self.L / self.active_forwards.clamp_min(1).float()).mean()),
            wall_s=wall_s,
            accept_map=self.accept_map[:, : self.L].reshape(B, H, W).cpu(),
            extra=dict(self.extra),
        )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0
