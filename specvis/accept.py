"""Acceptance rules: pure, batched functions on probability tensors, behind one explicit protocol.

A rule maps (p, q, x) -> (alpha, residual): p the target law, q the law each draft token x was drawn
from (..., V), alpha the acceptance probability of x and residual the unnormalised law to resample
from on rejection. Under greedy sampling p is a point mass; rules may then take ``soft=`` the
temperature-1 law of the same positions (``laws.DiscreteLaw.soft``; LANTERN relaxes on it, Exact ignores it). ``verify_chain`` walks a drafted chain with any rule, per row, with no Python
loop over positions: every drafting method (draft model, SJD, trees) plugs rules in the same way.

The protocol (``AcceptanceRule``, ``BoundRule``): a rule is a frozen options dataclass
(``specvis.options``) that declares what it needs and which walks it verifies; nothing is probed.

- ``needs``: the tables ``bind`` uses, a subset of ``NEEDS`` ("codebook": the tokenizer's VQ
  codebook, "embeddings": the target's input-embedding table, "soft": the temperature-1 laws under
  greedy sampling, "noise": keyed noise, so the context verifies against the point masses of its
  races, ``Coupled``);
- ``walks``: a subset of ``WALKS``: "chain" (``chain(p, q, x)``: a drafted chain, every rule),
  "tree" (``sibling(p, x)``: deterministic candidates, EagleTree and ADTTree), "sampled-tree"
  (``sibling_q(p, q, x)``: children drawn without replacement, StaticTree);
- ``bind(RuleTables(codebook, embeddings, structural))`` -> the ``BoundRule`` that verifies
  (``Exact.bind`` returns the rule itself; a bound rule binds to itself).

A method declares the walk it needs (``walk``: ``RuleMethod``); a rule without that walk is refused
when the method is built, with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import torch

from .options import Options, option
from .sampling import rows_at, sample, uniform

WALKS = ("chain", "tree", "sampled-tree")
NEEDS = ("codebook", "embeddings", "soft", "noise")


@dataclass(frozen=True)
class RuleTables:
    """What ``bind`` may use: the tokenizer's codebook (V, d), the target's input-embedding table
    (V, d) for its image codes, and the number of structural ids after the codes in the laws
    (``Layout.row_end``: Emu3's and Lumina-mGPT's row ends; 0 elsewhere)."""

    codebook: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    structural: int = 0


@runtime_checkable
class BoundRule(Protocol):
    """A rule ready to verify: ``chain(p, q, x, soft=None) -> (alpha, residual)``; where ``walks`` has
    "tree", also ``sibling(p, x, soft=None) -> (alpha, residual)``; where it has "sampled-tree",
    ``sibling_q(p, q, x, soft=None) -> (alpha, residual, q_next)``."""

    name: str
    lossless: bool
    walks: frozenset[str]

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class AcceptanceRule(Protocol):
    """The user-facing configuration of a rule (``Exact``, ``Lantern``, ``GSD``, or a bound rule):
    ``name``, ``lossless``, ``walks`` and ``needs`` declared, ``bind`` to the tables it needs."""

    name: str
    lossless: bool
    walks: frozenset[str]

    @property
    def needs(self) -> frozenset[str]: ...

    def bind(self, tables: RuleTables) -> BoundRule: ...


class RuleMethod(Options):
    """Mixin of the methods verified by an acceptance rule (field ``acceptance``): ``walk`` is the walk
    the method runs ("chain", "tree" or "sampled-tree"); a rule that does not declare it is refused
    when the method is built."""

    walk: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        rule, name = self.acceptance, type(self).__name__
        if self.walk not in rule.walks:
            only = ", ".join(w for w in WALKS if w in rule.walks)
            able = [r for r, walks in Rule.known.items() if self.walk in walks]
            raise ValueError(f"{name}.acceptance: rule {rule.name} is not supported with {name}: it walks {only} "
                             f"only, {name} needs the {self.walk} walk ({SIBLING[self.walk]}); use {' or '.join(able)}")

    @property
    def lossless(self) -> bool:
        return self.acceptance.lossless


# what each walk calls, for the error of a rule without it
SIBLING = {"chain": "chain rule", "tree": "no sibling rule for draft trees",
           "sampled-tree": "no sibling_q(p, q, x) rule for children sampled without replacement"}
ALL_WALKS = frozenset(WALKS)


class Rule(Options):
    """Base of the rule configurations (``Exact``, ``Lantern``, ``GSD``): each class that declares a
    ``name`` is listed in ``known`` with its walks (the advice of a refused rule's error)."""

    known: ClassVar[dict[str, frozenset[str]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            Rule.known[cls.name] = cls.walks


@dataclass(frozen=True)
class Exact(Rule):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept x with min(1, p(x)/q(x)),
    on rejection resample from normalise(max(0, p - q)). The output law is exactly p."""

    lossless: ClassVar[bool] = True
    name: ClassVar[str] = "exact"
    needs: ClassVar[frozenset[str]] = frozenset()
    walks: ClassVar[frozenset[str]] = ALL_WALKS

    def bind(self, tables: RuleTables) -> "Exact":
        """Exact needs no table: the rule itself."""
        return self

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        px = p.gather(-1, x[..., None]).squeeze(-1)
        qx = q.gather(-1, x[..., None]).squeeze(-1)
        alpha = torch.where(qx > 0, px / qx.clamp_min(1e-30), torch.ones_like(px)).clamp(max=1.0)
        return alpha, (p - q).clamp_min(0.0)

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                 soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain rule (``chain``)."""
        return self.chain(p, q, x, soft)

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
        alpha, residual = self.chain(p, q, x, soft=soft)
        return alpha, residual, without(q, x)

    def config(self) -> dict:
        return {}


@dataclass(frozen=True)
class Coupled(Rule):
    """Verification by equality with the target's keyed choice (``Sampling(noise="keyed")``).

    The context passes, for each verified position m, the point mass p_m at t_m = argmax_v p_m(v) /
    E(s, m, v) (``specvis.noise``; ``DecodeContext.verify``). Accept a draft x with p(x) (1 iff x = t_m) and
    on rejection commit from the residual p itself, the point mass: at every position the row commits
    t_m, whatever the drafts were and whatever law they came from (chain, deterministic tree, sampled
    tree alike). These are AR's tokens under the same noise, so the image is AR's image for the seed,
    and its law is AR's law (the race is Gumbel-max: E(s, m, .) is independent of the prefix, which is
    a function of E(s, <m, .) only). Lossless and method-invariant; acceptance depends on how often the
    draft equals the target's choice (drafts coupled with the same noise agree far more often)."""

    lossless: ClassVar[bool] = True
    name: ClassVar[str] = "coupled"
    needs: ClassVar[frozenset[str]] = frozenset({"noise"})
    walks: ClassVar[frozenset[str]] = ALL_WALKS

    def bind(self, tables: RuleTables) -> "Coupled":
        """Coupled needs no table: the rule itself."""
        return self

    def chain(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
              soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """p: point masses (..., V); accept x iff it carries the mass; the residual is p itself."""
        return p.gather(-1, x[..., None]).squeeze(-1), p

    def sibling(self, p: torch.Tensor, x: torch.Tensor,
                soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chain(p, p, x)

    def sibling_q(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                  soft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (*self.chain(p, q, x), without(q, x))

    def config(self) -> dict:
        return {}


# The rule of a method built without one: ``Exact`` under stream noise, ``Coupled`` under keyed noise
# (``default_rule``). The one instance, so that an explicit ``Exact()`` (a new instance) stays Exact.
DEFAULT_RULE = Exact()


def default_rule(rule: AcceptanceRule | None, keyed: bool) -> AcceptanceRule | None:
    """The rule a method runs with: the one it was given, except that a method built without one
    (``DEFAULT_RULE``) verifies by ``Coupled`` under keyed noise."""
    return Coupled() if keyed and rule is DEFAULT_RULE else rule


def rule_option() -> Any:
    """The declaration of a method's ``acceptance`` field: any ``AcceptanceRule``, default ``Exact()``
    (``Coupled()`` under keyed noise, ``default_rule``), set by ``--accept NAME`` (and the spec key ``accept``)."""
    return option(default_factory=lambda: DEFAULT_RULE, flag="accept",
                  help="the acceptance rule that verifies the drafts (default: coupled under keyed noise; exact under stream noise)")


def normalise(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual / sum(residual); where the residual has no mass (p == q up to rounding) use ``fallback``."""
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), fallback)


def without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The law of the next draw without replacement: q (..., V) with token x (...) removed and
    renormalised; where x carried all of q's mass (nothing left to draw) q itself."""
    return normalise(q.scatter(-1, x[..., None], 0.0), q)


class ChainWalk(NamedTuple):
    """The outcome of ``verify_chain``: per row the accepted drafts, the next token (the residual draw
    at the first rejection, else the bonus draw) and every draft's acceptance probability."""

    accepted: torch.Tensor  # (B,)
    next: torch.Tensor  # (B,)
    alpha: torch.Tensor  # (B, g)
    count: torch.Tensor | None  # (B,) tokens to commit where ``bonus`` is not True (None: accepted + 1)


def verify_chain(rule, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None,
                 soft: torch.Tensor | None = None, length: torch.Tensor | None = None,
                 bonus: bool | torch.Tensor = True) -> ChainWalk:
    """Verify ``draft`` (B, g) drawn from ``q`` (B, g, V) against target laws ``p`` (B, g+1, V).

    Accepts left to right while u_j < alpha_j; returns the accepted count a (B,) and the next token
    (B,): drawn from the normalised residual at position a, or from p[:, g] (the bonus token) when
    every draft token was accepted. ``soft`` (B, g+1, V): the temperature-1 laws of the same positions
    under greedy sampling (or None); the rule gets ``soft[:, :g]``. ``length`` (B,): the drafts row b
    fed (<= g, the rest padding; None: g): the walk stops there and the bonus law is p[:, length].
    ``bonus`` (a bool, or (B,) per row): the row commits the next token after its accepted drafts;
    False: the accepted drafts only (accept-prefix: no residual, no bonus; the next token is drawn all
    the same, so every row reads the same random numbers whichever it commits).
    """
    g = draft.shape[1]
    alpha, residual = rule.chain(p[:, :g], q, draft, soft=None if soft is None else soft[:, :g])
    u = uniform(alpha.shape, alpha, generator)  # float64: no acceptance floor (sampling.uniform)
    passed = u < alpha
    if length is not None:
        passed &= torch.arange(g, device=draft.device) < length[:, None]
    accepted = passed.long().cumprod(dim=-1).sum(dim=-1)
    at = accepted.clamp_max(g - 1)[:, None]  # the rejected position's residual, normalised alone
    rejected = normalise(rows_at(residual, at), rows_at(p, at))[:, 0]
    if length is None:
        law = torch.where((accepted < g)[:, None], rejected, p[:, g])
    else:
        law = torch.where((accepted < length)[:, None], rejected, rows_at(p, accepted[:, None])[:, 0])
    count = None if bonus is True else accepted + torch.as_tensor(bonus, device=accepted.device).long()
    return ChainWalk(accepted, sample(law, generator), alpha, count)
