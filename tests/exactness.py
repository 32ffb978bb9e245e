"""The exactness harness: enumerate the exact law of API.md on tiny models and test a method's
empirical law against it with a chi-square test. Later methods plug in through ``check_method``.

The joint law of a whole grid is the product over positions of the sampling law
(CFG -> temperature -> top-k -> top-p -> softmax) of the teacher-forced target logits, so it is
computed for all V**L grids by one batched ``logits`` call per condition.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import stats as sps

import specvis as sv

N_SAMPLES = 20_000  # per configuration, split evenly over its conditions
BATCH = 10_000


def tiny_llamagen(seed: int, vocab: int = 4, grid: int = 2, dim: int = 32, n_layer: int = 2,
                  num_classes: int = 3, sharpness: float = 40.0) -> sv.models.LlamaGen:
    """A random LlamaGen whose next-token laws are far from uniform (output weights scaled up)."""
    torch.manual_seed(seed)
    cfg = sv.models.LlamaGenConfig(vocab_size=vocab, dim=dim, n_layer=n_layer, n_head=2,
                                   num_classes=num_classes, block_size=grid * grid, multiple_of=16)
    model = sv.models.LlamaGen(cfg).eval()
    with torch.no_grad():
        model.output.weight.mul_(sharpness)
        model.tok_embeddings.weight.mul_(20)
        model.cls_embedding.embedding_table.weight.mul_(20)
    return model


def all_grids(vocab: int, length: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


@torch.no_grad()
def exact_law(model, conditions: list[int], sampling: sv.Sampling) -> torch.Tensor:
    """(len(conditions), V**L) exact probability of every grid under ``sampling``."""
    V, L = model.layout.vocab_size, model.layout.num_tokens
    grids = all_grids(V, L)
    laws = []
    for c in conditions:
        cond = torch.full((grids.shape[0],), c)
        logits = model.logits(cond, grids[:, :-1])
        uncond = model.logits(torch.full_like(cond, model.null_condition), grids[:, :-1]) if sampling.uses_cfg else None
        p = sampling.probs(logits, uncond)  # (G, L, V)
        laws.append(p.gather(-1, grids[..., None]).squeeze(-1).double().prod(-1))
    law = torch.stack(laws)
    assert torch.allclose(law.sum(-1), torch.ones(len(conditions), dtype=torch.float64), atol=1e-5)
    return law


def grid_index(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    weights = vocab ** torch.arange(tokens.shape[1] - 1, -1, -1)
    return (tokens * weights).sum(-1)


def sample_counts(model, conditions: list[int], method, sampling: sv.Sampling, n: int = N_SAMPLES,
                  batch: int = BATCH, **kw) -> np.ndarray:
    """Counts (len(conditions), V**L) of the grids that ``method`` produced in n samples in all,
    generated in batches that mix all conditions (so per-row independence is exercised)."""
    V, L = model.layout.vocab_size, model.layout.num_tokens
    counts = np.zeros((len(conditions), V ** L))
    per_cond = torch.tensor(conditions)
    total = n
    for seed, start in enumerate(range(0, total, batch)):
        rows = min(batch, total - start)
        idx = (torch.arange(start, start + rows) % len(conditions))
        out = sv.generate(model, per_cond[idx], method, sampling, seed=1000 + seed, **kw)
        g = grid_index(out.tokens, V)
        np.add.at(counts, (idx.numpy(), g.numpy()), 1)
    return counts


def chi_square_pvalue(counts: np.ndarray, law: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square of counts against the law; bins with expected < min_expected are pooled."""
    expected = law.numpy() * counts.sum(-1, keepdims=True)
    obs, exp = counts.ravel(), expected.ravel()
    big = exp >= min_expected
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] < min_expected:  # pooled bin too small: fold it into the last big bin
        o[-2] += o[-1]
        e[-2] += e[-1]
        o, e = o[:-1], e[:-1]
    # impossible outcomes (exact law 0) observed at all are a failure on their own
    if obs[exp == 0].sum() > 0:
        return 0.0
    return float(sps.chisquare(o, e * o.sum() / e.sum()).pvalue)


def check_method(model, method, sampling: sv.Sampling, conditions=(0, 1, 2), **kw) -> float:
    """p-value of the chi-square test of ``method``'s output law against the exact law."""
    law = exact_law(model, list(conditions), sampling)
    return chi_square_pvalue(sample_counts(model, list(conditions), method, sampling, **kw), law)
