"""``scripts/fuzz_inputs.py`` in the suite, at a size that keeps the suite within its time: a few cases
of each class of the second campaign (the script runs every case in full on its own)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fuzz_inputs.py"
FAST = ["bench json: a user's JSON object", "cli prompts FIFO", "cli SPECVIS_THREADS 10**9", "api progress=3",
        "api Sampling(temperature=1e-40)", "cli method ''", "cli md /", "api progress=True"]


def load_script():
    spec = importlib.util.spec_from_file_location("fuzz_inputs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_inputs"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_case_has_a_class_and_a_unique_name():
    fuzz = load_script()
    cases = fuzz.cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    groups = {c.group for c in cases}
    assert {"data loss", "hangs", "tracebacks", "silent accepts", "messages", "memory", "progress"} <= groups
    assert all(name in names for name in FAST)


def test_a_few_cases_of_each_class_pass(capsys):
    """The FAST cases run as the script runs them (own process, timeout, address-space cap) and are as
    expected; the summary prints one line per class with its counts."""
    fuzz = load_script()
    assert fuzz.main(["-k", ",".join(n.lower() for n in FAST), "--memory-gib", "8"]) == 0
    out = capsys.readouterr().out
    for group in ("data loss", "hangs", "tracebacks", "silent accepts", "messages", "progress"):
        assert any(line.strip().startswith(group) and "defects" in line for line in out.splitlines()), group
