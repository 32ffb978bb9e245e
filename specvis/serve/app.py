"""The HTTP front (FastAPI): OpenAI's images API over one ``Engine``. Handlers only check, queue and
await the engine's events; decoding pictures and encoding them run in worker threads, never on the
engine's thread or the event loop.

Routes: ``POST /v1/images/generations`` (JSON, or server-sent events with ``stream``), ``GET /v1/models``,
``GET /health`` (200 once the engine warmed up; no key needed), ``GET /metrics`` (Prometheus text).
Every error is OpenAI's error JSON with one line; the API key (``Authorization: Bearer K``) is compared
in constant time (``hmac.compare_digest``)."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import os
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .engine import Draining, Engine, QueueFull, Ticket
from .images import picture
from .request import ApiError, Generation, ServedModel, parse

MAX_BODY = 64 * 1024  # bytes of a request body
RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.1


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes (413) whether or not it declares its length."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ApiError(413, f"the body is larger than {limit} bytes", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def loads(raw: bytes) -> Any:
    """JSON without NaN or Infinity (Python's json takes them; JSON has none); nesting past Python's
    recursion limit is refused like any other bad body."""
    def constant(name: str):
        raise ValueError(f"{name} is not a JSON number")
    try:
        return json.loads(raw, parse_constant=constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ApiError(400, f"the body is not valid JSON: {str(e).splitlines()[0]}", code="invalid_json") from None


def make_app(engine: Engine, served: ServedModel, *, api_key: str | None = None, max_body: int = MAX_BODY) -> FastAPI:
    """The app of one served model. ``app.state.draining``: set on shutdown, new requests get 503."""
    app = FastAPI(title="specvis", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.draining = False
    app.state.engine, app.state.served = engine, served

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                engine.metrics.rejected.labels("unauthorized").inc()
                return error_response(ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                               code="invalid_api_key"))
        try:
            return await call_next(request)
        except ApiError as e:
            return error_response(e)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(e)

    @app.exception_handler(404)
    async def not_found(request: Request, e):
        return error_response(ApiError(404, f"no route {request.url.path}", code="not_found"))

    @app.exception_handler(405)
    async def not_allowed(request: Request, e):
        return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}",
                                       code="method_not_allowed"))

    @app.get("/health")
    async def health():
        if engine.error is not None:
            return JSONResponse({"status": "failed", "error": str(engine.error)}, status_code=503)
        if app.state.draining:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        if not engine.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok", "model": served.name, "pid": os.getpid()}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0, "owned_by": "specvis",
                                            "sizes": list(served.sizes)}]}

    @app.post("/v1/images/generations")
    async def generations(request: Request):
        if app.state.draining:
            engine.metrics.rejected.labels("shutting_down").inc()
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if not engine.ready.is_set() or engine.error is not None:
            raise ApiError(503, "the model is not ready (see /health)", code="not_ready")
        try:
            gen = parse(loads(await read_body(request, max_body)), served)
        except ApiError as e:
            engine.metrics.rejected.labels("invalid").inc()
            raise e
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        seed = gen.seed if gen.seed is not None else secrets.randbits(48)
        job = Ticket.of(dataclasses.replace(gen.job, seed=seed), gen.grid,
                        lambda e: loop.call_soon_threadsafe(events.put_nowait, e),
                        partial_images=gen.partial_images if gen.stream else 0)
        try:
            engine.submit(job)
        except QueueFull as e:
            raise ApiError(429, str(e), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except Draining as e:
            raise ApiError(503, str(e), code="shutting_down") from None
        if gen.stream:
            return StreamingResponse(stream(engine, job, gen, events), media_type="text/event-stream")
        try:
            return await answer(request, engine, job, gen, events)
        finally:
            job.cancel()  # a no-op once every image came back; else frees its rows

    return app


async def next_event(request: Request, events: asyncio.Queue, deadline: float | None) -> tuple:
    """The engine's next event for this request; ApiError when the client left or the request timed out."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            pass
        if deadline is not None and time.monotonic() > deadline:
            raise ApiError(408, "the request timed out before its images were ready", code="timeout")
        if request is not None and await request.is_disconnected():
            raise ApiError(499, "the client disconnected", code="client_closed")


async def answer(request: Request, engine: Engine, job: Ticket, gen: Generation, events: asyncio.Queue) -> dict:
    """The JSON answer: every image, in order, once all are decoded."""
    deadline = None if gen.timeout is None else time.monotonic() + gen.timeout
    data: list[dict | None] = [None] * gen.n
    while any(d is None for d in data):
        event = await next_event(request, events, deadline)
        if event[0] == "error":
            raise ApiError(event[1], event[2])
        if event[0] == "image":
            _, k, codes, info = event
            b64 = await asyncio.to_thread(picture, engine.pipe, codes, gen.grid, gen.output_format)
            data[k] = {"b64_json": b64, "revised_prompt": None, "specvis": info}
    return {"created": int(time.time()), "data": data, "output_format": gen.output_format, "size": gen.size}


def sse(payload: dict) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n" if "type" in payload else \
        f"data: {json.dumps(payload)}\n\n"


async def stream(engine: Engine, job: Ticket, gen: Generation, events: asyncio.Queue):
    """Server-sent events in OpenAI's shape: ``image_generation.partial_image`` (``partial_image_index``)
    as an image's rows commit, then ``image_generation.completed`` per image; an error as
    ``{"error": ...}``. A client that leaves cancels the job (the generator is closed)."""
    deadline = None if gen.timeout is None else time.monotonic() + gen.timeout
    done, index = 0, [0] * gen.n
    common = {"size": gen.size, "quality": "auto", "background": "opaque", "output_format": gen.output_format}
    try:
        while done < gen.n:
            try:
                event = await next_event(None, events, deadline)
            except ApiError as e:
                yield sse(e.body())
                return
            if event[0] == "error":
                yield sse(ApiError(event[1], event[2]).body())
                return
            kind, k = event[0], event[1]
            if kind == "partial":
                b64 = await asyncio.to_thread(picture, engine.pipe, event[2], gen.grid, gen.output_format, event[3])
                yield sse({"type": "image_generation.partial_image", "b64_json": b64, "created_at": int(time.time()),
                           "partial_image_index": index[k], **common, "specvis": {"index": k}})
                index[k] += 1
            else:
                b64 = await asyncio.to_thread(picture, engine.pipe, event[2], gen.grid, gen.output_format)
                tokens = engine.model.layout.num_tokens
                yield sse({"type": "image_generation.completed", "b64_json": b64, "created_at": int(time.time()),
                           **common, "usage": {"input_tokens": 0, "output_tokens": tokens, "total_tokens": tokens,
                                               "input_tokens_details": {"image_tokens": 0, "text_tokens": 0}},
                           "specvis": {"index": k, **event[3]}})
                done += 1
    finally:
        job.cancel()
