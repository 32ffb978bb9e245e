"""Benchmark ``specvis serve`` under load: closed loop (C clients, each sending its next request when
the last one is answered) and open loop (Poisson arrivals at a given rate), for the server with
``--method auto``, pinned to AR and pinned to SJD (and, with ``--modes ... ar-control``, a second AR
server: the ratio of two identical servers is the noise the others' ratios are read against), against
offline continuous batching ``pipe(..., batch_size=B)`` over the same prompts, side by side in one run:
the servers are all up (idle but for the one measured), and each load level is run on each of them in
turn, ``--passes`` times in mirrored order (A B C, then C B A), its requests shared out among the
passes, so that the figures compared are seconds apart and a steady drift of the machine's speed
weighs on each alike.

Each server is a ``specvis serve`` process on 127.0.0.1 (one torch thread unless --threads), the
clients are threads of this process (httpx); the offline figures are measured in this process, the
servers up but idle, right after the level each is compared with (batched after the most clients, one
image at a time after one client). ``--in-process``: no HTTP, the engine runs in this process and the
clients are threads submitting its jobs (what the engine alone gives: no request parsing, no PNG encoding; needs
neither FastAPI nor uvicorn). Per load level, over its passes: images/s (and each pass's), p50/p95/p99
latency, p50/p95/p99 time in queue (the engine's ``queued_s``), the mean rows held per round and auto's
rounds by method (from the engine's metrics). Writes JSON (--out) and a markdown page (--page).

Before it starts it prints an estimate of its run time, from offline AR's images/s at one row and at
``--max-batch`` rows measured first (a few seconds); ``--estimate-only`` stops there and
``--budget-min`` refuses a run estimated longer. Bounds: ``--requests`` per level, ``--limit-s`` per
level (no request is sent after it), the levels (``--clients``, ``--rates``), ``--modes``, ``--models``.

Full run (alone on the machine; the lead runs it):
    python scripts/bench_serve.py --models emoji-t2i emoji --out docs/results/data/serve-cpu.json \
        --page docs/results/serve-cpu.md
The same on a GPU: add --device cuda (and --in-process where FastAPI/uvicorn are not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["a red heart", "a cat", "a smiling face", "a sun", "a blue car", "a pizza", "a dog", "a star"]
MODES = {"auto": "auto", "ar": "ar", "sjd": "sjd", "ar-control": "ar"}  # server: its --method
# START_BIAS: on the 2-core CPU the server started first ran slowest of those running AR at 8 and 16
# clients in four runs with two start orders, 1-8% below the fastest, whatever its method (cause not
# found). So the A/A control, when measured, is started first: the compared servers start alike, and
# the A/A ratio shows what starting first costs.
DEFAULT_MODES = ["auto", "ar", "sjd"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts_for(model: str, count: int, classes: int) -> list[str]:
    if classes:
        return [str(i % classes) for i in range(count)]
    return [PROMPTS[i % len(PROMPTS)] for i in range(count)]


class Server:
    """A ``specvis serve`` process, ready (its /health answers 200) when entered; SIGTERM on exit."""

    def __init__(self, model: str, method: str, a: argparse.Namespace) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "OMP_NUM_THREADS": str(a.threads)}
        self.cmd = [sys.executable, "-m", "specvis.cli", "serve", "--model", model, "--port", str(self.port),
                    "--max-batch", str(a.max_batch), "--max-queue", str(a.max_queue), "--method", method,
                    "--device", a.device, "--threads", str(a.threads)]
        self.env = env

    def __enter__(self) -> "Server":
        import httpx

        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 900
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server not ready in 900 s")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def counters(self) -> dict[str, float]:
        """The engine's round counters now (``engine_counters`` of its /metrics)."""
        import httpx

        return engine_counters(httpx.get(self.url + "/metrics", timeout=30).text)

    def sender(self, connections: int = 1):
        """A client (httpx, ``connections`` at once) and its ``send(prompt, size, seed) -> row``."""
        import httpx

        client = httpx.Client(base_url=self.url, timeout=600, limits=httpx.Limits(max_connections=connections))

        def send(prompt: str, size: str | None, seed: int) -> dict:
            body = {"prompt": prompt, "seed": seed}
            if size:
                body["size"] = size
            t0 = time.perf_counter()
            r = client.post("/v1/images/generations", json=body)
            t1 = time.perf_counter()
            r.raise_for_status()
            info = r.json()["data"][0]["specvis"]
            return {"latency_s": t1 - t0, "queued_s": info["queued_s"], "decode_s": info["decode_s"], "end": t1,
                    "method": info["method"]}
        return client, send


