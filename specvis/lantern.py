"""LANTERN relaxed acceptance (Jang et al. 2024, Sec. 3.2-3.3, Algorithm 1) as a pluggable rule.

Image tokens that are close in the tokenizer's latent space are nearly interchangeable, so a draft
token x may be accepted on the target mass of its latent neighbourhood instead of its own.
Notation of ``specvis.accept``: p is the target law, q the law x was drafted from.

- B_k(x): the k nearest codes of x (x first), from a cached table (``neighbour_table``).
- A_{k,delta}(x): the longest prefix of B_k(x) whose merge stays within the budget; with ``budget="paper"``
  (the paper) the target mass moved onto x, m(A) = sum_{y in A, y != x} p(y), must be <= delta.
- p_{k,delta}(.|x): the distorted target: p(A) on x, 0 on A \\ {x}, p elsewhere;
  TV(p_{k,delta}(.|x), p) = m(A) <= delta.
- accept x with alpha = min(1, p(A) / q(x)); on rejection resample from max(0, p_{k,delta}(.|x) - q).

Bound (what is and is not guaranteed). ``budget="paper"`` bounds the distorted target of each
candidate: TV(p_{k,delta}(.|x), p) <= delta. That does NOT bound the law of the committed token:
the target depends on the candidate, and the output law is
O(y) = min(q(y), p(A_y)) + sum_x max(0, q(x) - p(A_x)) r_x(y), r_x = normalise(max(0, p_{k,delta}(.|x) - q)),
whose TV to p can exceed delta by far when q is spread (every y with q(y) > p(y) may gain up to
delta; tests/test_lantern.py measures such a case).

``budget="output"`` bounds the committed token itself. It keeps the exact residual max(0, p - q) and
grows A_x only while the acceptance gain stays within delta:
min(q(x), p(A_x)) - min(q(x), p(x)) <= delta * q(x). Then, with beta_x = min(1, p(x)/q(x)),
O(y) = min(q, p)(y) + q(y) (alpha_y - beta_y) + (1 - D / TV(p, q)) max(0, p - q)(y), D = E_{x~q}[alpha_x - beta_x],
so TV(O, p) = D <= delta exactly: per position and conditional on the prefix (and on everything
before it in the round), each committed token's law is within delta of the target's. Bonus tokens
are exact. With a point-mass draft (q(x) = 1) both budgets pick the same A and TV(O, p) = m(A) <= delta
(for "paper", O = p_{k,delta}(.|x)).

``budget="relative"`` (LANTERN++, Park et al. 2025, the official code's lambda mode in jadohu/LANTERN:
the neighbour mass m* = max{m : S_m <= (lam - 1) p(x)}): A_x grows, neighbours in table order, while
m(A_x) <= (lam - 1) p(x), i.e. p(A_x) <= lam p(x); ``delta`` is unused. Accept and resample as "paper"
(alpha = min(1, p(A)/q(x)), residual max(0, p_{k,lam}(.|x) - q)). Bound: each candidate's distorted target
is within (lam - 1) p(x) of p (TV); with a point-mass draft the committed token's law is exactly that
(TV(O, p) = m(A_x) <= (lam - 1) p(x)); with a spread q no bound on the committed token follows from the
paper residual (as for "paper"), while with ``residual="min-tv"`` TV(O, p) = D (as for "output")
<= min(TV(p, q), (lam - 1) p({y : q(y) > p(y)})) exactly. lam = 1 is token for token ``Exact()``.

Residual (``residual=``): "paper" (default) is each budget's own: the distorted target's
max(0, p_{k,.}(.|x) - q) for "paper" and "relative", max(0, p - q) for "output". "min-tv" (Cool-SD,
AAAI 2026): normalise(max(0, p - q f)) with f(y) = alpha_y the rule's acceptance function. Why it is
optimal for a fixed f: the accepted part a(y) = q(y) f(y) is fixed, so for any resampling law r the
output O = a + (1 - |a|) r >= a pointwise and TV(O, p) = sum_y max(0, O(y) - p(y)) >= L = sum_y max(0, a(y) - p(y));
r = normalise(max(0, p - a)) reaches L (where a > p, O - p = a - p; elsewhere O <= p since the residual mass
1 - |a| + L >= 1 - |a|). For LANTERN f(y) >= min(1, p(y)/q(y)) (p(A_y) >= p(y)), so q f >= p wherever
q > p and q f = q elsewhere: max(0, p - q f) = max(0, p - q) for every budget (hence "output" is
already min-TV, and then TV(O, p) = D as below). Under greedy and in ``sibling`` the residual option is
not used (point-mass drafts: the rules above).

Both: delta = 0 is token for token ``Exact()`` (only zero-mass neighbours join A, alpha and residual
are bitwise Exact's).

Greedy (paper Sec. 3.3, last paragraph: "for greedy decoding, LANTERN can be simply reduced to accept
x~ if x~ = argmax_x q_{k,delta}(x | s, D = x~)", q the paper's target law). At temperature 0 specvis's
p is the point mass at the greedy token a, and merging neighbours into a point mass never relaxes
anything (for delta < 1, a never joins another token's A). The rule therefore takes ``soft=`` s, the
temperature-1 law of the same positions (``Sampling.soft_probs``: CFG, top-k, top-p, softmax; its
argmax is a), which ``specvis.generate`` keeps when the sampling is greedy (``needs`` holds "soft"):

- A = A_{k,delta}(x) on s: the longest prefix of B_k(x) with m_s(A) = sum_{y in A, y != x} s(y) <= delta;
  s_{k,delta}(.|x) = s(A) on x, 0 on A \\ {x}, s elsewhere; TV(s_{k,delta}(.|x), s) = m_s(A) <= delta;
- alpha = 1 if x == a or s_{k,delta}(x|x) > max_{y != x} s_{k,delta}(y|x), else 0; residual = p
  (the point mass at a; ``sibling``: p with x zeroed, like Exact).

The strict ">" settles ties towards a, so delta = 0 (s_{k,0}(x|x) = s(x) <= s(a)) is greedy AR token
for token. On rejection a is not in A (else x would win), so argmax s_{k,delta}(.|x) = a (up to
ties): committing a is the paper's rule. Budgets: under greedy every candidate is decided as a deterministic point mass,
whatever q it was drafted from (SJD's random init has q uniform), so "output" takes q(x) = 1, where its
condition min(1, s(x) + m) - s(x) <= delta reduces to m <= delta: both budgets give the same A.
("relative" merges while m_s(A) <= (lam - 1) s(x): the guarantee below then reads s(y) >= s(a) / lam.)
Guaranteed per committed token y: y is the argmax of a law within delta in TV of s (s itself when
y = a, s_{k,delta}(.|y) otherwise), hence s(y) >= s(a) - delta. Not guaranteed: equality with greedy
AR (any accepted y != a changes the prefix, and the following positions condition on it), nor any TV
bound on the committed token's law (a point mass; TV(point mass at y, s) = 1 - s(y)).

Draft trees (``sibling``): deterministic candidates x1, x2, ... tried in turn, each as a point-mass
draft; per tried candidate the distortion is <= delta, so the committed token is within
delta * E[number of candidates tried] of p (telescoping over the chain of rejections).

Departures from the official code (jadohu/LANTERN @ 3a56e45, models/ea_model_llamagen.py
``evaluate_posterior``; the Anole and Lumina-mGPT files alike):
- k counts x itself: B_k(x) is x and its k - 1 nearest codes. The official table excludes x
  (``top_16383_indices.npy`` for 16,384 codes) and ``lantern_k`` counts neighbours only (line 744:
  ``nearest_latents[xi, :lantern_k]``), so the official ``lantern_k`` is specvis's k - 1.
- A rejected sibling's residual is the paper's [p_{k,delta}(.|x) - q]^+ with q the point mass at x:
  p with x and the members of A zeroed. The official code zeroes x and, when any neighbour was merged,
  x's first ``lantern_k + 1`` neighbours (line 773), whatever A holds.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from .accept import ALL_WALKS, Exact, Rule, RuleTables
from .io import atomic_write
from .options import option

METRICS = ("l2", "cosine")
BUDGETS = ("paper", "output", "relative")
RESIDUALS = ("paper", "min-tv")
_TABLES: dict[str, torch.Tensor] = {}  # in-process cache: key -> (V, k) CPU table
_VERSION = "lantern-nn-v1"


def cache_dir() -> Path:
    """``$SPECVIS_CACHE/lantern`` if SPECVIS_CACHE is set, else ``~/.cache/specvis/lantern``."""
    root = os.environ.get("SPECVIS_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "specvis") / "lantern"


def table_key(codebook: torch.Tensor, k: int, metric: str) -> str:
    """sha256 over the codebook's bytes, dtype and shape, the metric and k."""
    cb = codebook.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{_VERSION}|{metric}|{k}|{cb.dtype}|{tuple(cb.shape)}|".encode())
    h.update(cb.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:40]


