"""``Auto``: run the lossless method predicted fastest for this model, device, batch and sampling,
or plain AR when none is predicted faster ("never slower than AR").

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
   one image's acceptance can reorder candidates a few percent apart. (A bf16 goal run at batch 8
   timed SJD window 4 on one batch, after AR's untimed one, at 1.09x AR; it ran 0.98x AR in the run,
   and 0.94x over eight batches alternating with AR: a probe, not committed.)
   With ``probe_classes`` (a class-conditional target's workload: ``specvis bench`` passes the
   classes it will run) the probe batches take their rows from those classes instead, spread evenly
   over the list (image k of K probed has class ``probe_classes[k * N // K]``): candidates' order
   depends on the class (a fp32 goal run at batch 1 probed class 0 only, where SJD window 8 led
   window 16, and picked window 8 at 1.47x AR against window 16's 1.56x over 64 images of 11 classes).
2. Cost curve: the seconds of one cached target / draft / drafter forward over n tokens, measured on
   this device at the call's batch size and CFG for every block size the probes used (at most
   ``MAX_SIZES`` of them, the rest interpolated): ``specvis.bench.forward_cost``'s probe.
3. Price: predicted time = sum over a run's forwards of the curve's cost of its block size
   (``bench.report.predicted_time``, the formula of the bench's ``predicted_speedup``), and
   predicted speedup = AR's predicted time / the candidate's.
4. Choose: among the close candidates (``margin`` defaults to 1.1), the one with the least
   wall-clock per image over its runs after the first (the first pays one-time costs), if it ran
   faster than the best predicted one beyond the probe's noise (``significantly_faster``: a
   one-sided 95% paired t-test on the runs' log wall-clock ratios, the same batches in both);
   otherwise the best predicted one. (A fp32 goal run at batch 1 on an AVX2 EPYC timed SJD window 8
   2% faster than window 16 over seven images, against the curve's 6% the other way, and ran 1.45x
   AR against window 16's 1.63x over 64 images.) It runs when
   that wall-clock is at most AR's over AR's runs after the first; otherwise, or when none passes
   the margin, AR runs. The curve leaves out each round's sampling, acceptance and bookkeeping: on
   the emoji target SJD windows 8 and 16 are 3.7% apart on the curve and 7% in wall-clock (fp32,
   batch 1); SJD and Speculative run at 0.87-1.00 of their predicted speedup in the goal runs (the
   chain tree 0.75-0.96), so with margin 1.05 a bf16 run at batch 8 picked SJD window 4, predicted
   1.06x, and ran 0.96x AR; and on a launch-bound GPU every small operator of a round costs a
   kernel launch. The margin keeps borderline candidates out (and spares their timing when none
   passes it); the wall-clock against AR keeps out what the curve overrates.

Candidates (all with ``Exact`` acceptance, so lossless): ``SJD`` window 4, 8, 12, 16 (init
vertical-sample, Gumbel coupling: the CLI's default SJD, 3.34 tokens per forward at window 16 and
batch 1 on the emoji target, docs/benchmarks/successors.md; window 12 because on a Zen 5 EPYC it ran
1.55x AR and window 16 1.45x in a probe of ten images at batch 1, in fp32, and 1.42x and 1.43x over
the 64 images of the goal run, docs/benchmarks/goal.md); with a draft model ``Speculative``
gamma 2 and 4; with an EAGLE drafter ``EagleTree`` with 24 and 60 tree tokens and ``StaticTree`` (its
default topology). Continuous-token targets get AR (no lossless candidate).

The probe and curve figures are cached per key for the process (a second call with the same key does
not probe again); ``Auto.explain()`` says what was chosen and each candidate's figures. The user's
generation runs after the choice with the user's seed, so its output equals the chosen method's output
for that seed. The calibration is not part of ``Stats.wall_s`` (``Stats.extra["auto_calibration_s"]``
is its cost on the call that paid it, 0 afterwards).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Any

PROBE_SEED = 1_000_003
PROBE_IMAGES = 8  # images each close candidate is probed on (a bf16 goal run at batch 1 picked SJD window 8
# over window 16, predicted 8% apart over 64 images, from one image's acceptance)
CLOSE = 1.3  # candidates predicted within this factor of the best are probed on PROBE_IMAGES images. One
# image's figure is noisy: in a calibration at batch 1 SJD window 16's fell from 2.11x on the first image
# to 1.84x over eight; with 1.15 a fp32 goal run's first image left window 12 out (it ran 1.65x AR over
# 64 images) and auto ran window 8 (1.57x) against window 16's 1.67x
MAX_SIZES = 12  # most block sizes measured per kind in the cost curve
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)  # one-sided 95% Student t, df 1..10
_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # target -> {key: figures}


def candidates(draft: bool, drafter: bool) -> list:
    """The lossless candidates for a target with (or without) a draft model and an EAGLE drafter."""
    from .eagle import EagleTree
    from .sjd import SJD
    from .speculative import Speculative
    from .static_tree import StaticTree

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
    shown = [f"{k}={getattr(method, k)}" for k in KEY_FIELDS if hasattr(method, k)]
    return f"{method.name}({', '.join(shown)})" if shown else method.name


def probe(model, conditions, method, sampling, draft=None, drafter=None, graphs=None, seed: int = PROBE_SEED):
    """Stats of one run of ``method`` on ``conditions`` with ``seed`` (samples discarded)."""
    from ..generate import generate

    return generate(model, conditions, method, sampling, seed, draft=draft, drafter=drafter, graphs=graphs).stats


def measure_curve(model, conditions, sampling, sizes: dict[str, list[int]], repeats: int, draft=None,
                  drafter=None) -> dict[str, list[dict]]:
    """The forward cost curve ({kind: [{"tokens", "median_s"}]}) at the call's batch and CFG."""
    from ..bench.forward_cost import _Probe
    from ..generate import generate

    p = _Probe(sizes, repeats)
    generate(model, conditions, p, sampling, 0, draft=draft, drafter=drafter, graphs=False)
    return p.curve


