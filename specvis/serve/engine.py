"""One engine per served model: it owns the model and runs decodes in one worker thread.

Requests wait in one FIFO queue of images (a request of ``n`` images is n entries). A decode takes the
images at the head of the queue that share one key (method, sampling, grid) into its rows, up to
``max_batch``; at every round boundary a free row takes the next waiting image of that key
(``rows.LiveRows``), and a finished row answers its image at once. Nobody is overtaken: a decode only
takes from the head of the queue, so when the head needs another key (or more images wait than a
decode smaller than ``max_batch`` has free rows) the decode stops admitting, drains and the next one
starts with the head. With nothing waiting the worker blocks on a condition variable (no spinning).

The law: each image is drawn from the target's law given its condition (every method served restarts
rows exactly: ``methods/slots.py``). The server samples under keyed noise (``request.parse``): row r races the
noise of its image's seed (request seed + k) alone, so under AR or a method verifying by
``accept.Coupled`` the image is a function of its seed, whatever else is decoding.

A decode smaller than its key allows that drains while its rows are young gives them back to the head
of the queue (``_preempt``, ``young_turns``: exact, the choice reads no token). A job whose rows do not
fit the device's free memory is refused before it starts, and a decode holds no more rows than fit
(``decode_plan``).

``method="auto"``: at start (whatever the server's method) the engine times ``AUTO_CANDIDATES`` on
decodes of 1, 2, 4, ..., ``max_batch`` rows, each row count over at least ``calibration_images`` images
and the candidates in turn (the cost model: seconds per image by rows). An auto decode
of R rows runs, throughout, the candidate with the least seconds per image at the measured row count
nearest (in log) to R. Not by the rows holding images: every round's forward computes all R rows of
the static cache, idle ones included, so a round of any method costs what it costs at R rows, and the
candidate fastest at R stays fastest whatever number of its rows hold images (each method's tokens per
round scale with them alike). Exact: each image is one decode of one lossless method.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..generate import bind_rule, fit_to_stream, keyed_method
from ..methods.base import DecodeContext
from ..models.base import Condition, Prompts
from ..memory import MemoryPlanError
from ..options import Options
from ..families.kv_cache import condition_width
from ..job import Job
from ..registry import method_from_spec, refilling_methods, spec_of
from ..sampling import Sampling, make_generator
from ..methods.views import guided_view
from .metrics import ServeMetrics
from .rows import LiveRows, joined

AUTO_CANDIDATES = ("ar", "sjd", "sjd:init=vertical-sample")  # the methods of auto's cost model
PREEMPT_SHARE = 8  # a draining decode gives its rows back if they started at most stream_len / 8 turns ago
BUDGET = 100_000  # samples one decode may admit after its first rows (bounds its no-progress check)
CALIBRATION_IMAGES = 4  # default images each row count of the cost model is timed on (``Engine._measure``)
MAX_CALIBRATION_IMAGES = 64


class QueueFull(Exception):
    """The queue holds ``max_queue`` images: the request is refused (HTTP 429)."""


class Draining(Exception):
    """The engine is shutting down and admits nothing (HTTP 503)."""


@dataclass(frozen=True)
class Key:
    """What images must share to share a decode."""

    method: str  # a method spec, or "auto"
    sampling: Sampling
    grid: tuple[int, int]


@dataclass
class Ticket:
    """One request in the engine: ``n`` images of one prompt (a class id for class-conditional models) under
    ``key``, with what the engine tracks of it. ``sink(event)`` receives, from the engine thread:
    ("partial", k, tokens, committed), ("image", k, tokens, info) and ("error", status, message)."""

    prompt: Any  # class id (int) or prompt text
    n: int
    seed: int
    key: Key
    sink: Callable[[tuple], None]
    negative_prompt: str | None = None
    partial_images: int = 0
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    condition: Condition | None = None  # built on the engine thread (prompt encoding needs the grid)
    failed: bool = False
    left: int = 0
    quiet: bool = False  # the engine's own timing decodes: no metrics

    @classmethod
    def of(cls, job: Job, grid: tuple[int, int], sink: Callable[[tuple], None],
           partial_images: int = 0) -> "Ticket":
        """The engine's ticket for a request's ``Job`` (``serve.request.parse``; its seed drawn if it had none):
        one prompt or class, ``job.num`` images from ``job.seed``, its method, sampling and ``grid``."""
        prompt = job.prompts[0] if job.prompts is not None else job.classes[0]
        negative = job.negative_prompts[0] if job.negative_prompts else None
        return cls(prompt, job.num, job.seed, Key(job.method, job.sampling, grid), sink, negative_prompt=negative,
                   partial_images=partial_images)

    def cancel(self) -> None:
        """Stop the job: its waiting images are dropped, its rows freed at the next round boundary."""
        self.cancelled = True


@dataclass
class Image:
    """Image ``index`` of a job: the sample a row holds (``rows.Sample``)."""

    job: Ticket
    index: int
    engine: "Engine"
    started_at: float = 0.0
    marks: list[int] = field(default_factory=list)  # committed-token counts at which a partial image is due
    method: str = ""
    preempted: bool = False  # its row gave it back once (``LiveRows.preempt``): it starts again

    @property
    def condition(self) -> Condition:
        return self.job.condition[self.index: self.index + 1]

    @property
    def seed(self) -> int:
        return self.job.seed + self.index

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled or self.job.failed

    @property
    def wants_partials(self) -> bool:
        return bool(self.marks)

    def started(self) -> None:
        """Its row took it (the engine's grid is the job's now: the partial images' marks are set on it)."""
        self.started_at = time.perf_counter()
        self.marks = partial_marks(self.job.partial_images, self.engine.model.layout.stream_len)
        self.engine._started(self)

    def partial_due(self, committed: int) -> bool:
        return bool(self.marks) and committed >= self.marks[0]

    def partial(self, tokens: torch.Tensor, committed: int) -> None:
        while self.marks and committed >= self.marks[0]:
            self.marks.pop(0)
        codes, shown = self.engine.image_codes(tokens, committed)
        self.job.sink(("partial", self.index, codes, shown))

    def finished(self, tokens: torch.Tensor, forwards: int) -> None:
        self.engine._finished(self, tokens, forwards)


class Engine:
    """The served model's engine: ``submit(job)`` from any thread; ``start()`` loads nothing (the
    pipeline is given loaded) but warms up (one decode) and, for ``method="auto"``, measures the cost
    model; ``ready`` is set after that; ``close(grace)`` stops admitting, lets the work finish for up to
    ``grace`` seconds, then answers what is left with an error."""

    def __init__(self, pipe, *, max_batch: int = 8, max_queue: int = 256, method: str = "auto",
                 calibration_images: int = CALIBRATION_IMAGES, calibration_seed: int = 0) -> None:
        self.pipe, self.model = pipe, pipe.target
        self.max_batch, self.max_queue, self.method = max_batch, max_queue, method
        self.metrics = ServeMetrics()
        self.native = (self.model.layout.height, self.model.layout.width)
        self.costs: dict[str, dict[int, float]] = {}  # auto's cost model: method -> rows -> seconds per image
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._waiting: collections.deque[Image] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False  # admits nothing more
        self._stopping = False  # worker exits when idle
        self._busy = False  # a decode is being set up or running
        self._demand, self._peak = 1, 0  # images in the system at most during the last decode, during this one
        self._cap = max_batch  # the most rows the running decode's key may hold (``_rows_that_fit``)
        self._auto_method: str | None = None  # the candidate the running auto decode runs
        self._young = 0  # the running decode's rows started at most this many turns ago may be given back
        self.calibration_images, self._calibration_seed = calibration_images, calibration_seed
        self._thread = threading.Thread(target=self._run, name="specvis-engine", daemon=True)

    # ------------------------------------------------------------------ front side (any thread)
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Ticket) -> None:
        """Queue the job's images (FIFO); ``QueueFull`` or ``Draining`` when refused."""
        with self._cv:
            if self._closing:
                self.metrics.rejected.labels("shutting_down").inc()
                raise Draining("the server is shutting down")
            if len(self._waiting) + job.n > self.max_queue:
                self.metrics.rejected.labels("queue_full").inc()
                raise QueueFull(f"the queue is full ({len(self._waiting)} of {self.max_queue} images waiting)")
            job.left = job.n
            for k in range(job.n):
                self._waiting.append(Image(job, k, self))
            self.metrics.queue_depth.set(len(self._waiting))
            self._cv.notify()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        """The worker thread runs (it stops after ``close`` or a failed warm-up)."""
        return self._thread.is_alive()

    @property
    def idle(self) -> bool:
        """Nothing waits and no decode runs."""
        with self._cv:
            return not self._waiting and not self._busy

    def close(self, grace: float) -> None:
        """Stop admitting; wait up to ``grace`` seconds for every accepted image; then answer the rest
        with an error (503) and stop the worker."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        deadline = time.monotonic() + grace
        with self._cv:
            while (self._waiting or self._busy) and time.monotonic() < deadline and self._thread.is_alive():
                self._cv.wait(timeout=0.05)
            left = list(self._waiting)
            self._waiting.clear()
            self._stopping = True
            self._cv.notify_all()
        for image in left:
            self._fail(image.job, 503, "the server shut down before this image started")
        if self._busy:  # rows still decoding past the grace: their jobs get an error at the next round
            self._abort = True
        if self._thread.is_alive():
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 5.0)

    # ------------------------------------------------------------------ engine thread
    _abort = False
    _live: LiveRows | None = None

    def _run(self) -> None:
        try:
            self._warm_up()
        except BaseException as e:  # the app reports it on /health and refuses to serve
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._waiting:
                    return
                self._busy = True
            first: list[Image] = []
            try:
                first = self._take(None, self.max_batch, held=0)
                if first:
                    self._decode(first)
            except Exception as e:  # a decode that fails answers each of its jobs, and the engine goes on
                held = [] if self._live is None else [s for s in self._live.owner if s is not None]
                for image in first + held:
                    self._fail(image.job, 503 if self._abort else 500, f"decoding failed: {e}")
            finally:
                with self._cv:
                    self._busy, self._live = False, None
                    self.metrics.rows_in_flight.set(0)
                    self._cv.notify_all()

    def _warm_up(self) -> None:
        """Auto's cost model, measured whatever the server's method (a request may ask for ``auto``
        on a pinned server), and one decode of the server's method if it is none of auto's."""
        sampling = dataclasses.replace(self.pipe.default_sampling, noise="keyed")
        self.costs = self._measure(sampling)
        if self.method != "auto" and self.method not in self.costs:
            self._time_decode(self.method, 1, sampling, self._calibration_seed)

    def _measure(self, sampling: Sampling) -> dict[str, dict[int, float]]:
        """Seconds per image of each of ``AUTO_CANDIDATES`` at 1, 2, 4, ..., ``max_batch`` rows of the
        default prompt: ceil(``calibration_images`` / rows) decodes of new seeds each, the candidates in
        turn on the same seeds. One image misleads: at one row on the embedded models, vertical-sample
        SJD is 5-7% faster than random-init SJD on average, yet slower on about one seed in five."""
        rows = sorted({min(2 ** i, self.max_batch) for i in range(int(math.log2(self.max_batch)) + 1)} | {self.max_batch})
        warm: set[str] = set()
        for spec in AUTO_CANDIDATES:  # untimed: one-time costs (shared by one method's variants)
            if spec.split(":")[0] not in warm:
                self._time_decode(spec, 1, sampling, self._calibration_seed)
                warm.add(spec.split(":")[0])
        costs: dict[str, dict[int, float]] = {spec: {} for spec in AUTO_CANDIDATES}
        for r in rows:
            decodes = math.ceil(self.calibration_images / r)
            seconds = dict.fromkeys(AUTO_CANDIDATES, 0.0)
            for d in range(decodes):
                for spec in AUTO_CANDIDATES:
                    seconds[spec] += self._time_decode(spec, r, sampling, self._calibration_seed + d * r)
            for spec in AUTO_CANDIDATES:
                costs[spec][r] = seconds[spec] / (decodes * r)
        return costs

    def _time_decode(self, spec: str, rows: int, sampling: Sampling, seed: int) -> float:
        """Seconds of one decode of ``rows`` images of the default condition, seeds ``seed`` on (thrown away)."""
        job = Ticket(self.default_prompt(), rows, seed, Key(spec, sampling, self.native), lambda e: None, quiet=True)
        job.left = rows
        images = [Image(job, k, self) for k in range(rows)]
        self._build(job)
        t0 = time.perf_counter()
        self._decode(images, quiet=True)
        return time.perf_counter() - t0

    def default_prompt(self) -> Any:
        return 0 if self.pipe.conditioning == "class" else "a smiling face"

    def choose(self, rows: int) -> str:
        """Auto's method for a decode of ``rows`` rows: least measured seconds per image at the measured
        row count nearest in log to ``rows``, among the cost model's candidates."""
        if not self.costs:
            raise RuntimeError("auto's cost model is measured at start: the engine has not warmed up")

        def at(table: dict[int, float]) -> float:
            r = min(table, key=lambda m: (abs(math.log(m) - math.log(rows)), m))
            return table[r]
        return min(self.costs, key=lambda spec: at(self.costs[spec]))

    def _take(self, key: Key | None, room: int, held: int) -> list[Image]:
        """Up to ``room`` images from the head of the queue that share ``key`` (None: the head's),
        their conditions built; [] to drain the decode (the head needs another key, or a decode of
        fewer rows than its key may hold has fewer free rows than waiting images of that key: then
        rows that started lately are given back, ``_preempt``)."""
        out: list[Image] = []
        while True:
            with self._cv:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                    self.metrics.queue_depth.set(len(self._waiting))
                if self._abort or (self._stopping and key is not None) or not self._waiting:
                    break
                head = self._waiting[0]
                if key is None:
                    key = head.job.key
                    self._set_grid(key.grid)
                    self._cap = self._rows_that_fit(key)
                    room = min(room, self._cap)
                if head.job.key != key:
                    break
                if held and not out and held + room < self._cap:
                    same = 0
                    for image in self._waiting:
                        if image.job.key != key or same > room:
                            break
                        same += 1
                    if same > room:  # drain: a larger decode will take them together
                        self._preempt()
                        break
                if len(out) >= room:
                    break
                self._waiting.popleft()
                self.metrics.queue_depth.set(len(self._waiting))
            job = head.job
            if job.condition is None and not self._build_or_fail(job, key):
                continue
            out.append(head)
        return out

    def _preempt(self) -> None:
        """A draining decode whose rows all started lately (``young_turns``) gives them back to the
        head of the queue (FIFO order kept): the larger decode that follows starts them again with the
        images waiting, instead of those waiting until these rows finish. Streams asking for partial
        images keep their rows (a partial image already sent stays true)."""
        live = self._live
        if live is None or any(s is not None and s.job.partial_images for s in live.owner):
            return
        back = live.preempt(self._young)
        for image in sorted(back, key=lambda im: (im.job.arrived, id(im.job), im.index), reverse=True):
            image.preempted = True
            self._waiting.appendleft(image)
        if back:
            self.metrics.queue_depth.set(len(self._waiting))

    def _build_or_fail(self, job: Ticket, key: Key) -> bool:
        try:
            self._set_grid(key.grid)
            self._build(job)
            self._check_memory(job, key)
            return True
        except ValueError as e:
            self._fail(job, 400, str(e).splitlines()[0])
            return False

    def _check_memory(self, job: Ticket, key: Key) -> None:
        """A job whose rows (``n`` up to ``max_batch``, CFG partners, prompt width, method slots) do
        not fit the device's free memory now is refused before it starts (``MemoryPlanError``, one line)."""
        plan = decode_plan(self.pipe, key.method, key.sampling, min(job.n, self.max_batch),
                           condition_width(job.condition, self.model))
        if not plan.fits:
            raise MemoryPlanError(f"this request does not fit the server's memory: {plan.line()}")

    def _rows_that_fit(self, key: Key) -> int:
        """The most rows a decode of ``key`` may hold: ``max_batch``, or fewer if the device's free
        memory now holds fewer (at least 1: a job that did not fit one row was refused)."""
        plan = decode_plan(self.pipe, key.method, key.sampling, self.max_batch)
        return self.max_batch if plan.fits or plan.max_batch_size is None else max(1, plan.max_batch_size)

    def _build(self, job: Ticket) -> None:
        """The job's condition (n rows, both CFG halves) on the engine's device, on the current grid."""
        pipe, n, dev = self.pipe, job.n, self.pipe.device
        if pipe.conditioning == "class":
            ids = torch.full((n,), int(job.prompt), dtype=torch.long, device=dev)
            job.condition = Condition(ids, torch.full_like(ids, self.model.null_condition))
        else:
            negative = None if job.negative_prompt is None else [job.negative_prompt] * n
            job.condition = pipe.conditions([job.prompt] * n, negative, job.key.sampling, *job.key.grid)

    def _set_grid(self, grid: tuple[int, int]) -> None:
        L = self.model.layout
        if (L.height, L.width) != tuple(grid):
            self.pipe.set_grid(*grid)

    def _resolve(self, spec: str, sampling: Sampling, rows: int):
        """The decode's method and its spec: the request's; for ``auto``, the cost model's choice at the
        decode's ``rows`` (``choose``)."""
        self._auto_method = self.choose(rows) if spec == "auto" else None
        spec = self._auto_method or spec
        return keyed_method(fit_to_stream(method_from_spec(spec), self.model.layout.stream_len), sampling), spec

    def _decode(self, first: list[Image], quiet: bool = False) -> None:
        """One decode of ``first`` and what it admits. Its rows: the images taken, or as many as the
        last decode saw in the system at most (waiting or decoding; up to ``max_batch``), the rest
        free for the next arrivals: under a steady load the rows match it, instead of a decode of
        one row making the next request wait for it to end."""
        key = first[0].job.key
        self._set_grid(key.grid)
        rows = len(first) if quiet else min(self._cap, max(len(first), self._demand))
        self._peak = 0
        method, name = self._resolve(key.method, key.sampling, rows)
        self._young = young_turns(self.model.layout.stream_len, method.pad)
        label = "auto" if key.method == "auto" else spec_of(method)
        for image in first:
            image.method = label
        codebook = self.pipe.codebook if method.acceptance is not None and "codebook" in method.acceptance.needs else None
        graphs = self.pipe.device.type == "cuda" if self.pipe.graphs is None else self.pipe.graphs
        source = (lambda room, held: []) if quiet else (lambda room, held: self._admit(key, label, room, held))
        if not quiet:
            self.metrics.decodes.labels(name).inc()
            for image in first:
                image.started()

        held: list[Image | None] = list(first) + [None] * (rows - len(first))

        def live(ctx) -> LiveRows:
            self._live = LiveRows(ctx, held, source, BUDGET, on_round=None if quiet else self._round)
            return self._live

        decode_live(self.model, held, method, key.sampling, first[0].job.seed, live, codebook=codebook, graphs=graphs)
        if not quiet:
            self._demand = max(1, self._peak)

    def _admit(self, key: Key, label: str, room: int, held: int) -> list[Image]:
        """Images for ``room`` free rows of a running decode of ``key`` (they run its method, ``label``);
        called at every round boundary: with nothing waiting it returns at once (no lock: an arrival it
        misses is seen at the next boundary)."""
        if not self._waiting:
            return []
        images = self._take(key, room, held)
        for image in images:
            image.method = label
        return images

    def _round(self, held: int) -> None:
        self.metrics.rows_per_round.observe(held)
        if self._auto_method is not None:
            self.metrics.rounds.labels(self._auto_method).inc()
        self.metrics.rows_in_flight.set(held)
        with self._cv:
            self._peak = max(self._peak, held + len(self._waiting))
            if self._abort:
                raise RuntimeError("the server shut down before this image finished")

    def _started(self, image: Image) -> None:
        if not image.preempted:  # its first start only
            self.metrics.queued.observe(image.started_at - image.job.arrived)

    def _finished(self, image: Image, tokens: torch.Tensor, forwards: int) -> None:
        job = image.job
        if job.cancelled or job.failed or job.quiet:
            return
        now = time.perf_counter()
        codes, _ = self.image_codes(tokens, len(tokens))
        N = self.model.layout.num_tokens
        info = {"seed": job.seed + image.index, "method": image.method, "target_forwards": forwards,
                "mean_accepted_length": N / max(forwards, 1), "queued_s": image.started_at - job.arrived,
                "decode_s": now - image.started_at}
        m = self.metrics
        m.images.inc()
        m.tokens.inc(N)
        m.forwards.inc(forwards)
        m.accepted.observe(N / max(forwards, 1))
        job.left -= 1
        if job.left == 0:
            m.latency.observe(now - job.arrived)
        job.sink(("image", image.index, codes, info))

    def image_codes(self, tokens: torch.Tensor, committed: int) -> tuple[torch.Tensor, int]:
        """The image codes of a row's stream tokens (structural ids removed) and how many of them are
        among the first ``committed`` stream positions."""
        layout = self.model.layout
        if not layout.row_end:
            return tokens, committed
        index = layout.image_index(tokens.device)
        return tokens[index], int((index < committed).sum())

    def _fail(self, job: Ticket, status: int, message: str) -> None:
        if job.failed:
            return
        job.failed = True
        job.sink(("error", status, message))


