"""An independent, deliberately plain implementation of docs/design/api.md's sampling law, for the tests.

It shares no code with ``specvis.sampling``: numpy, float64, one step per line of docs/design/api.md, so that a
wrong CFG formula, a top-k that drops the k-th token or a top-p that keeps one token too few in the
library disagrees with it (the exactness harness and the per-forward oracle compare against it).

Per position, on raw logits c (conditional) and u (unconditional):
1. guided = u + s (c - u)  (s = cfg_scale; skipped when s == 1);
2. temperature 0: point mass at argmax(guided) (lowest index on ties); else guided / T;
3. top-k: keep the tokens whose logit is >= the k-th largest (ties with the k-th are kept);
4. top-p: sort descending, keep a token while the mass strictly before it is < top_p (at least one);
5. softmax over the kept tokens.
"""

from __future__ import annotations

import numpy as np
import torch


def reference_law(cond: torch.Tensor, uncond: torch.Tensor | None, temperature: float,
                  top_k: int | None, top_p: float | None, cfg_scale: float) -> torch.Tensor:
    """Logits (..., V) -> the law (..., V) as a float64 tensor."""
    c = cond.detach().double().cpu().numpy()
    if cfg_scale != 1.0:
        u = uncond.detach().double().cpu().numpy()
        z = u + cfg_scale * (c - u)
    else:
        z = c
    return torch.from_numpy(_laws(z.reshape(-1, z.shape[-1]), temperature, top_k, top_p).reshape(z.shape))


def _laws(z: np.ndarray, temperature: float, top_k: int | None, top_p: float | None) -> np.ndarray:
    """Rows of guided logits (N, V) -> rows of laws (N, V)."""
    N, V = z.shape
    rows = np.arange(N)[:, None]
    if temperature == 0:
        law = np.zeros((N, V))
        law[np.arange(N), np.argmax(z, axis=1)] = 1.0
        return law
    z = z / temperature
    keep = np.ones((N, V), dtype=bool)
    if top_k is not None and top_k < V:
        kth = -np.sort(-z, axis=1)[:, top_k - 1:top_k]
        keep &= z >= kth
    if top_p is not None and top_p < 1.0:
        mass = _softmax(z, keep)
        order = np.argsort(-z, axis=1, kind="stable")
        m_sorted = mass[rows, order]
        before = np.cumsum(m_sorted, axis=1) - m_sorted
        nucleus_sorted = before < top_p
        nucleus_sorted[:, 0] = True
        nucleus = np.zeros((N, V), dtype=bool)
        nucleus[rows, order] = nucleus_sorted
        keep &= nucleus
    return _softmax(z, keep)


def _softmax(z: np.ndarray, keep: np.ndarray) -> np.ndarray:
    top = np.where(keep, z, -np.inf).max(axis=1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, z - top, 0.0)), 0.0)
    return e / e.sum(axis=1, keepdims=True)


def sampling_law(model, conditions, tokens: torch.Tensor, sampling, uncond=None) -> torch.Tensor:
    """(B, t+1, V) reference laws of ``model`` teacher-forced on ``tokens`` (B, t) under ``sampling``;
    ``uncond``: the unconditional rows (default: the model's null class)."""
    c = model.logits(conditions, tokens)
    u = None
    if sampling.cfg_scale != 1.0:
        u = model.logits(torch.full_like(conditions, model.null_condition) if uncond is None else uncond, tokens)
    return reference_law(c, u, sampling.temperature, sampling.top_k, sampling.top_p, sampling.cfg_scale)
