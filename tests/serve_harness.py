"""A served model for tests: uvicorn in a thread on 127.0.0.1 and a free port (a socket bound to port 0
and handed to uvicorn), stopped by the test."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

import specvis as sv
from specvis.serve.server import build


class Served:
    """A server on a free loopback port; auto's cost model timed on one image per row count (these tests
    compare no speeds)."""

    def __init__(self, model: str = "emoji", **options) -> None:
        self.pipe = sv.load(model)
        self.engine, self.app = build(self.pipe, model, **{"max_batch": 4, "max_queue": 256, "method": "ar",
                                                            "api_key": None, "calibration_images": 1, **options})
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "Served":
        self.engine.start()
        self.thread.start()
        deadline = time.monotonic() + 300  # a bound: the start measures auto's cost model
        while not (self.server.started and self.engine.ready.is_set()):
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in 300 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close(5.0)
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def client(self, **kw):
        """The official openai client of this server (no retries: a test sees every error)."""
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)