class InProcess:
    """The engine of ``specvis serve`` in this process, no HTTP: a request is a job submitted to it,
    answered when its image's codes come back (no picture is encoded)."""

    def __init__(self, model: str, method: str, a: argparse.Namespace) -> None:
        import torch

        import specvis as sv
        from specvis.serve.engine import Engine, served_method

        torch.set_num_threads(a.threads)
        self.pipe = sv.load(model, a.device)
        self.engine = Engine(self.pipe, max_batch=a.max_batch, max_queue=a.max_queue, method=served_method(method))
        self.sampling = dataclasses.replace(self.pipe.default_sampling, noise="keyed")  # the server's sampling
        self.method = self.engine.method

    def __enter__(self) -> "InProcess":
        self.engine.start()
        self.engine.ready.wait()
        if self.engine.error is not None:
            raise RuntimeError(f"the engine did not start: {self.engine.error}")
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close(120)

    def counters(self) -> dict[str, float]:
        return engine_counters(self.engine.metrics.text().decode())

    def sender(self, connections: int = 1):
        from contextlib import nullcontext

        from specvis.serve.engine import Key, Ticket

        def send(prompt: str, size: str | None, seed: int) -> dict:
            grid = grid_of(self.pipe, size)
            done, got = threading.Event(), []

            def sink(event) -> None:
                if event[0] in ("image", "error"):
                    got.append(event)
                    done.set()
            text = self.pipe.conditioning != "class"
            t0 = time.perf_counter()
            self.engine.submit(Ticket(prompt if text else int(prompt), 1, seed, Key(self.method, self.sampling, grid), sink))
            done.wait()
            t1 = time.perf_counter()
            if got[0][0] == "error":
                raise RuntimeError(f"the engine answered {got[0][1]}: {got[0][2]}")
            info = got[0][3]
            return {"latency_s": t1 - t0, "queued_s": info["queued_s"], "decode_s": info["decode_s"], "end": t1,
                    "method": info["method"]}
        return nullcontext(), send


