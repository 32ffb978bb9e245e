"""Checks of the public API's arguments: a bad value is one ValueError (or ``InputTypeError``) that
names the argument and the values it takes, raised before anything is loaded or allocated.

The pipelines (``pipe(...)``), ``specvis.generate``, ``specvis.load`` and the command line share these,
so the Python API and the CLI refuse the same things with the same words. A call's ``sampling`` is
checked by ``sampling.sampling_argument``, its ``method`` by ``registry.method_argument``, the options
of methods and rules by their declarations (``specvis.options``). This module imports nothing of specvis.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from typing import Any

import torch

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds in 0 .. 2**64 - 1


class InputTypeError(TypeError, ValueError):
    """An argument of the wrong type. A TypeError, and also a ValueError so that every caller that
    turns bad input into one line (the CLI, the demo page) catches it with the bad values."""


def one_line(exc: BaseException, limit: int | None = 300) -> str:
    """An error's message as one line, for the CLI and for errors that wrap another's message: its lines
    joined with spaces, cut at ``limit`` characters (None: whole). torch's weights-only refusal becomes
    its reason alone: its advice to load with ``weights_only=False`` is wrong for a file of unknown origin."""
    text = str(exc)
    if "Weights only load failed" in text:
        reason = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\n\s*\n|$)", text, re.S)
        detail = " ".join(reason.group(1).split()) if reason else ""
        text = f"not a plain tensor checkpoint{' (' + detail + ')' if detail else ''}"
    line = " ".join(text.split()) or type(exc).__name__
    return line if limit is None else line[:limit]


def shown(value: Any) -> str:
    text = repr(value)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(value).__name__})"


def integer(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int: ints (numpy's too) only, never a bool or a float such as 1.5 or 1.0;
    in ``low .. high`` where given."""
    span = f" in {low}..{high}" if low is not None and high is not None else (f" >= {low}" if low is not None else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputTypeError(f"{what} must be an integer{span}, got {shown(value)}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{what} must be an integer{span}, got {value}")
    return value


def number(value: Any, what: str, allowed: str) -> float:
    """``value`` as a finite float (ints and floats, numpy's too; never a bool or a string).
    ``allowed`` says what the caller then checks (e.g. ">= 0")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputTypeError(f"{what} must be a finite number {allowed}, got {shown(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number {allowed}, got {value}")
    return value


def progress(value: Any, what: str = "progress") -> Any:
    """A call's ``progress``: None or False (none), True (a bar on stderr) or a callable taking the
    fraction of the stream done."""
    if value is None or isinstance(value, bool) or callable(value):
        return value
    raise InputTypeError(f"{what} must be True, False, None or a callable taking the fraction done, got {shown(value)}")


def seed(value: Any, what: str = "seed") -> int:
    """A seed of ``torch.Generator.manual_seed``: an integer in 0 .. 2**64 - 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputTypeError(f"{what} must be an integer in 0..2**64-1, got {shown(value)}")
    if not 0 <= int(value) < SEED_LIMIT:
        raise ValueError(f"{what} must be an integer in 0..2**64-1, got {int(value)}")
    return int(value)


def device(value: Any, what: str = "device") -> torch.device:
    """A device this machine has: ``cpu``, ``cuda`` or ``cuda:N`` with N below the number of GPUs."""
    allowed = "cpu, cuda or cuda:N"
    if isinstance(value, torch.device):
        dev = value
    elif isinstance(value, str):
        try:
            dev = torch.device(value.strip())
        except (RuntimeError, ValueError):
            raise ValueError(f"{what} {value!r} is not a device: give {allowed}") from None
    else:
        raise InputTypeError(f"{what} must be {allowed}, got {shown(value)}")
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"{what} {str(dev)!r} is not supported: give {allowed}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"{what} {str(dev)!r}: {why}; use cpu")
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"{what} {str(dev)!r}: this machine has {count} CUDA device{'s' if count > 1 else ''} "
                         f"(cuda:0..cuda:{count - 1})")
    return dev


