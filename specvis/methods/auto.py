"""``Auto``: the configuration of "run the lossless method predicted fastest here, or AR".

The choice itself (probe, cost curve, pricing, the process cache) is ``specvis.tune``, above
``specvis.generate``: a pipeline call (``pipe(classes, method=sv.Auto())``), ``specvis sample``,
``specvis generate --method auto`` and ``specvis bench`` resolve it with ``tune.resolve`` before
generating; ``specvis.generate`` runs one given method and refuses an ``Auto`` with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Options, option

REFUSED = ("sv.Auto() chooses a method per call above specvis.generate: run it through a pipeline "
           "(pipe(classes, method=sv.Auto())) or choose first with specvis.tune.choose(model, conditions, sampling)")


@dataclass(frozen=True)
class Auto(Options):
    """The lossless method predicted fastest here, or AR (``specvis.tune``: the rule). ``margin``: the
    predicted speedup over AR a candidate needs (>= 1; it must also run no slower than AR in the timed
    probe); ``repeats``: timed repeats per cost-curve point; ``probe_classes``: the classes to probe on
    (class-conditional targets), default the call's own conditions. The choice and its figures come
    back with the call (``Generation.method``, ``Generation.calibration``)."""

    margin: float = option(1.1, low=1, high=100, flag="auto-margin",
                           help="the predicted speedup over AR a candidate needs (about 1 / the least efficiency "
                                "of SJD and Speculative, 0.87-1.00)")
    repeats: int = option(20, low=1, high=200, flag="auto-repeats",
                          help="timed repeats per cost-curve point (5 let the curve's noise reorder SJD windows 8 "
                               "and 16 on the emoji target)")
    probe_classes: tuple[int, ...] | None = option(None, low=0, high=2**24,
                                                   help="class ids to probe on (class-conditional targets; default "
                                                        "the call's own; specvis bench passes its workload's)")
    name = "auto"
    lossless = True
    acceptance = None
    pad = 1  # never decodes itself

    def decode(self, ctx) -> None:
        raise ValueError(REFUSED)