def index_dtype(vocab: int) -> torch.dtype:
    """The smallest integer dtype that holds the code ids 0 .. vocab-1."""
    return torch.int16 if vocab <= 32767 else torch.int32


def _distances(block: torch.Tensor, cb: torch.Tensor, sq: torch.Tensor, metric: str) -> torch.Tensor:
    """(b, d) x (V, d) -> (b, V) float64: squared L2 distance |a|^2 + |c|^2 - 2 a.c, or 1 - cos(a, c)
    (block and cb already unit-normalised for cosine; sq = |c|^2)."""
    if metric == "cosine":
        d = torch.addmm(torch.ones_like(sq).expand(block.shape[0], -1), block, cb.T, alpha=-1.0)
    else:
        d = torch.addmm((block * block).sum(-1, keepdim=True) + sq, block, cb.T, alpha=-2.0)
    return d.clamp_min_(0.0)


def build_table(codebook: torch.Tensor, k: int, metric: str = "l2", chunk: int = 512) -> torch.Tensor:
    """(V, k) ids of each code's k nearest codes, the code itself first, then by (distance, id),
    as a CPU tensor of ``index_dtype(V)``; computed in float64 on the codebook's device.

    Rows are processed in blocks of ``chunk`` (memory O(chunk * V), time O(V^2 d)): top-k, then the
    k selected ordered by (distance, id); rows whose k-th distance is tied with an unselected code
    (duplicate codes) fall back to a full stable sort, so ties always go to the lower id."""
    cb = codebook.detach().to(torch.float64)
    if metric == "cosine":
        cb = cb / cb.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    sq = (cb * cb).sum(-1)
    V, dev = cb.shape[0], cb.device
    k = min(k, V)
    out = torch.empty(V, k, dtype=index_dtype(V))
    for s in range(0, V, chunk):
        rows = torch.arange(s, min(s + chunk, V), device=dev)
        d = _distances(cb[rows], cb, sq, metric)
        d[torch.arange(rows.numel(), device=dev), rows] = -1.0  # the code itself comes first
        val, idx = d.topk(k, dim=-1, largest=False, sorted=False)
        idx, order = idx.sort(dim=-1)  # by id, then stably by distance: (distance, id) order
        order = val.gather(-1, order).sort(dim=-1, stable=True).indices
        idx = idx.gather(-1, order)
        tied = (d <= val.max(-1, keepdim=True).values).sum(-1) > k
        if bool(tied.any()):
            idx[tied] = d[tied].sort(dim=-1, stable=True).indices[:, :k]
        out[s: s + rows.numel()] = idx.to("cpu", out.dtype)
    return out


