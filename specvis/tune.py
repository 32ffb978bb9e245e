"""The choice of ``sv.Auto()``: the lossless method predicted fastest for this model, device, batch and
sampling, or plain AR when none is predicted faster ("never slower than AR").

``choose(model, conditions, sampling, ...) -> (method, Calibration)`` makes the choice; ``resolve``
returns a call's method unchanged unless it is an ``Auto`` (the pipelines call it before
``specvis.generate``, which runs one given method and refuses an ``Auto``); ``run`` is ``generate``
with that resolution first. This module sits above ``generate`` and below the pipelines: it needs
the methods, ``generate``, the forward cost curve (``specvis.cost``) and the registry's spec strings.

The rule, on the first call for a key (target, draft, drafter, device, batch size, grid, sampling,
probe classes, margin):
1. Acceptance probe: every candidate runs once on the call's own conditions (the whole batch, seed
   ``PROBE_SEED``; its samples are thrown away) and reports its forwards by block size
   (``Stats.block_sizes``), its mean accepted length and its draft forwards per target forward.
   AR's forwards are known (one 1-token target forward per stream token). After step 3, when the
   best candidate is predicted at least ``margin`` times AR, the "close" candidates (predicted at
   least that and within a factor ``CLOSE`` of the best) and AR itself run again (seeds
   PROBE_SEED + 1, ...), round-robin in an order that reverses every batch (so that what one run
   leaves in the caches falls on each alike), until each has decoded ``PROBE_IMAGES`` images (at
   least three batches: two timed after the first), and the candidates are priced on all of their runs:
   one image's acceptance can reorder candidates a few percent apart, and one timed batch can rate
   a candidate faster than AR that is not over a whole run.
   With ``probe_classes`` (a class-conditional target's workload: ``specvis bench`` passes the
   classes it will run) the probe batches take their rows from those classes instead, spread evenly
   over the list (image k of K probed has class ``probe_classes[k * N // K]``): candidates' order
   depends on the class, so a probe of one class can pick what is slower over the workload.
2. Cost curve: the seconds of one cached target / draft / drafter forward over n tokens, measured on
   this device at the call's batch size and CFG for every block size the probes used (at most
   ``MAX_SIZES`` of them, the rest interpolated): ``specvis.cost.CostProbe``.
3. Price: predicted time = sum over a run's forwards of the curve's cost of its block size
   (``cost.predicted_time``, the formula of the bench's ``predicted_speedup``), and
   predicted speedup = AR's predicted time / the candidate's.
4. Choose: among the close candidates (``margin`` defaults to 1.1), the one with the least
   wall-clock per image over its runs after the first (the first pays one-time costs), if it ran
   faster than the best predicted one beyond the probe's noise (``significantly_faster``: a
   one-sided 95% paired t-test on the runs' log wall-clock ratios, the same batches in both);
   otherwise the best predicted one: a few images' timing alone is noisier than the curve. It runs
   when that wall-clock is at most AR's over AR's runs after the first; otherwise, or when none
   passes the margin, AR runs. The curve leaves out each round's sampling, acceptance and
   bookkeeping (a method runs below its predicted speedup by what those cost), and on a
   launch-bound GPU every small operator of a round costs a kernel launch. The margin keeps
   borderline candidates out (and spares their timing when none passes it); the wall-clock against
   AR keeps out what the curve overrates. The runs that shaped each step are in
   docs/results/archive/goal.md ("Auto at batch 1", "Auto against AR's wall-clock", the AVX2 run).

Candidates (all with ``Exact`` acceptance, so lossless): ``SJD`` window 4, 8, 12, 16 (init
vertical-sample, Gumbel coupling: the CLI's default SJD, docs/results/archive/successors.md; window 12
because the best window depends on the CPU: docs/results/archive/goal.md); with a draft model ``Speculative``
gamma 2 and 4; with an EAGLE drafter ``EagleTree`` with 24 and 60 tree tokens and ``StaticTree`` (its
default topology). Continuous-token targets get AR (no lossless candidate).

The probe and curve figures are cached for the process per key: the target (held by a weak reference),
the draft model and the EAGLE drafter (weak references too, never ``id()``), the device, the dtypes,
captured rounds on or off, the batch size, the grid, the sampling, the probe classes, the margin and
the curve's repeats (a second call with the same key does not probe again). ``Calibration.explain()``
says what was chosen and each candidate's figures (``Generation.calibration`` of a pipeline call).
The user's generation runs after the choice with the user's seed, so its output equals the chosen
method's output for that seed. The calibration is not part of ``Stats.wall_s``
(``Stats.extra["auto_calibration_s"]`` is its cost on the call that paid it, 0 afterwards).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .cost import BLOCK_FIELDS, CostProbe, block_size_fields, predicted_time
from .generate import Generation, generate, generate_checked
from .methods.ar import AR
from .methods.auto import Auto
from .methods.sjd import SJD
from .methods.speculative import Speculative
from .methods.static_tree import StaticTree
from .methods.eagle import EagleTree
from .models.base import Condition
from .models.continuous import ContinuousAR
from .options import option_fields
from .registry import spec_of
from .sampling import Sampling

PROBE_SEED = 1_000_003
PROBE_IMAGES = 8  # images each close candidate is probed on: one image's acceptance can reorder candidates
# a few percent apart (docs/results/archive/goal.md, "On a Zen 5 EPYC")
CLOSE = 1.3  # candidates predicted within this factor of the best are probed on PROBE_IMAGES images: one
# image's predicted speedup moves by up to 13% over eight, so a tighter factor can leave the best out
MAX_SIZES = 12  # most block sizes measured per kind in the cost curve
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)  # one-sided 95% Student t, df 1..10
_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # target -> {key: figures}


def candidates(draft: bool, drafter: bool) -> list:
    """The lossless candidates for a target with (or without) a draft model and an EAGLE drafter."""
    out: list = []
    if draft:
        out += [Speculative(gamma=2), Speculative(gamma=4)]
    out += [SJD(window=w, init="vertical-sample", coupling="gumbel") for w in (4, 8, 12, 16)]
    if drafter:
        out += [EagleTree(depth=4, top_k=8, total_tokens=24), EagleTree(), StaticTree()]
    return out


FIGURES = ("label", "mean_accepted_length", "drafts_per_round", "predicted_speedup", "images", "wall_per_image_s",
           "measured_speedup")  # Auto.figures keys
KEY_FIELDS = ("gamma", "window", "depth", "top_k", "total_tokens", "tree")  # what tells candidates apart


def label(method) -> str:
    """``sjd(window=8)``: the method's name and its size options."""
    names = {info.name for info in option_fields(type(method))}
    shown = [f"{k}={getattr(method, k)}" for k in KEY_FIELDS if k in names]
    return f"{method.name}({', '.join(shown)})" if shown else method.name