def engine_counters(text: str) -> dict[str, float]:
    """From a server's Prometheus text: rounds (``specvis_rows_per_round`` count), rows held summed over
    rounds, and auto's rounds by the method it ran (``auto_rounds:<method>``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specvis_rows_per_round_count":
                out["rounds"] = sample.value
            elif sample.name == "specvis_rows_per_round_sum":
                out["rows_held"] = sample.value
            elif sample.name == "specvis_auto_rounds_total":
                out[f"auto_rounds:{sample.labels['method']}"] = sample.value
    return out


def grid_of(pipe, size: str | None) -> tuple[int, int]:
    """The token grid of a "WxH" size (None: the model's native grid)."""
    import torch

    layout = pipe.target.layout
    if size is None or pipe.conditioning == "class":
        return layout.height, layout.width
    per = pipe.to_images(torch.zeros(1, layout.num_tokens, dtype=torch.long, device=pipe.device))[0].width // layout.width
    w, h = map(int, size.split("x"))
    return h // per, w // per


def summary(rows: list[dict], wall: float) -> dict:
    """Images/s, latency and queue percentiles and the methods answered, over ``rows`` in ``wall`` seconds."""
    lat = np.array([r["latency_s"] for r in rows])
    que = np.array([r["queued_s"] for r in rows])
    methods: dict[str, int] = {}
    for r in rows:
        methods[r["method"]] = methods.get(r["method"], 0) + 1
    return {"images": len(rows), "wall_s": wall, "images_per_s": len(rows) / wall,
            **{f"latency_p{q}_s": float(np.percentile(lat, q)) for q in (50, 95, 99)},
            **{f"queue_p{q}_s": float(np.percentile(que, q)) for q in (50, 95, 99)}, "methods": methods}


def level_requests(a: argparse.Namespace, clients: int) -> int:
    """Requests of a closed-loop level of ``clients`` clients, all passes: ``--requests`` (at least two a
    client) shared out among the passes, each pass at least one a client, so a multiple of ``--passes``."""
    return a.passes * max(clients, math.ceil(max(a.requests, 2 * clients) / a.passes))


def closed_loop(target, prompts: list[str], clients: int, requests: int, size: str | None, limit_s: float) -> dict:
    """``clients`` threads each sending its next request when the last is answered, ``requests`` in all
    (or until ``limit_s``): the answers (``rows``) and the seconds (``wall_s``)."""
    rows, lock, counter = [], threading.Lock(), [0]
    start = time.perf_counter()

    def worker() -> None:
        client, send = target.sender()
        with client:
            while True:
                with lock:
                    i = counter[0]
                    if i >= requests or time.perf_counter() - start > limit_s:
                        return
                    counter[0] += 1
                out = send(prompts[i % len(prompts)], size, i)
                with lock:
                    rows.append(out)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"rows": rows, "wall_s": time.perf_counter() - start}


def open_loop(target, prompts: list[str], rate: float, requests: int, size: str | None, seed: int,
              limit_s: float) -> dict:
    """Poisson arrivals at ``rate`` requests/s, ``requests`` in all (none sent after ``limit_s``);
    latency counted from each arrival. The answers (``rows``) and the seconds (``wall_s``)."""
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate) for _ in range(requests)]
    rows, lock = [], threading.Lock()
    start = time.perf_counter()
    client, send = target.sender(connections=requests)

    def one(i: int, at: float) -> None:
        out = send(prompts[i % len(prompts)], size, i)
        out["latency_s"] = out["end"] - at  # from the arrival, not the send
        with lock:
            rows.append(out)

    threads, at = [], start
    with client:
        for i, gap in enumerate(gaps):
            at += gap
            if at - start > limit_s:
                break
            time.sleep(max(0.0, at - time.perf_counter()))
            t = threading.Thread(target=one, args=(i, at))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    return {"rows": rows, "wall_s": time.perf_counter() - start}


def pooled(level: dict, runs: list[dict]) -> dict:
    """One server's figures at one load level over its passes: images/s of all images over all seconds,
    percentiles over all answers, each pass's images/s, and the engine's rounds in the level (mean rows
    held per round; auto's rounds by method)."""
    rows = [r for run in runs for r in run["rows"]]
    out = {**level, **summary(rows, sum(run["wall_s"] for run in runs)),
           "passes": [round(len(run["rows"]) / run["wall_s"], 4) for run in runs]}
    counts: dict[str, float] = {}
    for run in runs:
        for name, value in run["counters"].items():
            counts[name] = counts.get(name, 0.0) + value
    if counts.get("rounds"):
        out["rows_per_round"] = counts["rows_held"] / counts["rounds"]
    out["auto_rounds"] = {k.split(":", 1)[1]: int(v) for k, v in counts.items() if k.startswith("auto_rounds:") and v}
    return out


def offline_pipe(model: str, a: argparse.Namespace):
    """The model loaded in this process as the server loads it (``--threads``, ``--device``) and the
    server's sampling (the model's, with keyed noise): what every offline figure runs."""
    import torch

    import specvis as sv

    torch.set_num_threads(a.threads)
    pipe = sv.load(model, a.device)
    return pipe, dataclasses.replace(pipe.default_sampling, noise="keyed")


