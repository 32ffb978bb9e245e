"""A clock that moves only when a test moves it, in place of ``time.perf_counter``.

No unit test may assert on wall time (a busy machine makes any bound flaky). Code under test reads
``time.perf_counter()`` (forward seconds, the cost curve, the decode's wall-clock, Auto's calibration);
a test installs ``FakeClock`` and advances it from inside the fakes it times (a forward that "takes"
10 ms advances it by 0.01), so every figure the code books is an exact, known number.
"""

from __future__ import annotations

import time


class FakeClock:
    """``time.perf_counter`` stand-in: returns ``now``; ``advance(s)`` moves it forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def install(monkeypatch) -> FakeClock:
    """Replace ``time.perf_counter`` (as every module that calls ``time.perf_counter()`` sees it) for one test."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock
