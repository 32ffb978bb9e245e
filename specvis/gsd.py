"""GSD: Grouped Speculative Decoding (So, Shin, Kook, Park; ICCV 2025, arXiv 2508.07747) as an acceptance rule.

Notation of ``specvis.accept``: p the target law at a verified position, q the law the draft token x was
drawn from (SJD: the previous iteration's law there, or a point mass for a fresh random init; a draft
model: its law). Relaxed (lossy); chains only (Speculative, SJD): there is no sibling rule, so a tree
method rejects it with one ValueError.

Cluster (dynamic, from the target's own ranking). Sort the vocabulary by p ascending (ties by id; one
stable sort per verified block); with x at rank r, the window is the ranks r - below .. r + above
(clipped to the vocabulary): ``group=G`` gives below = above = G // 2 (the paper's "G/2 above and below");
``ranks=(7, 6)`` is the official code's fixed asymmetric window (7 lower-probability, 6 higher-probability
tokens; junhyukso/GSD) and overrides ``group``. C(x) = {x} + {y in window : |p(y) - p(x)| < delta_p and
dist(x, y) < max_dist}. Accept x with min(1, P(C)/Q(C)) (P, Q the masses of C under p, q; 1 where
Q(C) = 0); x itself is committed (no resampling inside the cluster).

Distance. Squared Euclidean distance between rows of an embedding table, as the official code (which
uses the LM's input-embedding table on a raw scale, threshold 0.5 for Lumina-mGPT): ``embedding="input"``
the target's input token embeddings (``input_embeddings(model)``; ``specvis.generate`` passes them to
``bind``), ``"codebook"`` the tokenizer's VQ codebook. So that one threshold means the same on every
model, distances are divided by the median squared distance between distinct rows of the table (over
at most 1024 evenly spaced rows): ``max_dist=0.5`` keeps neighbours closer than half the typical pair.
This normalisation departs from the official code, which thresholds raw squared distances at 0.5
(junhyukso/GSD scheduler/jacobi_iteration_lumina_mgpt.py: the table ``embed_tokens.weight[:10000]``,
lines 1197-1199; ``d_thr = 0.5``, lines 316-320): on Lumina-mGPT's own table the official threshold is
``max_dist`` = 0.5 / (that table's median squared distance).
``max_dist=None`` (default) switches the filter off: the paper reports the filters barely change the
result (Table 2: 636.2 vs 636.8 NFE), and no table is then needed.

Structural ids (Emu3's and Lumina-mGPT's row ends, ``Layout.row_end``): the laws then run over the codes
and the structural ids after them, while the distance table has rows for the codes only.
``specvis.generate`` binds the rule ``with_structural``: a structural id is alone in its cluster and
joins no code's (it occurs only where the law is a point mass at it, so it is accepted either way).

Residual (``residual=``): "paper" (default, as the official code) normalise(max(0, p - q)) over the full
vocabulary; "min-tv" (Cool-SD, AAAI 2026) normalise(max(0, p - q f)), f(y) = min(1, P(C_y)/Q(C_y)) the
rule's acceptance function at every token y. For a fixed f the accepted part a = q f is fixed, and for any
resampling law r the output O = a + (1 - |a|) r satisfies O >= a, so TV(O, p) = sum max(0, O - p) >=
sum max(0, a - p) =: L; r = normalise(max(0, p - a)) reaches L (where a > p, O - p = a - p; elsewhere
O <= p because the residual's mass 1 - |a| + L is >= 1 - |a|). Hence "min-tv" minimises TV(O, p) for the
given acceptance function, with TV(O, p) = sum_y max(0, q(y) f(y) - p(y)). The two coincide where
f >= min(1, p/q) pointwise (Cool-SD Prop. 1); GSD's f can be lower (a neighbour with q >> p inflates
Q(C)) or higher, so they differ. Cost of "min-tv": the cluster of every token, O(V W) per position
(O(V W d) with the distance filter) instead of O(W).

Bound: none stated by the paper and none follows in general (the clusters overlap, the residual is
token level): the output's TV to p is measured (tests/test_relaxed.py, docs/results/archive/relaxed-tv.md).
What holds: with ``residual="min-tv"`` TV(O, p) = sum_y max(0, q(y) f(y) - p(y)) exactly, per position
and conditional on everything before it; a cluster of x alone (G < 2, delta_p = 0, or max_dist = 0) is
token for token ``Exact()``. Under greedy sampling p is a point mass, so no neighbour passes the
probability filter against the greedy token and GSD is greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .accept import Rule, RuleTables
from .options import option

EMBEDDINGS = ("input", "codebook")
RESIDUALS = ("paper", "min-tv")
MEDIAN_ROWS = 1024


def input_embeddings(model) -> torch.Tensor | None:
    """The model's input token-embedding table (V, d) for its V image tokens, or None if it has none
    (``image_embed`` of the text-to-image decoders, ``tok_embeddings`` as LlamaGen, or a
    ``get_input_embeddings()`` module)."""
    if model is None:
        return None
    layout = getattr(model, "layout", None)
    if hasattr(model, "image_embed") and layout is not None:  # text-to-image decoders: what an image code feeds
        p = next(model.parameters())
        with torch.no_grad():
            return model.image_embed(torch.arange(layout.vocab_size, device=p.device)).detach().float()
    emb = getattr(model, "tok_embeddings", None)
    if emb is None and callable(getattr(model, "get_input_embeddings", None)):
        emb = model.get_input_embeddings()
    w = getattr(emb, "weight", emb)
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        return None
    return w.detach()[: layout.vocab_size] if layout is not None else w.detach()


def normalised_table(table: torch.Tensor) -> torch.Tensor:
    """``table`` (V, d) as float32, scaled so that squared distances are in units of the median squared
    distance between distinct rows (over at most ``MEDIAN_ROWS`` evenly spaced rows, float64)."""
    t = table.detach().to(torch.float64)
    V = t.shape[0]
    rows = t[torch.arange(0, V, max(1, -(-V // MEDIAN_ROWS)), device=t.device)]
    d = torch.cdist(rows, rows).square()
    i, j = torch.triu_indices(rows.shape[0], rows.shape[0], 1, device=t.device)
    med = float(d[i, j].median()) if i.numel() else 0.0
    return (t / (med ** 0.5 if med > 0 else 1.0)).to(torch.float32)


@dataclass(frozen=True)
class GSD(Rule):
    """Grouped speculative decoding's acceptance (module docstring): the cluster of x among the ``group``
    tokens ranked next to it by p (``ranks=(below, above)`` overrides, (7, 6) = the official code), filtered
    by |p(y) - p(x)| < ``delta_p`` and normalised squared distance < ``max_dist`` (None: no distance filter)
    on the ``embedding`` table ("input": the target's input embeddings, "codebook": the tokenizer's);
    accept with min(1, P(C)/Q(C)); ``residual`` "paper" (max(0, p - q)) or "min-tv" (max(0, p - q f))."""

    group: int = option(25, low=0, high=4096, flag="gsd-group", help="tokens ranked next to x by p, G/2 on each side")
    delta_p: float = option(0.15, low=0, high=1, flag="gsd-delta-p", help="probability filter |p(y) - p(x)| < delta_p")
    max_dist: float | None = option(None, low=0, high=1e6, flag="gsd-max-dist",
                                    help="distance filter: squared distance over the table's median (None: off)")
    embedding: str = option("input", choices=EMBEDDINGS, flag="gsd-embedding",
                            help="distance table: input (the target's input embeddings) or codebook (the tokenizer's)")
    ranks: tuple[int, int] | None = option(None, low=0, high=4096, flag="gsd-ranks", aliases={"official": (7, 6)},
                                           help="(below, above) rank window overriding group (official: the official "
                                                "code's (7, 6))")
    residual: str = option("paper", choices=RESIDUALS,
                           help="paper: max(0, p - q), as the official code; min-tv: Cool-SD's max(0, p - q f)")
    name: ClassVar[str] = "gsd"
    lossless: ClassVar[bool] = False
    walks: ClassVar[frozenset[str]] = frozenset({"chain"})  # no sibling rule: chains only (Speculative, SJD)

    @property
    def window(self) -> tuple[int, int]:
        """(below, above): ranks of lower and higher target probability around x."""
        return self.ranks if self.ranks is not None else (self.group // 2, self.group // 2)

    @property
    def needs(self) -> frozenset[str]:
        """The distance filter's table (``embedding``), none without it (``max_dist`` None)."""
        if self.max_dist is None:
            return frozenset()
        return frozenset({"codebook" if self.embedding == "codebook" else "embeddings"})

    def bind(self, tables: RuleTables = RuleTables()) -> BoundGSD:
        """The rule with its distance table: the tokenizer codebook or the target's input embeddings
        per ``embedding`` (neither is needed when ``max_dist`` is None), on laws with
        ``tables.structural`` structural ids after the codes (``BoundGSD.with_structural``)."""
        table = None if self.max_dist is None else tables.codebook if self.embedding == "codebook" else tables.embeddings
        if self.max_dist is not None and table is None:
            what = "the tokenizer codebook (codebook=...)" if self.embedding == "codebook" else \
                "the target's input-embedding table (a model with tok_embeddings or get_input_embeddings())"
            raise ValueError(f"GSD.max_dist with GSD.embedding={self.embedding!r} needs {what}")
        bound = BoundGSD(self, None if table is None else normalised_table(table))
        return bound.with_structural(tables.structural) if tables.structural else bound

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rule without a distance table (``bind()``): raises if the distance filter needs one."""
        return self.bind().chain(p, q, x)

    __call__ = chain

    def config(self) -> dict:
        return {"group": self.group, "delta_p": self.delta_p, "max_dist": self.max_dist, "embedding": self.embedding,
                "ranks": None if self.ranks is None else list(self.ranks), "residual": self.residual}


class BoundGSD:
    """``GSD`` with its normalised distance table (or None): a pure batched rule ``chain(p, q, x) -> (alpha,
    residual)`` (a ``BoundRule`` walking chains only). ``structural``: the last ids of the laws that are
    structural (``with_structural``)."""

    lossless: ClassVar[bool] = False
    name: ClassVar[str] = "gsd"
    needs: ClassVar[frozenset[str]] = frozenset()
    walks: ClassVar[frozenset[str]] = frozenset({"chain"})

    def __init__(self, spec: GSD, table: torch.Tensor | None, structural: int = 0) -> None:
        self.spec, self.table, self.structural = spec, table, structural
        self.below, self.above = spec.window
        self.delta_p, self.max_dist, self.residual = float(spec.delta_p), spec.max_dist, spec.residual

    def config(self) -> dict:
        return self.spec.config()

    def bind(self, tables: RuleTables) -> "BoundGSD":
        """Already bound: itself, on laws with ``tables.structural`` structural ids."""
        return self if tables.structural == self.structural else self.with_structural(tables.structural)

    def with_structural(self, n: int) -> "BoundGSD":
        """The rule on laws over the codes then ``n`` structural ids (``Layout.row_end``, as
        ``BoundLantern.with_structural``): a structural id is alone in its cluster and joins no code's.
        It occurs only where the law is a point mass at it (a forced position, drafted as that id), so
        its acceptance is 1 either way; the distance table has rows for the codes only."""
        return BoundGSD(self.spec, self.table, n)

    def cluster(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, order: torch.Tensor,
                rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids (..., n, W), in_C (..., n, W) bool, alpha (..., n)) for candidates x (..., n) at positions
        with laws p, q (..., V); ``order``/``rank``: p's ascending stable sort and each id's rank in it."""
        V = p.shape[-1]
        offsets = torch.arange(-self.below, self.above + 1, device=p.device)
        rx = rank.gather(-1, x)
        pos = rx[..., None] + offsets  # (..., n, W)
        inside = (pos >= 0) & (pos < V)
        flat = pos.clamp(0, V - 1).flatten(-2)
        ids = order.gather(-1, flat).view(pos.shape)
        py, qy = p.gather(-1, ids.flatten(-2)).view(pos.shape), q.gather(-1, ids.flatten(-2)).view(pos.shape)
        px = p.gather(-1, x)[..., None]
        in_c = inside & ((py - px).abs() < self.delta_p)
        codes = V - self.structural  # ids 0 .. codes-1 are image codes, the rest structural
        if self.structural:
            in_c &= (ids < codes) & (x[..., None] < codes)
        if self.max_dist is not None:
            if self.table is None:
                raise ValueError("GSD.max_dist needs an embedding table: use GSD(...).bind(RuleTables(codebook, "
                                 "embeddings)), or specvis.generate")
            if self.table.device != p.device:
                self.table = self.table.to(p.device)
            if self.table.shape[0] < codes:
                raise ValueError(f"GSD embedding table has {self.table.shape[0]} rows for a vocabulary of {codes}"
                                 + (f" codes and {self.structural} structural ids" if self.structural else ""))
            ex = self.table[x.clamp_max(codes - 1)]  # (..., n, d); structural pairs are already out
            dist = (self.table[ids.clamp_max(codes - 1)] - ex[..., None, :]).square().sum(-1)
            in_c &= dist < self.max_dist
        in_c |= offsets == 0  # x always belongs to its cluster
        zero = torch.zeros_like(py)
        big_p, big_q = torch.where(in_c, py, zero).sum(-1), torch.where(in_c, qy, zero).sum(-1)
        alpha = torch.where(big_q > 0, big_p / big_q.clamp_min(1e-30), torch.ones_like(big_p)).clamp(max=1.0)
        return ids, in_c, alpha

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """The acceptance function: alpha for candidates x (...,) or, with x None, f(y) for every y (..., V)."""
        order = p.sort(dim=-1, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(p.shape[-1], device=p.device).expand_as(order))
        xs = torch.arange(p.shape[-1], device=p.device).expand_as(order) if x is None else x[..., None]
        alpha = self.cluster(p, q, xs, order, rank)[2]
        return alpha if x is None else alpha.squeeze(-1)

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                 soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain rule (``chain``)."""
        return self.chain(p, q, x, soft)

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha = min(1, P(C_x)/Q(C_x)) (..., ); residual max(0, p - q) ("paper") or max(0, p - q f) ("min-tv").
        One stable sort of p per call (the whole verified block); no loop over positions. ``soft`` is ignored."""
        order = p.sort(dim=-1, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(p.shape[-1], device=p.device).expand_as(order))
        if self.residual == "min-tv":
            every = torch.arange(p.shape[-1], device=p.device).expand_as(order)
            f = self.cluster(p, q, every, order, rank)[2]
            return f.gather(-1, x[..., None]).squeeze(-1), (p - q * f).clamp_min(0.0)
        alpha = self.cluster(p, q, x[..., None], order, rank)[2].squeeze(-1)
        return alpha, (p - q).clamp_min(0.0)