def probe(model, conditions, method, sampling, draft=None, drafter=None, graphs=None, seed: int = PROBE_SEED):
    """Stats of one run of ``method`` on ``conditions`` with ``seed`` (samples discarded)."""
    return generate(model, conditions, method, sampling, seed, draft=draft, drafter=drafter, graphs=graphs).stats


def measure_curve(model, conditions, sampling, sizes: dict[str, list[int]], repeats: int, draft=None,
                  drafter=None) -> dict[str, list[dict]]:
    """The forward cost curve ({kind: [{"tokens", "median_s"}]}) at the call's batch and CFG."""
    p = CostProbe(sizes, repeats)
    generate(model, conditions, p, sampling, 0, draft=draft, drafter=drafter, graphs=False)
    return p.curve


def _subset(sizes: set[int]) -> list[int]:
    """At most ``MAX_SIZES`` of ``sizes``: all when few, else 1, the largest and a geometric spread."""
    s = sorted(sizes | {1})
    if len(s) <= MAX_SIZES:
        return s
    picks = {s[0], s[-1]}
    for i in range(MAX_SIZES - 2):
        target = math.exp(math.log(s[-1]) * (i + 1) / (MAX_SIZES - 1))
        picks.add(min(s, key=lambda n: abs(n - target)))
    return sorted(picks)