def decode_live(model, first: list, method, sampling: Sampling, seed: int, live: Callable[[Any], LiveRows], *,
                codebook: torch.Tensor | None = None, graphs: bool = False) -> None:
    """Decode with ``method`` until no row holds a sample: the rows start with the samples ``first``
    (``rows.Sample``; None: a free row), ``live(ctx)`` gives the ``LiveRows`` that admit more at each round boundary. As
    ``specvis.generate`` sets a decode up (the method's fields fitted to the stream, its rule bound),
    with the first prompts padded to the longest prefix the model takes."""
    method = keyed_method(fit_to_stream(method, model.layout.stream_len), sampling)
    rule = bind_rule(method.acceptance, codebook, model)
    keep_soft = sampling.greedy and rule is not None and "soft" in rule.needs
    spare = next(sample for sample in first if sample is not None)  # what a free row decodes (thrown away)
    condition = padded(joined([(spare if s is None else s).condition for s in first]), model)
    seeds = [(spare if s is None else s).seed for s in first] if sampling.keyed else None
    target = guided_view(model, condition, sampling, method.pad, keep_soft=keep_soft)
    device = next(model.parameters()).device
    ctx = DecodeContext(target, make_generator(seed, device), method.pad, rule=rule, graphs=graphs, seeds=seeds,
                        coupled=rule is not None and "noise" in method.acceptance.needs)
    ctx.queue = live(ctx)
    with torch.inference_mode():
        method.decode(ctx)


