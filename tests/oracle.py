"""The per-forward oracle: every law a target forward returns, inside any method, is checked against
the teacher-forced law of exactly the context that the committed tokens and the fed block define.

For a target forward that feeds tokens t_0..t_{n-1} at grid positions s_0..s_{n-1} (row r, with
n_r tokens committed when the forward is called) the oracle requires:
- s_0 <= n_r, and a fed token at a position < n_r equals the committed token there;
- token j's context is committed[:s_0] followed by the fed tokens that j attends to (chain: 0..j;
  tree: the true entries of its tree-mask row, in feeding order), and s_j = s_0 + |ancestors(j)| - 1;
- the returned law after t_j equals ``reference.sampling_law`` of the model teacher-forced on that
  context (total variation <= TOL), computed without the KV cache and without ``specvis.sampling``.
The prefill's law must equal the reference law of the empty context. Rows that are already done,
and fed tokens whose next position lies past the grid, are not checked (their laws are never used).

``deferred=True`` (for large models, where teacher-forcing every context of every forward is too
slow for the suite) keeps the position and committed-token checks per forward, records every law
whose context is a prefix of the row's final image (accepted drafts, the law at the first rejection,
the bonus law: every law the output depends on) and checks them all against one teacher-forced pass
over the final images when the report is asserted; laws after a rejected draft are then skipped.

A position shifted by one, a stale cache slot after a rejection, a wrong rollback length or a tree
compaction that moves the wrong slots all change some returned law, whatever the method does with it.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field

import torch

from reference import sampling_law
from specvis.methods.base import DecodeContext

generate_module = importlib.import_module("specvis.generate")

TOL = 1e-4


@dataclass
class Report:
    forwards: int = 0
    checked: int = 0  # (row, fed token) laws compared
    max_tv: float = 0.0
    errors: list[str] = field(default_factory=list)
    pending: list = field(default_factory=list)  # deferred checkers, finished by assert_ok

    def fail(self, message: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(message)

    def assert_ok(self) -> None:
        for checker in self.pending:
            checker.finish()
        self.pending.clear()
        assert self.checked > 0, "the oracle saw no law"
        assert not self.errors, f"{len(self.errors)}+ oracle failures, first: " + "; ".join(self.errors[:3])
        assert self.max_tv <= TOL, f"max TV {self.max_tv:.2e} > {TOL}"


def _ancestors(tree_mask: torch.Tensor | None, r: int, j: int) -> list[int]:
    if tree_mask is None:
        return list(range(j + 1))
    return [int(i) for i in torch.nonzero(tree_mask[r, j, : j + 1]).flatten()]


class _Checked:
    """Wraps a ``GuidedModel``'s prefill/forward with the oracle's checks (see module docstring)."""

    def __init__(self, ctx: DecodeContext, report: Report, deferred: bool) -> None:
        self.ctx, self.report, self.view, self.deferred = ctx, report, ctx.target, deferred
        self.records: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # deferred (row, context, law)
        if deferred:
            report.pending.append(self)
        self.model, self.sampling = ctx.target.model, ctx.target.sampling
        self.cond = ctx.target.conditions[: ctx.target.batch]
        self.prefill, self.forward = self.view.prefill, self.view.forward
        self.view.prefill, self.view.forward = self._prefill, self._forward

    def _compare(self, law: torch.Tensor, expected: torch.Tensor, where: str) -> None:
        tv = 0.5 * (law.double().cpu() - expected).abs().sum(-1)
        self.report.checked += tv.numel()
        worst = float(tv.max())
        self.report.max_tv = max(self.report.max_tv, worst)
        if worst > TOL:
            self.report.fail(f"{where}: law differs from the teacher-forced law (TV {worst:.3f})")

    def _prefill(self):
        law = self.prefill()
        self.report.forwards += 1
        empty = torch.zeros(self.cond.shape[0], 0, dtype=torch.long, device=self.cond.device)
        self._compare(law.probs, sampling_law(self.model, self.cond, empty, self.sampling)[:, 0], "prefill")
        return law

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None):
        committed, n = self.ctx.tokens.clone(), self.ctx.n.clone()
        out = self.forward(tokens, positions, tree_mask)
        law = out.probs  # the view's DiscreteLaw
        self.report.forwards += 1
        k = self.report.forwards
        L = self.ctx.L
        contexts, rows, laws = [], [], []
        for r in range(tokens.shape[0]):
            nr = int(n[r])
            if nr >= L:
                continue
            s0 = int(positions[r, 0])
            if not 0 <= s0 <= nr:
                self.report.fail(f"forward {k} row {r}: first fed position {s0} not in [0, {nr}] committed")
                continue
            for j in range(tokens.shape[1]):
                anc = _ancestors(tree_mask, r, j)
                pos = int(positions[r, j])
                if pos != s0 + len(anc) - 1:
                    self.report.fail(f"forward {k} row {r} token {j}: position {pos}, its context says {s0 + len(anc) - 1}")
                    continue
                if pos < nr and int(tokens[r, j]) != int(committed[r, pos]):
                    self.report.fail(f"forward {k} row {r} token {j}: feeds {int(tokens[r, j])} at committed position {pos}")
                    continue
                if pos + 1 >= L:
                    continue
                contexts.append(torch.cat([committed[r, :s0], tokens[r, anc]]))
                rows.append(r)
                laws.append(law[r, j])
        if self.deferred:
            self.records += [(r, c, p.clone()) for r, c, p in zip(rows, contexts, laws)]
        elif contexts:
            self._check_contexts(contexts, rows, torch.stack(laws), k)
        return out

    def finish(self) -> None:
        """Deferred mode: compare every recorded law whose context the final image extends."""
        final = self.ctx.tokens[:, : self.ctx.L]
        expected = sampling_law(self.model, self.cond, final[:, :-1], self.sampling)
        keep = [(r, c, p) for r, c, p in self.records if torch.equal(final[r, : c.numel()], c)]
        if keep:
            want = torch.stack([expected[r, c.numel()] for r, c, _ in keep])
            self._compare(torch.stack([p for _, _, p in keep]), want, "deferred")

    def _check_contexts(self, contexts: list[torch.Tensor], rows: list[int], laws: torch.Tensor, k: int) -> None:
        """Teacher-force every context (padded at the end: a causal model ignores what follows)."""
        length = torch.tensor([c.numel() for c in contexts])
        padded = torch.zeros(len(contexts), int(length.max()), dtype=torch.long, device=laws.device)
        for i, c in enumerate(contexts):
            padded[i, : c.numel()] = c
        cond = self.cond[torch.tensor(rows, device=self.cond.device)]
        expected = sampling_law(self.model, cond, padded, self.sampling)
        expected = expected[torch.arange(len(contexts)), length]
        self._compare(laws, expected, f"forward {k}")


@contextlib.contextmanager
def oracle(deferred: bool = False):
    """Within the block, every ``specvis.generate`` call checks each target law; yields the Report."""
    report = Report()

    class OracleContext(DecodeContext):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            _Checked(self, report, deferred)

    saved = generate_module.DecodeContext
    generate_module.DecodeContext = OracleContext
    try:
        yield report
    finally:
        generate_module.DecodeContext = saved