def _price(rows: list[dict], curve: dict, stream_len: int) -> None:
    """Each row's figures over its probe runs: predicted speedup = AR's predicted time for as many
    batches / the runs' (``bench.report.predicted_time``, every forward at the curve's mid-stream price:
    AR is not probed, so its live spans are unknown); mean accepted length weighted by forwards."""
    t_ar = predicted_time({"target_block_sizes": {"1": stream_len}}, curve)
    for r in rows:
        runs, forwards = r["runs"], sum(st.target_forwards for st in r["runs"])
        sizes = {k: v for k, v in block_size_fields(runs).items() if k in BLOCK_FIELDS}
        t = predicted_time({"draft_forwards": sum(st.draft_forwards for st in runs), **sizes}, curve)
        r["predicted_speedup"] = len(runs) * t_ar / t if t and t_ar else 0.0
        r["mean_accepted_length"] = sum(st.mean_accepted_length * st.target_forwards for st in runs) / max(forwards, 1)
        r["drafts_per_round"] = sum(st.draft_forwards for st in runs) / max(forwards, 1)


def significantly_faster(a: list[float], b: list[float]) -> bool:
    """Whether runs ``a`` took less wall-clock than the paired runs ``b`` (run j of each on the same
    batch) beyond their noise: with d_j = log(b_j / a_j) over n >= 2 pairs, mean(d) > t * sd(d) / sqrt(n),
    t the one-sided 95% Student t with n - 1 degrees of freedom (``T95``; 1.812 beyond 10)."""
    d = [math.log(y / x) for x, y in zip(a, b)]
    if len(d) < 2:
        return False
    t = T95[min(len(d) - 1, len(T95)) - 1]
    return statistics.fmean(d) > t * statistics.stdev(d) / math.sqrt(len(d))