def neighbour_table(codebook: torch.Tensor, k: int, metric: str = "l2", cache: bool = True) -> torch.Tensor:
    """``build_table`` cached in process and on disk (``cache_dir()/<key>.pt``, atomic write)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if codebook.ndim != 2 or codebook.shape[0] < 1:
        raise ValueError(f"codebook must be a (V, d) tensor, got shape {tuple(codebook.shape)}")
    k = min(int(k), codebook.shape[0])
    key = table_key(codebook, k, metric)
    if cache and key in _TABLES:
        return _TABLES[key]
    path = cache_dir() / f"{key}.pt"
    table = None
    if cache and path.is_file():
        try:
            table = torch.load(path, map_location="cpu", weights_only=True)
            if table.shape != (codebook.shape[0], k):
                table = None
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):  # unreadable: rebuild
            table = None
    if table is None:
        table = build_table(codebook, k, metric)
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda tmp: torch.save(table, tmp))
    if cache:
        _TABLES[key] = table
    return table


@dataclass(frozen=True)
class Lantern(Rule):
    """LANTERN relaxed acceptance: neighbourhood A_{k,delta}(x) over the tokenizer codebook
    (``metric`` l2 or cosine); ``budget`` "paper" (TV of the distorted target <= delta) or "output"
    (TV of the committed token's law <= delta) or "relative" (LANTERN++: p(A) <= lam p(x); delta unused);
    ``residual`` "paper" (the budget's own) or "min-tv" (Cool-SD: max(0, p - q f)); under greedy sampling the paper's greedy rule on the
    temperature-1 law. See the module docstring for the equations and bounds.
    Needs ``bind(RuleTables(codebook))`` before use (``specvis.generate`` does it with ``codebook=``)."""

    k: int = option(1000, low=1, high=4096, flag="lantern-k",
                    help="neighbours per code, the code itself included (B_k(x); the official lantern_k + 1)")
    delta: float = option(0.2, low=0, high=1, flag="lantern-delta",
                          help="total-variation budget of a merge (budgets paper and output)")
    metric: str = option("l2", choices=METRICS, flag="lantern-metric",
                         help="distance between codebook vectors that ranks the neighbours")
    budget: str = option("paper", choices=BUDGETS, flag="lantern-budget",
                         help="paper: delta bounds each candidate's distorted target (Alg. 1); output: delta bounds "
                              "the committed token's law; relative: LANTERN++, p(A) <= lam p(x)")
    lam: float = option(5.0, low=1, high=1000, flag="lantern-lam",
                        help="budget relative: the neighbourhood's mass is at most lam p(x) (LANTERN++'s lambda)")
    residual: str = option("paper", choices=RESIDUALS,
                           help="paper: the budget's own residual; min-tv: Cool-SD's max(0, p - q f)")
    name: ClassVar[str] = "lantern"
    lossless: ClassVar[bool] = False
    needs: ClassVar[frozenset[str]] = frozenset({"codebook", "soft"})
    walks: ClassVar[frozenset[str]] = ALL_WALKS

    def bind(self, tables: RuleTables) -> BoundLantern:
        """The rule on ``tables.codebook`` (k clipped to V), extended by ``tables.structural`` ids
        (``BoundLantern.with_structural``); the neighbour table is built once and cached."""
        if tables.codebook is None:
            raise ValueError("Lantern needs the tokenizer codebook (codebook=...)")
        bound = BoundLantern(self, neighbour_table(tables.codebook, self.k, self.metric), tables.codebook.device)
        return bound.with_structural(tables.structural) if tables.structural else bound

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Unbound: a ValueError (LANTERN's neighbourhoods need the codebook's table)."""
        raise ValueError("Lantern needs the tokenizer codebook: use Lantern(...).bind(RuleTables(codebook)), "
                         "or pass codebook= to specvis.generate")

    __call__ = chain

    def config(self) -> dict:
        return {"k": self.k, "delta": self.delta, "metric": self.metric, "budget": self.budget, "lam": self.lam,
                "residual": self.residual}


class BoundLantern:
    """``Lantern`` bound to a neighbour table (V, k): a pure, batched rule ``chain(p, q, x) -> (alpha, residual)``
    plus ``sibling(p, x) -> (alpha, p_next)`` for deterministic draft trees and ``sibling_q`` for
    sampled ones (a ``BoundRule`` walking every walk)."""

    lossless: ClassVar[bool] = False
    name: ClassVar[str] = "lantern"
    needs: ClassVar[frozenset[str]] = frozenset({"soft"})  # under greedy sampling: relax on the temperature-1 law
    walks: ClassVar[frozenset[str]] = ALL_WALKS

    def __init__(self, spec: Lantern, table: torch.Tensor, device: torch.device | str = "cpu",
                 codes: int | None = None) -> None:
        self.spec = spec
        self.k, self.delta, self.budget = table.shape[1], float(spec.delta), spec.budget
        self.lam, self.residual = float(spec.lam), spec.residual
        self.table = table.to(device)
        self.codes = table.shape[0] if codes is None else codes  # table rows that are image codes

    def config(self) -> dict:
        return {**self.spec.config(), "k": self.k}

    def bind(self, tables: RuleTables) -> "BoundLantern":
        """Already bound: itself, extended by ``tables.structural`` ids unless its table has them."""
        extra = tables.structural - (self.table.shape[0] - self.codes)
        return self.with_structural(extra) if extra > 0 else self

    def with_structural(self, n: int) -> "BoundLantern":
        """The table extended by ``n`` structural ids (``Layout.row_end``), each its own only neighbour:
        they occur only where the law is a point mass at them, and never join a code's neighbourhood."""
        V = self.table.shape[0]
        own = torch.arange(V, V + n, device=self.table.device, dtype=self.table.dtype)[:, None].expand(-1, self.k)
        table = torch.cat([self.table, own])
        if V + n > torch.iinfo(table.dtype).max:
            table = table.long()
        return BoundLantern(self.spec, table, self.table.device, self.codes)

    def neighbourhood(self, p: torch.Tensor, x: torch.Tensor, qx: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids (..., k), in_A (..., k) bool, p(A) (...)) for candidates x (...) under target p (..., V).

        moved_j = sum_{i=1..j} p(n_i) over neighbours n_1.. of x (n_0 = x); A = the prefix with
        moved_j <= delta ("paper"), or min(q(x), p(x) + moved_j) - min(q(x), p(x)) <= delta q(x)
        ("output"; qx = q(x), 1 for point-mass drafts), or moved_j <= (lam - 1) p(x) ("relative").
        All three conditions are monotone in j."""
        if self.table.device != p.device:
            self.table = self.table.to(p.device)
        ids = self.table[x].long()
        pn = p.gather(-1, ids)
        moved = torch.cat([torch.zeros_like(pn[..., :1]), pn[..., 1:].cumsum(-1)], -1)
        px = pn[..., :1]
        if self.budget == "relative":
            in_a = moved <= (self.lam - 1.0) * px
        elif self.budget == "paper" or qx is None:
            in_a = moved <= self.delta
        else:
            q1 = qx[..., None]
            gain = torch.minimum(q1, px + moved) - torch.minimum(q1, px)
            in_a = gain <= self.delta * q1
        count = in_a.sum(-1, keepdim=True)  # >= 1: moved_0 = 0
        p_a = px + moved.gather(-1, count - 1)
        return ids, in_a, p_a.squeeze(-1)

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                 soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain rule (``chain``)."""
        return self.chain(p, q, x, soft)

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha = min(1, p(A)/q(x)) (1 where q(x) = 0); residual max(0, p_{k,delta}(.|x) - q) ("paper")
        or max(0, p - q) ("output", and every budget with residual "min-tv"). With ``soft`` (greedy: p a point mass, soft its temperature-1 law):
        alpha = ``greedy_accept(p, x, soft)``, residual p."""
        if soft is not None:
            return self.greedy_accept(p, x, soft), p
        qx = q.gather(-1, x[..., None]).squeeze(-1)
        ids, in_a, p_a = self.neighbourhood(p, x, qx)
        alpha = torch.where(qx > 0, p_a / qx.clamp_min(1e-30), torch.ones_like(p_a)).clamp(max=1.0)
        if self.budget == "output" or self.residual == "min-tv":
            return alpha, (p - q).clamp_min(0.0)
        return alpha, (_merge(p, x, ids, in_a, p_a) - q).clamp_min(0.0)

    def distorted(self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """p_{k,delta}(.|x): p(A) on x, 0 on A \\ {x}, p elsewhere (A for a point-mass draft if q is None).
        It is the candidate's target for budget "paper"; budget "output" never resamples from it."""
        qx = None if q is None else q.gather(-1, x[..., None]).squeeze(-1)
        return _merge(p, x, *self.neighbourhood(p, x, qx))

    def greedy_accept(self, p: torch.Tensor, x: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        """The paper's greedy rule (module docstring): 1.0 where x == argmax p or
        s_{k,delta}(x|x) > max_{y != x} s_{k,delta}(y|x) on the soft law s (A for a point-mass
        candidate: m_s(A) <= delta, both budgets), else 0.0; in p's dtype, shape x.shape."""
        d = self.distorted(soft, x)
        dx = d.gather(-1, x[..., None]).squeeze(-1)
        best_other = d.scatter(-1, x[..., None], -1.0).amax(-1)
        return ((x == p.argmax(-1)) | (dx > best_other)).to(p.dtype)

    def sibling(self, p: torch.Tensor, x: torch.Tensor,
                soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic multi-candidate step (draft trees): accept candidate x (...) with p(A_x)
        (q(x) = 1, so both budgets give the same A); on rejection the next candidate sees
        normalise(residual): residual = p with A_x zeroed ("paper") or with x zeroed ("output"),
        returned unnormalised like ``Exact.sibling`` (the tree walk normalises). With ``soft``
        (greedy: p the point mass at a, soft the node's temperature-1 law, the same for every
        candidate): alpha = ``greedy_accept(p, x, soft)``, residual p with x zeroed (still the
        point mass at a after a rejection)."""
        if soft is not None:
            return self.greedy_accept(p, x, soft), p.scatter(-1, x[..., None], 0.0)
        ids, in_a, p_a = self.neighbourhood(p, x)
        if self.budget == "output":
            rest = p.scatter(-1, x[..., None], 0.0)
        else:
            rest = _merge(p, x, ids, in_a, torch.zeros_like(p_a))
        return p_a.clamp(max=1.0), rest


    # Children sampled from q without replacement (StaticTree; LANTERN++'s drafting): each sibling is the
    # chain rule (``chain``, greedy rule included) on the current pair (p_r, q_r), the next drawn from
    # q_r without x_r: Exact's walk. Bound: the committed token's law O satisfies
    # TV(O, p) <= sum_r P(reach sibling r) TV(O_r, p_r), O_r the chain rule's one-step law on (p_r, q_r)
    # (telescoping as for ``sibling``; each term is the chain bound above); relaxed-tv.md enumerates it.
    # Under greedy a rejected x is not the argmax a, so the residual p (the point mass at a) is p with x zeroed.
    sibling_q = Exact.sibling_q

def _merge(p: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, in_a: torch.Tensor, p_a: torch.Tensor) -> torch.Tensor:
    """p with the members of A (ids where in_a) zeroed and p_a written on x."""
    merged = torch.zeros_like(p, dtype=torch.bool).scatter(-1, ids, in_a)
    return p.masked_fill(merged, 0.0).scatter(-1, x[..., None], p_a[..., None])


def exact_sibling(p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lossless deterministic multi-candidate step (EAGLE): accept candidate x with p(x); on
    rejection the next candidate sees normalise(residual), residual = p with x zeroed (returned
    unnormalised). Bitwise ``BoundLantern.sibling`` at delta = 0."""
    return p.gather(-1, x[..., None]).squeeze(-1), p.scatter(-1, x[..., None], 0.0)
