"""A generation request's body, checked: OpenAI's images fields and specvis's own, each bounded; a
wrong one is an ``ApiError`` with one line naming the field and what it allows."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from ..job import Job
from ..sampling import MIN_TEMPERATURE, Sampling
from .engine import served_method

MAX_N = 10  # OpenAI's bound on n
MAX_PROMPT_CHARS = 4000  # the prompt's text; its tokens are bounded by the model when encoded
MAX_METHOD_CHARS = 300  # a method spec string
MAX_SEED = 2 ** 63 - 1
MAX_TIMEOUT_S = 3600.0
MAX_GUIDANCE = 100.0
MAX_TEMPERATURE = 10.0
FORMATS = ("png", "jpeg", "webp")
# OpenAI fields a client may send that change nothing here
IGNORED = ("quality", "style", "user", "background", "moderation", "output_compression")
FIELDS = ("model", "prompt", "n", "size", "response_format", "output_format", "stream", "partial_images", "seed",
          "method", "negative_prompt", "guidance_scale", "temperature", "top_k", "top_p", "timeout") + IGNORED


class ApiError(Exception):
    """An error answered as OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServedModel:
    """What a request is checked against: the served model's name, its classes (class-conditional) or
    None (text), the sizes it can make ("WxH" pixels -> grid rows, columns), the vocabulary size."""

    name: str
    classes: list[str] | None
    sizes: dict[str, tuple[int, int]]
    native: str
    vocab: int
    default_sampling: Sampling
    method: str  # the server's method: "auto" or a spec


@dataclass(frozen=True)
class Generation:
    prompt: Any  # class id or text
    n: int
    size: str
    grid: tuple[int, int]
    output_format: str
    stream: bool
    partial_images: int
    seed: int | None
    method: str
    negative_prompt: str | None
    sampling: Sampling
    timeout: float | None
    job: Job | None = None  # what to make: the fields above as a ``Job`` (``parse``)


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", param=field, code="invalid_value")


def _integer(body: dict, field: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(field, f"must be an integer in {low}..{high}, got {value!r:.40}")
    return value


def _number(body: dict, field: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not (low < value if low_open else low <= value) or value > high:
        span = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise _bad(field, f"must be a finite number in {span}, got {value!r:.40}")
    return float(value)


def _text(body: dict, field: str, required: bool) -> str | None:
    value = body.get(field)
    if value is None:
        if required:
            raise _bad(field, "is required (a string)")
        return None
    if not isinstance(value, str):
        raise _bad(field, f"must be a string, got {type(value).__name__}")
    if len(value) > MAX_PROMPT_CHARS:
        raise _bad(field, f"is {len(value)} characters; at most {MAX_PROMPT_CHARS}")
    return value


def class_of(prompt: str, classes: list[str]) -> int:
    """A class-conditional model's prompt: a class number or name (case and spaces ignored)."""
    text = prompt.strip()
    if text.isdigit() and int(text) < len(classes):
        return int(text)
    names = {c.lower(): i for i, c in enumerate(classes)}
    if text.lower() in names:
        return names[text.lower()]
    raise _bad("prompt", f"this model is class-conditional: give a class number 0..{len(classes) - 1} or one of "
                         f"{', '.join(classes)}; got {prompt!r:.60}")


def parse(body: Any, served: ServedModel) -> Generation:
    """The checked request; ``ApiError`` (400, one line naming the field) otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    unknown = [k for k in body if k not in FIELDS]
    if unknown:
        raise _bad(unknown[0][:40], f"unknown field; fields: {', '.join(FIELDS[:16])}")
    model = body.get("model")
    if model is not None and model != served.name:
        raise ApiError(404, f"model: {model!r:.60} is not served here; this server serves {served.name!r}",
                       param="model", code="model_not_found")
    text = _text(body, "prompt", required=True)
    if not text.strip():
        raise _bad("prompt", "is empty")
    prompt: Any = text if served.classes is None else class_of(text, served.classes)
    negative = _text(body, "negative_prompt", required=False)
    if negative is not None and served.classes is not None:
        raise _bad("negative_prompt", "this model is class-conditional: its unconditional row is its null class")
    n = _integer(body, "n", 1, 1, MAX_N)
    size = body.get("size")
    if size is None or size == "auto":
        size = served.native
    if not isinstance(size, str) or size not in served.sizes:
        raise _bad("size", f"this model makes {', '.join(served.sizes)} (or auto); got {size!r:.40}")
    response_format = body.get("response_format", "b64_json")
    if response_format != "b64_json":
        raise _bad("response_format", f"only b64_json is served (no image URLs); got {response_format!r:.40}")
    output_format = body.get("output_format", "png")
    if output_format not in FORMATS:
        raise _bad("output_format", f"must be one of {', '.join(FORMATS)}; got {output_format!r:.40}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {stream!r:.40}")
    partial = _integer(body, "partial_images", 0, 0, 3)
    seed = _integer(body, "seed", None, 0, MAX_SEED - MAX_N)
    method = body.get("method", served.method)
    if not isinstance(method, str):
        raise _bad("method", f"must be a method spec string such as 'sjd:window=16', or 'auto'; got {method!r:.40}")
    if len(method) > MAX_METHOD_CHARS:
        raise _bad("method", f"is {len(method)} characters; at most {MAX_METHOD_CHARS}")
    try:
        method = served_method(method.strip())
    except ValueError as e:
        raise _bad("method", str(e).splitlines()[0]) from None
    base = served.default_sampling
    guidance = _number(body, "guidance_scale", 0.0, MAX_GUIDANCE)
    temperature = _number(body, "temperature", 0.0, MAX_TEMPERATURE)
    if temperature is not None and 0 < temperature < MIN_TEMPERATURE:  # logits / T overflow below it
        raise _bad("temperature", f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE}], "
                                  f"got {temperature!r}")
    top_k = _integer(body, "top_k", None, 1, served.vocab)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    sampling = Sampling(temperature=base.temperature if temperature is None else temperature,
                        top_k=base.top_k if top_k is None else top_k,
                        top_p=base.top_p if top_p is None else top_p,
                        cfg_scale=base.cfg_scale if guidance is None else guidance, noise=base.noise)
    timeout = _number(body, "timeout", 0.0, MAX_TIMEOUT_S, low_open=True)
    text = served.classes is None
    job = Job(model=served.name, method=method, sampling=sampling, classes=None if text else (prompt,),
              prompts=(prompt,) if text else None, negative_prompts=None if negative is None else (negative,),
              height=served.sizes[size][0] if text else None, width=served.sizes[size][1] if text else None,
              num=n, seed=seed)
    return Generation(prompt, n, size, served.sizes[size], output_format, stream, partial, seed, method, negative,
                      sampling, timeout, job)
