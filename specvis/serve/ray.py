"""``specvis serve`` on Ray Serve (extra ``.[ray]``): each replica one engine on one device, Ray's HTTP
proxy in front; replicas and autoscaling are Ray's own deployment options.

    from ray import serve
    from specvis.serve.ray import deployment
    serve.run(deployment("emoji-t2i", num_replicas=2), route_prefix="/")

Clients talk to Ray's proxy exactly as to ``specvis serve`` (OpenAI's images API)."""

from __future__ import annotations

from typing import Any

from ray import serve

from ..zoo import load
from .engine import CALIBRATION_IMAGES
from .server import build


@serve.deployment
@serve.ingress()
class SpecvisReplica:
    """One replica: the model loaded on ``device``, its engine warmed up, the server's app."""

    def __init__(self, model: str = "emoji", *, max_batch: int = 8, max_queue: int = 256, method: str = "auto",
                 api_key: str | None = None, device: str = "cpu", threads: int | None = None, grace: float = 30.0,
                 calibration_images: int = CALIBRATION_IMAGES) -> None:
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        self.grace = grace
        self.engine, self.asgi = build(load(model, device), model, max_batch=max_batch, max_queue=max_queue,
                                      method=method, api_key=api_key, calibration_images=calibration_images)
        self.engine.start()
        self.engine.ready.wait()
        if self.engine.error is not None:
            raise RuntimeError(f"the engine's warm-up failed: {self.engine.error}")

    def __serve_build_asgi_app__(self):
        return self.asgi

    def check_health(self) -> None:
        """Ray's health check: a failed engine fails the replica."""
        if self.engine.error is not None or not self.engine.alive:
            raise RuntimeError("the engine is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)  # a replica whose constructor failed has none
        if engine is not None:
            engine.close(self.grace)


def deployment(model: str = "emoji", *, num_replicas: int | str = 1, num_cpus: float = 1, num_gpus: float = 0,
               **options: Any):
    """The bound application of ``model``: ``num_replicas`` replicas (or "auto" for Ray's autoscaling),
    each with ``num_cpus``/``num_gpus`` (``device="cuda"`` in ``options`` with ``num_gpus=1``: one engine a
    GPU); ``options`` are ``SpecvisReplica``'s (max_batch, max_queue, method, api_key, device, threads, grace,
    calibration_images)."""
    return SpecvisReplica.options(num_replicas=num_replicas,
                                  ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus}).bind(model, **options)