def model_name(value: Any, what: str = "name") -> str:
    """``sv.load``'s model: a non-empty bundle name, directory or Hub id (str or path)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InputTypeError(f"{what} must be a bundle name, a checkpoint directory or a Hub id (str), got {shown(value)}")
    if not value.strip():
        raise ValueError(f"{what} is empty: give a bundle name (specvis models), a checkpoint directory or a Hub id")
    return value


def class_ids(classes: Any, num_classes: int, what: str = "classes") -> list[int]:
    """A non-empty list of class ids in 0 .. num_classes - 1: a list, tuple or range of ints, or a
    1-D integer tensor / array (never bools, floats or strings)."""
    allowed = f"class ids in 0..{num_classes - 1}"
    if isinstance(classes, (torch.Tensor,)) or type(classes).__module__ == "numpy":
        if classes.ndim != 1 or classes.dtype in (torch.bool, bool) or not (
                (isinstance(classes, torch.Tensor) and not classes.is_floating_point() and not classes.is_complex())
                or (not isinstance(classes, torch.Tensor) and classes.dtype.kind in "iu")):
            raise InputTypeError(f"{what} must be a 1-D integer tensor or a list of {allowed}, got a "
                                 f"{classes.ndim}-D tensor of {classes.dtype}")
        classes = classes.tolist()
    if isinstance(classes, (str, bytes)) or not isinstance(classes, (list, tuple, range)):
        raise InputTypeError(f"{what} must be a list of {allowed}, got {shown(classes)}")
    if len(classes) == 0:
        raise ValueError(f"{what} is empty: give at least one of the {allowed}")
    out = []
    for i, c in enumerate(classes):
        if isinstance(c, bool) or not isinstance(c, numbers.Integral):
            raise InputTypeError(f"{what}[{i}] must be one of the {allowed}, got {shown(c)}")
        if not 0 <= int(c) < num_classes:
            raise ValueError(f"{what}[{i}] = {int(c)} is out of range: give {allowed}")
        out.append(int(c))
    return out


MAX_TEXT = 20_000  # characters of a prompt: far past any model's context (a few thousand tokens)


def text(value: Any, what: str, allow_empty: bool = False) -> str:
    """A text prompt: a str with some non-space character (unless ``allow_empty``: a negative prompt
    may be empty), valid Unicode (a command-line argument that was not UTF-8 arrives with lone
    surrogates, which no tokenizer takes)."""
    if not isinstance(value, str):
        raise InputTypeError(f"{what} must be a str, got {shown(value)}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{what} is empty: give some text")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} has {len(value)} characters, more than the {MAX_TEXT} a prompt may have")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid UTF-8 text") from None
    return value


# config.json keys that are sizes (at any depth: text_config, vq_config ...): each must be an integer in
# 1 .. MAX_SIZE, so that a zero never divides and a huge one never reaches an allocation
SIZE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "max_position_embeddings", "num_embeddings", "embed_dim", "projection_dim",
             "image_token_embed_dim", "codebook_size", "base_channels", "latent_channels", "num_res_blocks",
             "patch_size", "image_size", "num_patches", "num_image_tokens", "z_channels", "in_channels",
             "out_channels", "num_channels", "block_size")
MAX_SIZE = 2**24  # above every released model's largest size (vocabularies of ~2**18, contexts of ~2**17)


def config_sizes(config: dict, where: str, path: str = "") -> None:
    """Every ``SIZE_KEYS`` entry of ``config`` (nested dicts included; None allowed: the default) is an
    integer in 1 .. MAX_SIZE, else a one-line ValueError naming the key."""
    for key, value in config.items():
        name = f"{path}{key}"
        if isinstance(value, dict):
            config_sizes(value, where, f"{name}.")
        elif key in SIZE_KEYS and value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE):
            raise ValueError(f"{where}: {name} must be an integer in 1..{MAX_SIZE}, got {value!r}")
