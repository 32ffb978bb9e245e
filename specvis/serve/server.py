"""``specvis serve``: load one model, start its engine, run the app under uvicorn with a graceful stop.

SIGTERM (or Ctrl-C): new requests get 503, the engine finishes what it accepted for up to ``--grace``
seconds (then answers what is left with an error), the answers are written, and the process exits 0.
A second signal stops at once."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import threading

import torch
import uvicorn

from .. import checks
from ..memory import MemoryPlanError
from .engine import CALIBRATION_IMAGES, MAX_CALIBRATION_IMAGES, Engine, decode_plan, served_method
from ..zoo import load
from .app import make_app
from .request import ServedModel

SIZE_STEPS = (2, 3, 4)  # a text model with a free grid also makes square grids of these quarters of its native side


def served_model(pipe, name: str, method: str) -> ServedModel:
    """The sizes the model makes ("WxH" pixels -> grid): its native grid; a text model whose grid is
    free also smaller squares (the quarters of ``SIZE_STEPS``) that its context holds."""
    L = pipe.target.layout
    native = (L.height, L.width)
    pixels = pipe.to_images(torch.zeros(1, L.height * L.width, dtype=torch.long, device=pipe.device))[0]
    per_row, per_col = pixels.height // L.height, pixels.width // L.width
    grids = [native]
    if pipe.conditioning != "class" and not pipe.family.fixed_grid:
        for step in SIZE_STEPS:
            side = (min(native) * step) // 4
            if side and (side, side) not in grids:
                try:
                    pipe.set_grid(side, side)
                    grids.append((side, side))
                except ValueError:
                    pass
        pipe.set_grid(*native)
    sizes = {f"{w * per_col}x{h * per_row}": (h, w) for h, w in sorted(grids)}
    classes = None if pipe.conditioning != "class" else (pipe.class_names or [str(i) for i in range(pipe.num_classes)])
    return ServedModel(name, classes, sizes, f"{native[1] * per_col}x{native[0] * per_row}", L.law_size,
                       dataclasses.replace(pipe.default_sampling, noise="keyed"), method)


def build(pipe, name: str, *, max_batch: int, max_queue: int, method: str, api_key: str | None,
          calibration_images: int = CALIBRATION_IMAGES):
    """The engine (not started) and app of ``pipe``; the engine's largest batch is checked against the
    device's memory first (``pipe.memory``: of the server's method and of auto's candidates, which the
    start-up cost model runs)."""
    max_batch = checks.integer(max_batch, "max_batch", low=1, high=1024)
    max_queue = checks.integer(max_queue, "max_queue", low=1, high=1_000_000)
    calibration_images = checks.integer(calibration_images, "calibration_images", low=1, high=MAX_CALIBRATION_IMAGES)
    method = served_method(method)
    sampling = dataclasses.replace(pipe.default_sampling, noise="keyed")
    plan = max((decode_plan(pipe, spec, sampling, max_batch) for spec in {"auto", method}), key=lambda p: p.needed_bytes)
    if not plan.fits:
        raise MemoryPlanError(plan.line())
    served = served_model(pipe, name, method)
    engine = Engine(pipe, max_batch=max_batch, max_queue=max_queue, method=method,
                    calibration_images=calibration_images)
    return engine, make_app(engine, served, api_key=api_key)


def main(a: argparse.Namespace) -> int:
    """``specvis serve``: load, build, start the engine, serve until a signal drains it."""
    checks.integer(a.port, "port", low=0, high=65535)
    checks.integer(a.max_batch, "max_batch", low=1, high=1024)  # every flag checked before the model loads
    checks.integer(a.max_queue, "max_queue", low=1, high=1_000_000)
    checks.integer(a.calibration_images, "calibration_images", low=1, high=MAX_CALIBRATION_IMAGES)
    served_method(a.method)
    if not 0 <= a.grace <= 3600:
        raise ValueError(f"--grace must be in 0..3600 seconds, got {a.grace}")
    if a.threads is not None:
        torch.set_num_threads(checks.integer(a.threads, "threads", low=1, high=1024))
    key = a.api_key if a.api_key is not None else os.environ.get("SPECVIS_API_KEY") or None
    pipe = load(a.model, a.device, a.dtype)
    engine, app = build(pipe, a.model, max_batch=a.max_batch, max_queue=a.max_queue, method=a.method, api_key=key,
                        calibration_images=a.calibration_images)
    engine.start()
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=int(a.grace) + 5)
    server = DrainingServer(config, engine, app, a.grace)
    family = socket.AF_INET6 if ":" in a.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:  # bound here: port 0 prints the port it got
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((a.host, a.port))
        port = sock.getsockname()[1]
        print(f"specvis: serving {a.model} on http://{a.host}:{port} (ready on /health after the warm-up)", flush=True)
        server.run(sockets=[sock])
    return 0


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM/SIGINT drains: the app answers 503 to new requests, the
    engine finishes its accepted work (``Engine.close(grace)``), then uvicorn stops (exit 0: the signal
    is not re-raised as uvicorn does). A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, engine: Engine, app, grace: float) -> None:
        super().__init__(config)
        self.engine, self.app, self.grace, self.draining = engine, app, grace, False

    def handle_exit(self, sig, frame) -> None:
        if self.draining:
            self.force_exit = self.should_exit = True
            return
        self.draining = True
        self.app.state.draining = True
        threading.Thread(target=self._drain, name="specvis-drain", daemon=True).start()

    def _drain(self) -> None:
        self.engine.close(self.grace)
        self.should_exit = True