def offline(model: str, prompts: list[str], a: argparse.Namespace, method: str) -> dict:
    """``pipe(..., batch_size=max_batch)`` over ``prompts`` in this process (continuous batching), under
    the server's sampling (the model's, with keyed noise), decoded to images as the server does."""
    pipe, sampling = offline_pipe(model, a)
    classes = pipe.conditioning == "class"
    kw = {"classes": [int(p) for p in prompts]} if classes else {"prompts": prompts}
    if a.size and not classes:
        kw.update(zip(("height", "width"), grid_of(pipe, a.size)))
    pipe(**{**kw, **({"classes": kw["classes"][:2]} if classes else {"prompts": prompts[:2]})}, method=method,
         sampling=sampling, batch_size=2, decode=False)  # warm-up
    t0 = time.perf_counter()
    pipe(**kw, method=method, sampling=sampling, batch_size=a.max_batch, seed=0)
    wall = time.perf_counter() - t0
    return {"load": "offline", "method": method, "images": len(prompts), "wall_s": wall,
            "images_per_s": len(prompts) / wall, "batch_size": a.max_batch}


def offline_one(model: str, prompts: list[str], a: argparse.Namespace, method: str) -> dict:
    """Each of ``prompts`` generated alone, ``pipe(one prompt)`` (batch 1, no server), under the server's
    sampling, decoded to an image: the p50 latency a one-row server can at best match (the one-client
    goal's reference)."""
    pipe, sampling = offline_pipe(model, a)
    one = (lambda p: {"classes": [int(p)]}) if pipe.conditioning == "class" else (lambda p: {"prompts": [p]})
    pipe(**one(prompts[0]), method=method, sampling=sampling, decode=False)  # warm-up
    seconds = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        pipe(**one(prompt), method=method, sampling=sampling, seed=i)
        seconds.append(time.perf_counter() - t0)
    return {"load": "offline, one image at a time", "method": method, "images": len(prompts),
            "latency_p50_s": statistics.median(seconds), "batch_size": 1}


def classes_of(model: str) -> int:
    import specvis as sv

    pipe = sv.load(model)
    return pipe.num_classes if pipe.conditioning == "class" else 0


def calibrate(model: str, a: argparse.Namespace) -> tuple[float, float]:
    """Offline AR's images/s at one row and at ``max_batch`` rows (one decode each, after a warm-up),
    under the server's sampling: what the estimate scales."""
    pipe, sampling = offline_pipe(model, a)
    kw = (lambda n: {"classes": [0] * n}) if pipe.conditioning == "class" else (lambda n: {"prompts": ["a cat"] * n})
    pipe(**kw(1), method="ar", sampling=sampling, decode=False)
    rates = []
    for n in (1, a.max_batch):
        t0 = time.perf_counter()
        pipe(**kw(n), method="ar", sampling=sampling, decode=False)
        rates.append(n / (time.perf_counter() - t0))
    return rates[0], rates[1]


def estimate(a: argparse.Namespace, one: float, full: float) -> dict:
    """Seconds this run should take on one model, from offline AR's images/s at one row (``one``) and
    at ``max_batch`` rows (``full``), in log-linear between: per server, its start (auto's cost model
    times each of its 3 candidates on ``CALIBRATION_IMAGES`` images or more at each of 1, 2, 4, ...,
    max_batch rows) and each level (its requests at the rate of the rows it keeps busy, no request sent
    after ``limit_s``); then offline AR and SJD, batched and (with one client among the levels) one image
    at a time."""
    from specvis.serve.engine import CALIBRATION_IMAGES

    B = a.max_batch

    def rate(rows: int) -> float:
        rows = max(1, min(rows, B))
        return one if B == 1 else one * (full / one) ** (math.log(rows) / math.log(B))

    measured = sorted({min(2 ** i, B) for i in range(int(math.log2(B)) + 1)} | {B})
    start = 10.0 + 3 * (1 / one + sum(math.ceil(CALIBRATION_IMAGES / r) * r / rate(r) for r in measured))
    closed = {c: min(level_requests(a, c) / rate(c), a.limit_s + c / rate(c)) for c in a.clients}
    opened = {r: min(a.requests / min(r, full), a.limit_s) + 1 / one for r in a.rates}
    per_server = start + sum(closed.values()) + sum(opened.values())
    offline = 2.5 * level_requests(a, max(a.clients)) / full + 10.0  # AR's and SJD's (about 1.5x AR's at full rows)
    if 1 in a.clients and a.one_images:
        offline += 1.7 * a.one_images / one + 10.0  # one image at a time: AR's and SJD's (about 0.7x AR's)
    return {"start_s": start, "closed_s": closed, "open_s": opened, "per_server_s": per_server,
            "offline_s": offline, "total_s": len(a.modes) * per_server + offline}