def probe_rows(conditions, probe_classes: tuple[int, ...] | None, batch: int, j: int, total: int):
    """The conditions of probe batch ``j``: the call's own, or rows ``j * batch ..`` of ``total``
    probe images spread over ``probe_classes`` (image k has class ``probe_classes[k * N // total]``)."""
    if probe_classes is None:
        return conditions
    n = len(probe_classes)
    device = conditions.device if isinstance(conditions, torch.Tensor) else "cpu"
    return torch.tensor([probe_classes[k * n // total] for k in range(j * batch, (j + 1) * batch)], device=device)


def calibrate(model, conditions, sampling, draft=None, drafter=None, graphs=None, repeats: int = 5,
              margin: float = 1.0, probe_classes: tuple[int, ...] | None = None) -> dict:
    """Probe every candidate, measure the cost curve, and when the best is predicted at least
    ``margin`` times AR, time the close ones and AR on more images (module docstring):
    {"rows": [{"method", "label", "mean_accepted_length", "drafts_per_round", "predicted_speedup",
    "images"[, "wall_per_image_s", "measured_speedup"]}, ...], "curve": ..., "skipped": [...]
    [, "ar_wall_per_image_s"]}."""
    rows, skipped, sizes = [], [], {"target": {1}, "draft": set(), "drafter": set()}
    kw = dict(draft=draft, drafter=drafter, graphs=graphs)
    batch = Condition.of(model, conditions).batch
    runs = max(3, -(-PROBE_IMAGES // batch))  # probe batches of a timed candidate: the first pays one-time costs
    rows_of = lambda j: probe_rows(conditions, probe_classes, batch, j, runs * batch)
    for m in candidates(draft is not None, drafter is not None):
        try:
            st = probe(model, rows_of(0), m, sampling, **kw)
        except (ValueError, NotImplementedError) as e:  # a candidate this model cannot run
            skipped.append(f"{label(m)}: {e}")
            continue
        for kind, hist in st.block_sizes.items():
            sizes.setdefault(kind, set()).update(hist)
        rows.append({"method": m, "label": label(m), "runs": [st]})
    curve = measure_curve(model, conditions, sampling, {k: _subset(v) for k, v in sizes.items() if v}, repeats,
                          draft=draft if sizes["draft"] else None, drafter=drafter if sizes["drafter"] else None)
    stream_len = model.layout.stream_len
    _price(rows, curve, stream_len)
    best = max((r["predicted_speedup"] for r in rows), default=0.0)
    out = {"rows": rows, "curve": curve, "skipped": skipped}
    if best >= margin:  # something may run instead of AR: time it (and its close rivals) against AR itself
        close = [r for r in rows if r["predicted_speedup"] >= max(margin, best / CLOSE)]
        ar = {"method": AR(), "runs": []}
        ar["runs"].append(probe(model, rows_of(0), ar["method"], sampling, **kw))  # untimed, as the candidates' first
        for j in range(1, runs):  # round-robin: a slow spell of the machine slows every timed run alike
            for r in (close + [ar])[:: 1 if j % 2 else -1]:  # same block sizes as the first run: the curve covers them
                r["runs"].append(probe(model, rows_of(j), r["method"], sampling, seed=PROBE_SEED + j, **kw))
        _price(rows, curve, stream_len)
        per_image = lambda r: sum(st.wall_s for st in r["runs"][1:]) / ((runs - 1) * batch)  # every one-time cost paid
        out["ar_wall_per_image_s"] = per_image(ar)
        for r in close:
            r["wall_runs_s"] = [st.wall_s for st in r["runs"][1:]]
            r["wall_per_image_s"] = per_image(r)
            r["measured_speedup"] = out["ar_wall_per_image_s"] / r["wall_per_image_s"] if r["wall_per_image_s"] else 0.0
    for r in rows:
        r["images"] = len(r.pop("runs")) * batch
    return out


@dataclass(frozen=True)
class Calibration:
    """What ``choose`` found: the method ``chosen``, each candidate's probe ``figures`` ({"label",
    "mean_accepted_length", "drafts_per_round", "predicted_speedup", "images", and for the timed
    candidates "wall_per_image_s" and "measured_speedup", AR's wall-clock per image over theirs}), the
    ``seconds`` the call spent on it (0 when the choice was cached) and ``explain()``: one line saying what
    was chosen and why."""

    chosen: Any
    line: str
    figures: tuple = ()
    seconds: float = 0.0

    def explain(self) -> str:
        """One line: the method chosen and each candidate's probe figures (mean accepted length, draft
        forwards per round, predicted speedup over AR)."""
        return self.line


def _key(model, conditions, sampling, draft, drafter, graphs, probe_classes, margin: float, repeats: int) -> tuple:
    """Everything that changes the choice for one target: its draft model and drafter (weak references:
    a freed model's entry never matches again), device, dtypes, captured rounds, batch, grid,
    sampling, probe classes, margin and the curve's repeats."""
    device = next(model.parameters()).device
    ref = lambda m: None if m is None else weakref.ref(m)
    dtypes = tuple(None if m is None else next(m.parameters()).dtype for m in (model, draft, drafter))
    captured = device.type == "cuda" and graphs is not False
    layout = model.layout
    return (ref(draft), ref(drafter), str(device), dtypes, captured, Condition.of(model, conditions).batch,
            (layout.height, layout.width, layout.stream_len), repr(sampling), probe_classes, margin, repeats)


def choose(model, conditions, sampling: Sampling, *, draft=None, drafter=None, graphs: bool | None = None,
           probe_classes: tuple[int, ...] | None = None, margin: float = 1.1, repeats: int = 20):
    """``(method, Calibration)``: the lossless method to run for this call, calibrating on the first call
    for its key (``_key``); the module docstring gives the rule. ``probe_classes``: the classes to probe
    on (class-conditional targets), default the call's own conditions."""
    device = next(model.parameters()).device
    B = Condition.of(model, conditions).batch
    t0 = time.perf_counter()
    if isinstance(model, ContinuousAR):
        return AR(), Calibration(AR(), "auto: ar (continuous-token target: no lossless candidate)")
    pc = probe_classes
    if pc is not None:
        n = model.num_conditions
        if not isinstance(conditions, torch.Tensor) or n is None:
            raise ValueError("Auto.probe_classes applies to class-conditional targets only; this call gives prompts")
        if max(pc) >= n:
            raise ValueError(f"Auto.probe_classes: class {max(pc)} is out of range; the target has classes 0..{n - 1}")
    key = _key(model, conditions, sampling, draft, drafter, graphs, pc, margin, repeats)
    per_model = _CACHE.setdefault(model, {})
    fig = per_model.get(key)
    if fig is None:
        fig = per_model[key] = calibrate(model, conditions, sampling, draft, drafter, graphs, repeats, margin, pc)
    spent = time.perf_counter() - t0
    rows = fig["rows"]
    timed = [r for r in rows if "wall_per_image_s" in r]  # the close candidates that passed the margin
    best, rank = None, ""
    if timed:
        best = min(timed, key=lambda r: r["wall_per_image_s"])
        rank = ", the least of the close candidates" if len(timed) > 1 else ""
        by_curve = max(timed, key=lambda r: r["predicted_speedup"])
        if best is not by_curve and not significantly_faster(best["wall_runs_s"], by_curve["wall_runs_s"]):
            rank = (f", the best predicted of the close candidates ({best['label']} ran "
                    f"{1 - best['wall_per_image_s'] / by_curve['wall_per_image_s']:.1%} less wall-clock, within the probe's noise)")
            best = by_curve
    if best is None:
        pick, why = None, f"no candidate predicted >= {margin:g}x AR"
    elif best["measured_speedup"] < 1.0:
        pick, why = None, (f"{best['label']}, predicted {best['predicted_speedup']:.2f}x AR, ran "
                           f"{best['measured_speedup']:.2f}x AR's wall-clock in the probe")
    else:
        pick, why = best, (f"predicted {best['predicted_speedup']:.2f}x AR >= margin {margin:g}, ran "
                           f"{best['measured_speedup']:.2f}x AR's wall-clock in the probe{rank}")
    method = pick["method"] if pick else AR()
    assert method.lossless
    figs = "; ".join(f"{r['label']} mal {r['mean_accepted_length']:.2f} drafts/round {r['drafts_per_round']:.1f} "
                     f"pred {r['predicted_speedup']:.2f}x ({r['images']} image{'s' if r['images'] != 1 else ''}"
                     + (f", {r['wall_per_image_s']:.3f} s/image)" if "wall_per_image_s" in r else ")") for r in rows)
    ar_wall = f"; ar {fig['ar_wall_per_image_s']:.3f} s/image" if "ar_wall_per_image_s" in fig else ""
    skipped = f"; skipped {', '.join(fig['skipped'])}" if fig["skipped"] else ""
    line = (f"auto: {label(method)} ({why}; batch {B} on {device}; to run it without the probe: --method "
            f"{spec_of(method)}) | probe (mean accepted length, draft "
            f"forwards per round, predicted speedup over AR, images probed, wall-clock per image of the "
            f"timed runs): {figs}{ar_wall}{skipped}")
    return method, Calibration(method, line, tuple({k: r[k] for k in FIGURES if k in r} for r in rows), spent)


def resolve(method, model, conditions, sampling: Sampling, *, draft=None, drafter=None,
            graphs: bool | None = None) -> tuple[Any, Calibration | None]:
    """A call's method: ``method`` itself with no calibration, unless it is an ``Auto``, whose choice
    (``choose`` with its margin, repeats and probe classes) it returns with its ``Calibration``."""
    if not isinstance(method, Auto):
        return method, None
    return choose(model, conditions, sampling, draft=draft, drafter=drafter, graphs=graphs,
                  probe_classes=method.probe_classes, margin=method.margin, repeats=method.repeats)


def run(model, conditions, method, sampling: Sampling, seed: int, **kwargs) -> Generation:
    """``specvis.generate`` with ``method`` resolved first (``resolve``): the pipelines' call, its arguments
    checked by the pipeline (``generate.generate_checked``). An
    ``Auto``'s choice runs with the call's seed; ``Generation.calibration`` holds the choice and
    ``stats.extra["auto_calibration_s"]`` its cost on this call."""
    chosen, calibration = resolve(method, model, conditions, sampling, draft=kwargs.get("draft"),
                                  drafter=kwargs.get("drafter"), graphs=kwargs.get("graphs"))
    out = generate_checked(model, conditions, chosen, sampling, seed, **kwargs)
    if calibration is not None:
        out.calibration = calibration
        out.stats.extra["auto_calibration_s"] = calibration.seconds
    return out


def clear_cache() -> None:
    """Forget every cached calibration (the next Auto call probes again)."""
    _CACHE.clear()
