"""VQ image decoders of Hugging Face ``transformers`` checkpoints (Janus-Pro, Emu3) as specvis tokenizers.

A checkpoint directory in the transformers layout (``config.json`` plus ``model.safetensors`` or
``model.safetensors.index.json`` and its shards) holds the whole multimodal model; the VQ model is
the sub-tree ``model.vqmodel.*`` (Janus) or ``vqmodel.*`` (Emu3, see ``VQ_PREFIXES``). ``load_hf_vq`` reads only those tensors (only the shards that hold
them) into transformers' own ``JanusVQVAE`` / ``Emu3VQVAE`` and wraps it as ``HFVQDecoder``:

- ``decode(codes (B, h*w), height, width) -> images (B, 3, H, W)`` clamped to [-1, 1], codes
  row-major in [0, codebook_size);
- ``codebook``: the (V, d) code vectors as the decoder consumes them. Janus (LlamaGen VQ-16) looks
  codes up and L2-normalises each row (``JanusVQVAEVectorQuantizer.get_codebook_entry``), so its
  codebook is the normalised embedding table; Emu3 uses ``quantize.embedding`` rows as they are.

Janus's own ``JanusVQVAE.decode`` only accepts its native square grid (``vq_config.num_patches``);
``decode`` here runs the same modules (lookup, normalise, ``post_quant_conv``, ``decoder``) on any
grid. Emu3 goes through ``Emu3VQVAE.decode`` (a one-frame video, any grid).

transformers is imported lazily: specvis itself does not depend on it (``pip install specvis[hf]``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import code_grid
from .loading import Piece, load_safetensors, safetensors_files, safetensors_index, skeleton

__all__ = ["HFVQDecoder", "load_hf_vq", "read_vq_state_dict", "VQ_PREFIXES"]

# transformers 5 module names put the VQ model at ``model.vqmodel``; Emu3 checkpoints store it as
# ``vqmodel.*`` (the layout of transformers 4.x, which 5.x still writes back on save through its
# checkpoint conversion mapping), Janus as ``model.vqmodel.*``.
VQ_PREFIXES = ("model.vqmodel.", "vqmodel.")
_FAMILIES = {"janus": ("JanusVQVAE", "JanusVQVAEConfig"), "emu3": ("Emu3VQVAE", "Emu3VQVAEConfig")}
_INSTALL_HINT = "specvis.models.hf_vq needs Hugging Face transformers: pip install specvis[hf]"


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # one line, actionable
        raise ImportError(_INSTALL_HINT) from exc
    return transformers


def _read_config(path: Path) -> dict:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json (not a transformers checkpoint directory)")
    with open(cfg_file) as f:
        cfg = json.load(f)
    family = cfg.get("model_type")
    if family not in _FAMILIES:
        raise ValueError(f"{path}: model_type {family!r} is not one of {sorted(_FAMILIES)}")
    if not isinstance(cfg.get("vq_config"), dict):
        raise ValueError(f"{path}/config.json has no vq_config")
    return cfg


def _weight_map(path: Path) -> dict[str, str]:
    """Checkpoint key -> safetensors file name (single file or sharded through the index)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    with safe_open(str(single), framework="pt") as f:
        return {key: single.name for key in f.keys()}


def read_vq_state_dict(path: str | Path, prefixes: tuple[str, ...] = VQ_PREFIXES) -> dict[str, torch.Tensor]:
    """The VQ model's tensors from the checkpoint's safetensors, under the first of ``prefixes`` that
    has any, with the prefix stripped; only the shards holding them are opened."""
    from safetensors import safe_open

    path = Path(path)
    weight_map = _weight_map(path)
    for prefix in prefixes:
        keys = [k for k in weight_map if k.startswith(prefix)]
        if keys:
            break
    else:
        raise ValueError(f"{path}: no tensors under any of {list(prefixes)} in the checkpoint")
    by_file: dict[str, list[str]] = {}
    for key in keys:
        by_file.setdefault(weight_map[key], []).append(key)
    out: dict[str, torch.Tensor] = {}
    for fname, names in by_file.items():
        if not (path / fname).is_file():
            raise ValueError(f"{path}: the index names {fname}, which holds VQ weights and is missing")
        try:
            with safe_open(str(path / fname), framework="pt") as f:
                for key in names:
                    out[key[len(prefix):]] = f.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise ValueError(f"{path / fname}: unreadable safetensors ({first})") from None
    return out