def young_turns(stream_len: int, pad: int) -> int:
    """The most turns since a row started at which its sample may be given back (``LiveRows.preempt``):
    ``stream_len / PREEMPT_SHARE``, and fewer than any sample needs to finish (a round commits at most
    ``pad`` tokens: a row holds its first token and, after t rounds, at most 1 + t * pad). So no sample
    can have finished by then, and the choice to start a sample again depends on no token of its own:
    exact under any noise."""
    return max(0, min(stream_len // PREEMPT_SHARE, -(-(stream_len - 1) // pad) - 1))


def decode_plan(pipe, spec: str, sampling: Sampling, rows: int, prompt_tokens: int | None = None):
    """The memory plan (``pipe.memory``) of a decode of ``rows`` rows of method ``spec`` on the current
    grid, continuous batching, its prompts padded as ``padded`` pads them; ``auto`` is planned with the
    largest slots of its candidates (the start-up cost model runs each of them)."""
    model = pipe.target
    specs = AUTO_CANDIDATES if spec == "auto" else (spec,)
    with warnings.catch_warnings():  # the decode says what it clamps; the plan is of the clamped method
        warnings.simplefilter("ignore")
        methods = [fit_to_stream(method_from_spec(s), model.layout.stream_len) for s in specs]
    method = max(methods, key=lambda m: m.pad)
    width = max(int(model.max_prefix), prompt_tokens or 0)
    return pipe.memory(rows, method, sampling, prompt_tokens=width, refill=True)


def partial_marks(count: int, stream_len: int) -> list[int]:
    """Committed-token counts at which the ``count`` partial images are due: evenly spaced in the stream."""
    return [max(1, stream_len * (k + 1) // (count + 1)) for k in range(count)]


def padded(condition: Condition, model) -> Condition:
    """A decode's first rows with their prompts padded to the longest prefix the model takes, so that
    every later prompt fits the cache (``load_prefixes``); padding is never attended."""
    def pad(rows):
        if not isinstance(rows, Prompts):
            return rows
        width = max(int(model.max_prefix), rows.ids.shape[1])
        return Prompts(torch.nn.functional.pad(rows.ids, (0, width - rows.ids.shape[1])), rows.lengths)
    return Condition(pad(condition.cond), pad(condition.uncond))


def served_method(spec: str) -> str:
    """A method spec the engine can serve (refilling methods), normalised; ValueError otherwise."""
    if spec == "auto":
        return spec
    method = method_from_spec(spec)
    if not (isinstance(method, Options) and method.refills):
        raise ValueError(f"method {method.name} cannot be served: it does not restart rows; methods that do: "
                         f"{', '.join(refilling_methods())}, or auto")
    return spec_of(method)