def page(data: dict) -> str:
    lines = ["# `specvis serve` under load (CPU)", "",
             f"Measured by `scripts/bench_serve.py` on {data['meta']['machine']}, {data['meta']['threads']} torch "
             f"thread(s), `--max-batch {data['meta']['max_batch']}`, {data['meta']['date']}"
             f"{' (engine in process, no HTTP)' if data['meta'].get('transport') == 'in-process' else ''}. Command: "
             f"`{data['meta']['command']}`. Data: `{data['meta']['out']}`.", ""]
    for model, res in data["models"].items():
        lines += [f"## {model}", "", "| server | load | images/s | passes | p50 s | p95 s | p99 s | queue p50 s | queue p99 s | rows / round | auto's rounds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode, rows in res["servers"].items():
            for r in rows:
                load = f"{r['clients']} clients" if r["load"] == "closed" else f"{r['rate_per_s']}/s Poisson"
                passes = " / ".join(f"{x:.2f}" for x in r.get("passes", []))
                held = f"{r['rows_per_round']:.2f}" if "rows_per_round" in r else ""
                rounds = ", ".join(f"{k} {v}" for k, v in r.get("auto_rounds", {}).items())
                lines.append(f"| {mode} | {load} | {r['images_per_s']:.2f} | {passes} | {r['latency_p50_s']:.2f} | "
                             f"{r['latency_p95_s']:.2f} | {r['latency_p99_s']:.2f} | {r['queue_p50_s']:.2f} | "
                             f"{r['queue_p99_s']:.2f} | {held} | {rounds} |")
        for r in res["offline"]:
            lines.append(f"| offline pipe(batch_size={r['batch_size']}) {r['method']} | {r['images']} images | "
                         f"{r['images_per_s']:.2f} | | | | | | | | |")
        for r in res.get("offline_one", []):
            lines.append(f"| offline pipe(one image) {r['method']} | {r['images']} images, one at a time | | | "
                         f"{r['latency_p50_s']:.2f} | | | | | | |")
        lines += ["", "Goals (ratios of the figures above):", ""]
        for name, value in res["goals"].items():
            lines.append(f"- {name}: {value}")
        lines.append("")
    return "\n".join(lines)


def goals(res: dict) -> dict:
    """The issue's goals as measured ratios (None where a figure is missing)."""
    def closed(mode: str, clients: int):
        return next((r for r in res["servers"].get(mode, []) if r["load"] == "closed" and r["clients"] == clients), None)

    out = {}
    best_offline = max((r["images_per_s"] for r in res["offline"]), default=None)
    top = max((r["clients"] for rows in res["servers"].values() for r in rows if r["load"] == "closed"), default=None)
    if best_offline and top and closed("auto", top):
        out[f"auto at {top} clients / best offline images/s (goal >= 0.9)"] = round(closed("auto", top)["images_per_s"] / best_offline, 3)
    if closed("auto", 1) and closed("ar", 1):
        out["auto p50 latency at 1 client / AR server's (goal <= 0.556)"] = round(
            closed("auto", 1)["latency_p50_s"] / closed("ar", 1)["latency_p50_s"], 3)
    one = {r["method"]: r["latency_p50_s"] for r in res.get("offline_one", [])}
    if "ar" in one and "sjd" in one:  # the same ratio without a server: what SJD itself gives at one row
        out["reference: offline one-image p50, SJD / AR (no goal)"] = round(one["sjd"] / one["ar"], 3)
    levels = sorted({r["clients"] for r in res["servers"].get("auto", []) if r["load"] == "closed"})
    ratios = {}
    for c in levels:
        pinned = [closed(m, c)["images_per_s"] for m in ("ar", "sjd") if closed(m, c)]
        if pinned:
            ratios[c] = round(closed("auto", c)["images_per_s"] / max(pinned), 3)
    if ratios:
        out["auto images/s / best pinned server's, worst closed-loop level (goal >= 0.95)"] = min(ratios.values())
        out["the same, per closed-loop level (clients: ratio)"] = ", ".join(f"{c}: {v}" for c, v in ratios.items())
    control = {c: round(closed("ar-control", c)["images_per_s"] / closed("ar", c)["images_per_s"], 3)
               for c in levels if closed("ar-control", c) and closed("ar", c)}
    if control:  # two servers doing the same work: how far apart this machine puts them
        out["A/A: AR control server / AR server, per closed-loop level (no goal)"] = ", ".join(
            f"{c}: {v}" for c, v in control.items())
    if closed("auto", 16):
        r = closed("auto", 16)
        out["auto p99 / p50 latency at 16 clients (goal <= 3)"] = round(r["latency_p99_s"] / r["latency_p50_s"], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["emoji-t2i", "emoji"])
    ap.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES),
                    help="servers to measure; ar-control: a second AR server, whose ratio to the first is the "
                         "noise of two identical servers (an A/A comparison)")
    ap.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--rates", nargs="*", type=float, default=[0.5, 1.0, 2.0, 4.0], help="open-loop requests/s (none: closed loop only)")
    ap.add_argument("--requests", type=int, default=64, help="requests per load level (at least 2x the clients)")
    ap.add_argument("--limit-s", type=float, default=300.0, help="per level: stop sending after this many seconds")
    ap.add_argument("--passes", type=int, default=2, help="each level runs on each server this many times, in "
                                                          "mirrored order, the level's requests and limit shared out")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--one-images", type=int, default=8, help="with 1 client among --clients: images the offline "
                                                              "one-at-a-time reference times per method (0: none)")
    ap.add_argument("--max-queue", type=int, default=4096)
    ap.add_argument("--size", default=None, help="WxH of every request (default: the model's native size)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="docs/results/data/serve-cpu.json")
    ap.add_argument("--page", default=None, help="markdown page to write (e.g. docs/results/serve-cpu.md)")
    ap.add_argument("--in-process", action="store_true", help="drive the engine in this process, no HTTP "
                                                              "(needs neither FastAPI nor uvicorn)")
    ap.add_argument("--estimate-only", action="store_true", help="print the run's estimated time and stop")
    ap.add_argument("--budget-min", type=float, default=None, help="refuse a run estimated longer (minutes)")
    a = ap.parse_args()
    bounds = [("requests", a.requests, 1, 100_000), ("limit_s", a.limit_s, 1, 86_400), ("passes", a.passes, 1, 16), ("max_batch", a.max_batch, 1, 1024),
              ("one_images", a.one_images, 0, 10_000),
              ("max_queue", a.max_queue, 1, 1_000_000), ("threads", a.threads, 1, 1024),
              ("budget_min", 1 if a.budget_min is None else a.budget_min, 0.1, 10_000)]
    bounds += [("clients", c, 1, 1024) for c in a.clients] + [("rates", r, 0.001, 1000) for r in a.rates]
    for name, value, low, high in bounds:
        if not (math.isfinite(value) and low <= value <= high):
            ap.error(f"--{name.replace('_', '-')} must be in {low}..{high}, got {value}")
    guess = {}
    for model in a.models:
        guess[model] = estimate(a, *calibrate(model, a))
        g = guess[model]
        print(f"estimate {model}: {g['total_s'] / 60:.1f} min ({len(a.modes)} server(s) x {g['per_server_s']:.0f} s: "
              f"start {g['start_s']:.0f} s, closed {', '.join(f'{c}: {v:.0f} s' for c, v in g['closed_s'].items())}, "
              f"open {', '.join(f'{r}/s: {v:.0f} s' for r, v in g['open_s'].items())}; offline {g['offline_s']:.0f} s)",
              flush=True)
    total = sum(g["total_s"] for g in guess.values()) / 60
    print(f"estimate: {total:.1f} min in all", flush=True)
    if a.estimate_only:
        return 0
    if a.budget_min is not None and total > a.budget_min:
        print(f"bench_serve: the run is estimated at {total:.1f} min, over --budget-min {a.budget_min:g}: fewer "
              f"--requests, a lower --limit-s, fewer --clients/--rates/--modes/--models", file=sys.stderr)
        return 2
    data = {"meta": {"machine": f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)",
                     "threads": a.threads, "max_batch": a.max_batch, "device": a.device,
                     "transport": "in-process" if a.in_process else "http",
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "out": a.out,
                     "command": "python scripts/bench_serve.py " + " ".join(sys.argv[1:]),
                     "estimate_min": round(total, 1)}, "models": {}}
    began = time.perf_counter()
    for model in a.models:
        classes = classes_of(model)
        size = None if classes else a.size
        res = {"servers": {}, "offline": [], "offline_one": []}
        with contextlib.ExitStack() as stack:  # every server up (each started alone), then level by level
            servers = {mode: stack.enter_context((InProcess if a.in_process else Server)(model, MODES[mode], a))
                       for mode in sorted(a.modes, key=lambda m: m != "ar-control")}  # the control first: START_BIAS
            rows: dict[str, list[dict]] = {mode: [] for mode in a.modes}
            levels = [("closed", c) for c in a.clients] + [("open", r) for r in a.rates]
            for i, (load, level) in enumerate(levels):
                order = a.modes[i % len(a.modes):] + a.modes[: i % len(a.modes)]  # each server first in turn
                runs: dict[str, list[dict]] = {mode: [] for mode in a.modes}
                for p in range(a.passes):  # mirrored passes (A B C, C B A): a steady drift weighs on each alike
                    for mode in order if p % 2 == 0 else order[::-1]:
                        s, before = servers[mode], servers[mode].counters()
                        if load == "closed":
                            n = level_requests(a, level) // a.passes
                            run = closed_loop(s, prompts_for(model, n, classes), level, n, size, a.limit_s / a.passes)
                        else:
                            n = math.ceil(a.requests / a.passes)
                            run = open_loop(s, prompts_for(model, n, classes), level, n, size, p, a.limit_s / a.passes)
                        after = s.counters()
                        run["counters"] = {k: v - before.get(k, 0.0) for k, v in after.items()}
                        runs[mode].append(run)
                for mode in a.modes:
                    rows[mode].append(pooled({"load": load, "clients" if load == "closed" else "rate_per_s": level},
                                             runs[mode]))
                    print(model, mode, rows[mode][-1], flush=True)
                # the offline references right after the level they are compared with, the servers idle
                if load == "closed" and level == 1 and a.one_images:
                    for method in ("ar", "sjd"):
                        res["offline_one"].append(offline_one(model, prompts_for(model, a.one_images, classes), a, method))
                        print(model, res["offline_one"][-1], flush=True)
                if load == "closed" and level == max(a.clients):
                    for method in ("ar", "sjd"):
                        res["offline"].append(offline(model, prompts_for(model, level_requests(a, level), classes), a,
                                                      method))
                        print(model, res["offline"][-1], flush=True)
        res["servers"] = rows
        res["goals"] = goals(res)
        data["models"][model] = res
    data["meta"]["wall_min"] = round((time.perf_counter() - began) / 60, 1)
    print(f"bench_serve: {data['meta']['wall_min']} min (estimated {total:.1f})", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(data, indent=1))
    if a.page:
        Path(a.page).write_text(page(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