class HFVQDecoder(nn.Module):
    """A transformers VQ model (``JanusVQVAE`` or ``Emu3VQVAE``) behind specvis's tokenizer interface."""

    def __init__(self, vq: nn.Module, family: str, grid: tuple[int, int] | None = None) -> None:
        super().__init__()
        if family not in _FAMILIES:
            raise ValueError(f"family must be one of {sorted(_FAMILIES)}, got {family!r}")
        self.vq = vq.eval()
        self.family = family
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))

    @property
    def codebook_size(self) -> int:
        return int(self.vq.quantize.embedding.weight.shape[0])

    @property
    def downsample(self) -> int:
        """Pixels per token side."""
        return 2 ** (len(self.vq.config.channel_multiplier) - 1)

    @property
    def codebook(self) -> torch.Tensor:
        """(V, d) code vectors as decoding consumes them (Janus: L2-normalised rows); detached."""
        weight = self.vq.quantize.embedding.weight.detach()
        return F.normalize(weight, p=2, dim=-1) if self.family == "janus" else weight

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, height: int | None = None, width: int | None = None) -> torch.Tensor:
        """Codes (B, height*width), row-major, in [0, codebook_size) -> images (B, 3, height*f, width*f)
        in [-1, 1] (f = ``downsample``). Without height/width: the checkpoint's grid, else a square."""
        h, w = code_grid(codes, height, width, self.grid)
        B = codes.shape[0]
        emb = self.vq.quantize.embedding.weight
        codes = codes.to(emb.device).long()
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        if self.family == "janus":
            z = F.normalize(F.embedding(codes, emb), p=2, dim=-1)
            z = z.view(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
            images = self.vq.decoder(self.vq.post_quant_conv(z))
        else:
            images = self.vq.decode(codes.view(B, h, w))
        return images.clamp(-1.0, 1.0)


def load_hf_vq(path: str | Path, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, grid: tuple[int, int] | None = None) -> HFVQDecoder:
    """The VQ decoder of a transformers Janus / Emu3 checkpoint directory (``vq_config`` of its
    config.json, the VQ tensors of its safetensors, streamed from the shards that hold them into
    ``dtype`` (default fp32) on ``device``: ``models.loading``). ``grid`` is the default (h, w) of
    ``decode``; Janus defaults to its native ``num_patches`` square, Emu3 to none (square codes)."""
    transformers = _transformers()
    path = Path(path)
    cfg = _read_config(path)
    family = cfg["model_type"]
    model_name, config_name = _FAMILIES[family]
    vq_cls = getattr(transformers, model_name)
    vq_config = getattr(transformers, config_name).from_dict(cfg["vq_config"])
    files = safetensors_files(path)
    keys = safetensors_index(files)
    prefix = next((p for p in VQ_PREFIXES if any(k.startswith(p) for k in keys)), None)
    if prefix is None:
        raise ValueError(f"{path}: no tensors under any of {list(VQ_PREFIXES)} in the checkpoint")
    vq = skeleton(lambda: vq_cls(vq_config))
    route = lambda k: (Piece(k[len(prefix):]),) if k.startswith(prefix) else ()  # noqa: E731
    load_safetensors(vq, files, route, dtype or torch.float32, device or "cpu", f"{path} ({vq_cls.__name__})")
    if grid is None and family == "janus":
        side = int(cfg["vq_config"].get("num_patches", 0))
        grid = (side, side) if side > 0 else None
    return HFVQDecoder(vq, family, grid)