def _subset(sizes: set[int]) -> list[int]:
    """At most ``MAX_SIZES`` of ``sizes``: all when few, else 1, the largest and a geometric spread."""
    s = sorted(sizes | {1})
    if len(s) <= MAX_SIZES:
        return s
    import math

    picks = {s[0], s[-1]}
    for i in range(MAX_SIZES - 2):
        target = math.exp(math.log(s[-1]) * (i + 1) / (MAX_SIZES - 1))
        picks.add(min(s, key=lambda n: abs(n - target)))
    return sorted(picks)


def _price(rows: list[dict], curve: dict, stream_len: int) -> None:
    """Each row's figures over its probe runs: predicted speedup = AR's predicted time for as many
    batches / the runs' (``bench.report.predicted_time``, every forward at the curve's mid-stream price:
    AR is not probed, so its live spans are unknown); mean accepted length weighted by forwards."""
    from ..bench.report import BLOCK_FIELDS, block_size_fields, predicted_time

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
    import torch

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
    from ..models.base import Condition
    from .ar import AR

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
class Auto:
    """The lossless method predicted fastest here, or AR (module docstring: the rule). ``margin``:
    the predicted speedup over AR a candidate needs (>= 1; it must also run no slower than AR in the
    timed probe); ``repeats``: timed repeats per cost-curve
    point. After a call, ``chosen`` is the method that ran, ``figures`` each candidate's probe figures
    ({"label", "mean_accepted_length", "drafts_per_round", "predicted_speedup", "images", and for the timed
    candidates "wall_per_image_s" and "measured_speedup", AR's wall-clock per image over theirs}) and ``explain()``
    (also ``choice``) says in one line what was chosen and why. ``probe_classes``: the classes to probe
    on (class-conditional targets), default the call's own conditions."""

    margin: float = 1.1  # about 1 / the least efficiency of SJD and Speculative (0.87-1.00): module docstring
    repeats: int = 20  # 5 let the curve's noise reorder SJD windows 8 and 16 (3-5% apart) on the emoji target
    probe_classes: tuple[int, ...] | None = None
    name = "auto"
    lossless = True
    acceptance = None

    def __post_init__(self) -> None:
        if not isinstance(self.margin, (int, float)) or isinstance(self.margin, bool) or not self.margin >= 1.0:
            raise ValueError(f"Auto.margin must be a number >= 1 (the predicted speedup over AR a method needs), got {self.margin!r}")
        if not isinstance(self.repeats, int) or isinstance(self.repeats, bool) or self.repeats < 1:
            raise ValueError(f"Auto.repeats must be an integer >= 1, got {self.repeats!r}")
        pc = self.probe_classes
        if isinstance(pc, list):
            pc = tuple(pc)
        if pc is not None and not (isinstance(pc, tuple) and pc and all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in pc)):
            raise ValueError(f"Auto.probe_classes must be a non-empty list of class ids >= 0 (e.g. 0/3/5), got {self.probe_classes!r}")
        object.__setattr__(self, "probe_classes", pc)
        object.__setattr__(self, "chosen", None)
        object.__setattr__(self, "figures", [])
        object.__setattr__(self, "calibration_s", 0.0)
        object.__setattr__(self, "choice", "auto: no choice yet (it is made on the first call)")

    pad = 1  # never decodes itself: specvis.generate runs the method ``resolve`` returns

    def decode(self, ctx) -> None:
        raise ValueError("Auto is resolved by specvis.generate before decoding (Auto.resolve)")

    def explain(self) -> str:
        """One line: the method chosen and each candidate's probe figures (mean accepted length, draft
        forwards per round, predicted speedup over AR)."""
        return self.choice

    def resolve(self, model, conditions, sampling, draft=None, drafter=None, graphs=None):
        """The method to run for this call (calibrating on the first call for its key)."""
        import torch

        from ..models.base import Condition
        from ..registry import spec_of
        from .ar import AR

        device = next(model.parameters()).device
        B = Condition.of(model, conditions).batch
        t0 = time.perf_counter()
        if getattr(model, "token_dim", None) is not None:
            return self._set(AR(), "auto: ar (continuous-token target: no lossless candidate)", 0.0)
        pc = self.probe_classes
        if pc is not None:
            n = getattr(model, "num_conditions", None)
            if not isinstance(conditions, torch.Tensor) or n is None:
                raise ValueError("Auto.probe_classes applies to class-conditional targets only; this call gives prompts")
            if max(pc) >= n:
                raise ValueError(f"Auto.probe_classes: class {max(pc)} is out of range; the target has classes 0..{n - 1}")
        layout = model.layout
        key = (id(draft), id(drafter), str(device), B, (layout.height, layout.width, layout.stream_len), repr(sampling),
               pc, self.margin)
        per_model = _CACHE.setdefault(model, {})
        fig = per_model.get(key)
        if fig is None:
            fig = per_model[key] = calibrate(model, conditions, sampling, draft, drafter, graphs, self.repeats,
                                             self.margin, pc)
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
            pick, why = None, f"no candidate predicted >= {self.margin:g}x AR"
        elif best["measured_speedup"] < 1.0:
            pick, why = None, (f"{best['label']}, predicted {best['predicted_speedup']:.2f}x AR, ran "
                               f"{best['measured_speedup']:.2f}x AR's wall-clock in the probe")
        else:
            pick, why = best, (f"predicted {best['predicted_speedup']:.2f}x AR >= margin {self.margin:g}, ran "
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
        return self._set(method, line, spent, [{k: r[k] for k in FIGURES if k in r} for r in rows])

    def _set(self, method, line: str, spent: float, figures: list | None = None):
        object.__setattr__(self, "figures", figures or [])
        object.__setattr__(self, "chosen", method)
        object.__setattr__(self, "choice", line)
        object.__setattr__(self, "calibration_s", spent)
        return method


def clear_cache() -> None:
    """Forget every cached calibration (the next Auto call probes again)."""
    _CACHE.clear()
