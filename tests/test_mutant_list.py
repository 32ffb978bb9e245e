"""The planted-bug list stays pointed at the code (scripts/mutants.py): a refactor that rewrites a
mutated line leaves its mutant matching nothing, and the mutant run then stops at it. Catches that
in the suite, before anyone runs the (long) mutant run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_changes_exactly_one_place():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
    mutants = sys.modules["mutants"] = importlib.util.module_from_spec(spec)  # its dataclass needs the module
    spec.loader.exec_module(mutants)
    stale = [f"{m.name}: {m.old!r} occurs {(ROOT / m.file).read_text().count(m.old)} times in {m.file}"
             for m in mutants.MUTANTS if (ROOT / m.file).read_text().count(m.old) != 1]
    assert not stale, "\n".join(stale)
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names), "two mutants share a name"
