"""Each argument is checked once along one call: ``batch_size``, ``seed`` and ``classes`` of
``pipe(classes=..., seed=..., batch_size=...)`` (every kind of model: class codes, class latents, MAR,
text prompts) and of ``sv.generate(...)``.

The checks are counted where they are: every binding of ``checks.integer`` (counted under its ``what``),
``checks.seed``, ``checks.class_ids`` and ``generate.check_conditions`` (the class ids ``sv.generate``
takes) in every loaded specvis module is replaced by a counting wrapper, so a check reached under
another name (``from ..checks import seed``) counts too. Catches the run re-checking what the call
checked (``tune.run`` through the public ``generate``), the memory plan of a call re-checking its batch
size (``Pipeline.memory`` instead of the family's plan), and a family checking the classes twice.
"""

from __future__ import annotations

import sys
import types
from collections import Counter

import pytest
import torch

import specvis as sv
from specvis import checks
from specvis.generate import check_conditions


COUNTED = {  # each checking function -> the argument name it checks, from its arguments
    checks.integer: lambda value, what, *args, **kwargs: what,
    checks.seed: lambda value, what="seed": what,
    checks.class_ids: lambda classes, num_classes, what="classes": what,
    check_conditions: lambda model, conditions: "classes",
}

# A module that bound a check under its own name before the counters were set (as ``from ..checks
# import seed`` does): the counters must see its calls too.
PROBE = types.ModuleType("specvis.validated_once_probe")
PROBE.bound_seed = checks.seed
sys.modules[PROBE.__name__] = PROBE


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Counts of the checks made, by argument name, from every loaded specvis module's bindings."""
    seen: Counter = Counter()
    by_id = {id(f): (f, name) for f, name in COUNTED.items()}

    def counting(fn, name_of):
        def wrapper(*args, **kwargs):
            seen[name_of(*args, **kwargs)] += 1
            return fn(*args, **kwargs)
        return wrapper

    patched = 0
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname == "specvis" or modname.startswith("specvis.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in by_id:
                monkeypatch.setattr(module, attr, counting(*by_id[id(value)]))
                patched += 1
    assert patched >= len(COUNTED)  # each function found at least where it is defined
    return seen


def _checked(counts: Counter) -> dict[str, int]:
    return {k: counts[k] for k in ("batch_size", "seed", "classes")}


@pytest.fixture(scope="module")
def tiny():
    return sv.load("random-tiny")


@pytest.mark.parametrize("method", [sv.AR(), sv.SJD(window=4)], ids=["ar", "sjd"])
def test_a_class_call_checks_each_argument_once(tiny, counts, method):
    """Three classes, two rows at a time (continuous batching refills the third)."""
    out = tiny(classes=[0, 1, 2], method=method, seed=5, batch_size=2)
    assert out.tokens.shape[0] == 3
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 1}


def test_sv_generate_checks_each_argument_once(tiny, counts):
    out = sv.generate(tiny.target, torch.tensor([0, 1, 2]), sv.AR(), seed=5, batch_size=2)
    assert out.tokens.shape[0] == 3
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 1}


def test_a_continuous_token_call_checks_each_argument_once(counts):
    pipe = sv.load("random-tiny-continuous")
    counts.clear()
    pipe(classes=[0, 1], method=sv.AR(), seed=2, batch_size=2)
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 1}


def test_a_mar_call_checks_each_argument_once(counts):
    pipe = sv.load("emoji-mar")
    counts.clear()
    pipe(classes=[0, 1], seed=3, batch_size=2, num_iter=2, decode=False)
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 1}


def test_a_text_call_checks_each_argument_once(counts):
    pipe = sv.load("emoji-t2i")
    counts.clear()
    pipe(prompts=["red apple", "cat face", [1, 2, 3]], method=sv.AR(), seed=4, batch_size=2, decode=False)
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 0}


def test_the_counter_sees_a_check_under_another_name(counts):
    """The wrappers replace every binding: a module that bound ``checks.seed`` under its own name
    before the counters were set is counted too, as are positional and keyword ``what``."""
    PROBE.bound_seed(3)
    checks.integer(2, what="batch_size", low=1)
    checks.class_ids([1], 4, "classes")
    assert _checked(counts) == {"batch_size": 1, "seed": 1, "classes": 1}
