"""Acceptance rules: pure, batched functions on probability tensors.

A rule maps (p, q, x) -> (alpha, residual): p the target law, q the law each draft token x was drawn
from (..., V), alpha the acceptance probability of x and residual the unnormalised law to resample
from on rejection. Under greedy sampling p is a point mass; rules may then take ``soft=`` the
temperature-1 law of the same positions (``laws.DiscreteLaw.soft``; LANTERN relaxes on it, Exact ignores it). ``verify_chain`` walks a drafted chain with any rule, per row, with no Python
loop over positions: every drafting method (draft model, SJD, trees) plugs rules in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import rows_at, sample, uniform


@dataclass(frozen=True)
class Exact:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept x with min(1, p(x)/q(x)),
    on rejection resample from normalise(max(0, p - q)). The output law is exactly p."""

    lossless = True
    name = "exact"

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                 soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        px = p.gather(-1, x[..., None]).squeeze(-1)
        qx = q.gather(-1, x[..., None]).squeeze(-1)
        alpha = torch.where(qx > 0, px / qx.clamp_min(1e-30), torch.ones_like(px)).clamp(max=1.0)
        return alpha, (p - q).clamp_min(0.0)

    def sibling(self, p: torch.Tensor, x: torch.Tensor,
                soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic candidate x against the normalised law p (EAGLE multi-candidate rule, i.e.
        q = point mass at x): accept with p(x); on rejection the residual is p with x zeroed.
        ``soft`` is ignored."""
        alpha = p.gather(-1, x[..., None]).squeeze(-1)
        return alpha, p.scatter(-1, x[..., None], 0.0)

    def sibling_q(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                  soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Multi-draft recursive rejection (SpecInfer; sampling without replacement): sibling x was
        drawn from q, the normalised law p is the current target residual. Accept with
        min(1, p(x)/q(x)); on rejection the next sibling is tried against normalise(max(0, p - q))
        (returned unnormalised, like ``sibling``) and was drawn from q with x removed and
        renormalised (``without``), the third value. ``soft`` goes to the chain rule (Exact ignores
        it). Proof of exactness: ``specvis.methods.static_tree``. Relaxed rules reuse this walk with
        their own chain rule (``BoundLantern.sibling_q``)."""
        alpha, residual = self(p, q, x, soft=soft)
        return alpha, residual, without(q, x)

    def config(self) -> dict:
        return {}


def normalise(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual / sum(residual); where the residual has no mass (p == q up to rounding) use ``fallback``."""
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), fallback)


def without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The law of the next draw without replacement: q (..., V) with token x (...) removed and
    renormalised; where x carried all of q's mass (nothing left to draw) q itself."""
    return normalise(q.scatter(-1, x[..., None], 0.0), q)


def verify_chain(rule, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
                 generator: torch.Generator | None, soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``draft`` (B, g) drawn from ``q`` (B, g, V) against target laws ``p`` (B, g+1, V).

    Accepts left to right while u_j < alpha_j; returns the accepted count a (B,) and the next token
    (B,): drawn from the normalised residual at position a, or from p[:, g] (the bonus token) when
    every draft token was accepted. ``soft`` (B, g+1, V): the temperature-1 laws of the same positions
    under greedy sampling (or None); the rule gets ``soft[:, :g]``.
    """
    g = draft.shape[1]
    if soft is None:
        alpha, residual = rule(p[:, :g], q, draft)
    else:
        alpha, residual = rule(p[:, :g], q, draft, soft=soft[:, :g])
    u = uniform(alpha.shape, alpha, generator)  # float64: no acceptance floor (sampling.uniform)
    accepted = (u < alpha).long().cumprod(dim=-1).sum(dim=-1)
    at = accepted.clamp_max(g - 1)[:, None]  # the rejected position's residual, normalised alone
    rejected = normalise(rows_at(residual, at), rows_at(p, at))[:, 0]
    law = torch.where((accepted < g)[:, None], rejected, p[:, g])
    return accepted, sample(law, generator)
