"""Reading official torch checkpoints and our safetensors model directories."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..checks import one_line
from ..io import atomic_write, read_text, regular_file
from .loading import identity_route, load_safetensors, load_state_dict_file, read_torch_file, skeleton

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def read_state_dict(path: str | os.PathLike, prefer: tuple[str, ...] = ("ema", "model", "state_dict"),
                    ignore: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Open a torch checkpoint safely and memory-mapped (``torch.load(mmap=True, weights_only=True)``;
    LlamaGen's training files also carry an ``argparse.Namespace``): no tensor data is read until a
    tensor is used. Unwrap the first of ``prefer`` present, strip ``_orig_mod.``/``module.``
    prefixes and drop keys ending in any of ``ignore``. Unreadable files raise one-line ValueErrors."""
    try:
        obj = read_torch_file(path, allowed=[argparse.Namespace])
    except FileNotFoundError:
        raise ValueError(f"checkpoint not found: {path}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"unreadable checkpoint {path}: not a torch checkpoint file ({type(exc).__name__})") from None
    if isinstance(obj, dict):
        for key in prefer:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict of tensors (or a dict holding one under {'/'.join(prefer)})")
    out = {}
    for key, value in obj.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        key = key.replace("._orig_mod.", ".")
        if not (ignore and key.endswith(ignore)):
            out[key] = value
    return out


def build_from_state_dict(factory: Callable[[], nn.Module], sd: dict[str, torch.Tensor], where: str, *,
                          dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                          rename: Callable[[str], str] = lambda k: k, skip: Callable[[str], bool] = lambda k: False,
                          finish=None, display: Callable[[str], str] = lambda n: n) -> nn.Module:
    """``factory()`` built without initialisation and filled from ``sd`` (``read_state_dict``'s
    memory-mapped tensors, key ``k`` into ``rename(k)``, ``skip`` keys left out), in ``dtype`` on
    ``device``, eval mode; one-line errors for missing, unexpected or mis-shaped tensors (our names
    spelt as the file spells them by ``display``, the inverse of ``rename``)."""
    model = skeleton(factory)
    load_state_dict_file(model, sd, identity_route(rename, skip), dtype, device, where, finish, display)
    return model.eval()


def load_pretrained(factory: Callable[[dict[str, Any]], nn.Module], directory: str | os.PathLike, *,
                    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", finish=None) -> nn.Module:
    """A directory written by ``save_pretrained``: ``factory(config)`` built without initialisation,
    ``model.safetensors`` streamed into it in ``dtype`` on ``device`` (eval mode)."""
    d = Path(directory)
    try:
        config = json.loads(read_text(d / CONFIG_NAME, "config"))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot read model directory {d}: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{d / CONFIG_NAME} must hold a JSON object")
    if not (d / WEIGHTS_NAME).is_file():
        raise ValueError(f"cannot read model directory {d}: no {WEIGHTS_NAME}")
    model = skeleton(lambda: factory(config))
    load_safetensors(model, [d / WEIGHTS_NAME], identity_route(), dtype, device, str(d), finish)
    return model.eval()


def stored_dtype(directory: str | os.PathLike) -> torch.dtype | None:
    """The floating dtype a ``save_pretrained`` directory stores its weights in."""
    from .loading import safetensors_dtype

    return safetensors_dtype([Path(directory) / WEIGHTS_NAME])


def load_strict(model: nn.Module, sd: dict[str, torch.Tensor], where: str) -> None:
    """load_state_dict with one-line errors for missing, unexpected or mis-shaped tensors."""
    own = model.state_dict()
    check_tensors(own, sd, where)
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in sd.items()})


def check_tensors(own: dict[str, torch.Tensor], sd: dict[str, torch.Tensor], where: str) -> None:
    """Same names and shapes as ``own``, or a one-line ValueError naming the first difference."""
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing:
        raise ValueError(f"{where}: checkpoint lacks {len(missing)} tensors, e.g. {missing[0]!r}")
    if unexpected:
        raise ValueError(f"{where}: checkpoint has {len(unexpected)} unexpected tensors, e.g. {unexpected[0]!r}")
    for key, value in sd.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(f"{where}: shape mismatch for {key!r}: file {tuple(value.shape)} vs model {tuple(own[key].shape)}")


def save_pretrained(model: nn.Module, config: dict[str, Any], directory: str | os.PathLike,
                    dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` (optionally cast, e.g. fp16 for shipping)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu()
        tensors[k] = (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
    atomic_write(out / WEIGHTS_NAME, lambda p: save_file(tensors, p))
    text = json.dumps(config, indent=2)
    atomic_write(out / CONFIG_NAME, lambda p: Path(p).write_text(text))


def read_pretrained(directory: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config dict, tensors) of a directory written by ``save_pretrained``."""
    from safetensors.torch import load_file

    d = Path(directory)
    try:
        config = json.loads(read_text(d / CONFIG_NAME, "config"))
        regular_file(d / WEIGHTS_NAME, "weights")
        tensors = load_file(str(d / WEIGHTS_NAME))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot read model directory {d}: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{d / CONFIG_NAME} must hold a JSON object")
    return config, tensors
