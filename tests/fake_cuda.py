"""A CPU stand-in for the CUDA graph API of ``specvis.methods.rounds``, so the captured-round path
runs (and is tested) without a GPU.

Capture runs the round (a real capture records it and the replay that follows runs it, so the first
replay of a graph is a no-op here); later replays rerun the round with every piece of host state a
real replay would not touch restored (the views' forward counts and block sizes, the live caches'
bounds), and check that the round ran at the spans the graph was captured at (its shapes).
"""
from __future__ import annotations

import contextlib

from specvis.methods import rounds


class FakeCuda:
    def __init__(self) -> None:
        self.ctx = self.round_fn = None
        self.captures = self.replays = 0

    class Stream:
        def __init__(self, *a) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    def current_stream(self, dev):
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s):
        yield

    @contextlib.contextmanager
    def graph(self, g):
        self.captures += 1
        g.pins = [c.pin for c in self.ctx.live_caches()]
        yield

    def CUDAGraph(self):
        fake = self

        class Graph:
            fresh = True

            def register_generator_state(self, g) -> None:
                pass

            def replay(self) -> None:
                if self.fresh:
                    self.fresh = False
                    return
                fake.replays += 1
                views, caches = fake.ctx.counted, fake.ctx.live_caches()
                saved = rounds._counters(views)
                bounds = [(c.bound, c.start, list(c.trace), c.overflow) for c in caches]
                assert [c.pin for c in caches] == self.pins
                fake.round_fn()
                assert not any(c.overflow for c in caches), "a replay would have needed other shapes"
                rounds._restore(views, saved)
                for c, (b, s, t, o) in zip(caches, bounds):
                    c.bound, c.start, c.trace, c.overflow = b, s, t, o

        return Graph()


def install(monkeypatch) -> FakeCuda:
    """Make ``rounds`` take its captured path on CPU through a new stand-in, which it returns."""
    fake = FakeCuda()
    real = rounds._run_graphs

    def run_graphs(ctx, round_fn, *args):
        fake.ctx, fake.round_fn = ctx, round_fn
        return real(ctx, round_fn, *args)

    monkeypatch.setattr(rounds, "_run_graphs", run_graphs)
    monkeypatch.setattr(rounds, "_capturable", lambda device: True)
    monkeypatch.setattr(rounds, "cuda", fake)
    return fake
