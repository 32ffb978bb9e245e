"""Meta's Chameleon VQGAN image tokenizer (Anole, Lumina-mGPT) from its released files.

transformers' ``ChameleonVQVAE`` has the encoder and quantiser but no decoder, so this module builds
the whole VQGAN (taming-transformers architecture, as Meta's ``chameleon/inference/vqgan.py`` uses it)
from the files of Meta's release, which Anole and Lumina-mGPT ship or ask for unchanged:

- ``vqgan.yaml``: ``model.params`` with ``embed_dim`` (code vector size d), ``n_embed`` (codebook
  size V) and ``ddconfig`` (``ch``, ``ch_mult``, ``num_res_blocks``, ``attn_resolutions``,
  ``z_channels``, ``resolution``, ``in_channels``, ``out_ch``, ``dropout``, ``double_z``); other keys
  (``ckpt_path``, ``lossconfig``, ``target``, ...) are ignored, as Meta's loader ignores them;
- ``vqgan.ckpt``: a torch checkpoint whose ``state_dict`` holds ``encoder.*``, ``decoder.*``,
  ``quantize.embedding.weight``, ``quant_conv.*`` and ``post_quant_conv.*`` in the taming layout
  (``encoder.down.{i}.block.{j}``, ``encoder.down.{i}.attn.{j}``, ``encoder.down.{i}.downsample.conv``,
  ``encoder.mid.{block_1,attn_1,block_2}``, ``decoder.up.{i}.block.{j}`` (num_res_blocks + 1 per
  level), ``decoder.up.{i}.upsample.conv``, ``{encoder,decoder}.{conv_in,norm_out,conv_out}``). It is
  read with ``torch.load(weights_only=True)``; ``loss.*`` tensors (training losses) are ignored, any
  other difference from the architecture is an error;
- ``text_tokenizer.json``: the text vocabulary (``model.vocab``, name -> id) in which code c is the
  token ``IMGIMG`` + the decimal digits of c written with letters ``A``..``J`` + one closing letter
  (``Z``); :func:`image_token_ids` gives the BPE ids in code order (transformers'
  ``ChameleonImageVocabularyMapping`` derives the same mapping).

:func:`load_chameleon_vq` finds these files from a checkpoint directory (:data:`TOKENIZER_PLACES`) and
returns a :class:`ChameleonVQ` with the interface of ``specvis.models.hf_vq.HFVQDecoder``:
``decode(codes (B, h*w), height, width) -> (B, 3, f*h, f*w)`` in [-1, 1] (f = ``downsample``, 16 for
Chameleon), ``codebook`` (V, d), ``codebook_size``, ``downsample``; plus ``encode(images) -> codes``.

The encoder and decoder are taming's (``specvis.models.conv_blocks``, shared with MAR's KL-VAE); the
nearest-code quantiser is the LlamaGen VQ's (``specvis.models.vq``), without L2 normalisation. GroupNorms
have 32 groups, as in Meta's code, so every channel count must be a multiple of 32. PyYAML is needed
to read ``vqgan.yaml`` (it comes with transformers, ``pip install specvis[hf]``).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .base import code_grid
from ..checks import one_line
from .checkpoint import build_from_state_dict
from .loading import read_torch_file
from .conv_blocks import Decoder, Encoder
from .vq import Quantizer, VQConfig

__all__ = ["ChameleonVQ", "ChameleonVQConfig", "image_token_ids", "read_text_vocab", "read_vqgan_state_dict",
           "find_tokenizer_dir", "load_chameleon_vq", "TOKENIZER_PLACES"]

CONFIG_FILE, CKPT_FILE, VOCAB_FILE = "vqgan.yaml", "vqgan.ckpt", "text_tokenizer.json"
NORM_GROUPS = 32  # Meta's Normalize(): GroupNorm(32, C, eps=1e-6)
IGNORED_PREFIXES = ("loss.",)  # taming training losses (discriminator, LPIPS): not part of the tokenizer

# Where the tokenizer folder (vqgan.yaml + vqgan.ckpt [+ text_tokenizer.json]) is looked for, relative
# to the directory given to load_chameleon_vq, in this order:
TOKENIZER_PLACES = (
    ".",                        # the directory is the tokenizer folder itself
    "tokenizer",                # Meta's Chameleon download and GAIR/Anole-7b-v0.1: <root>/tokenizer/
    "chameleon/tokenizer",      # Lumina-mGPT's ckpts/ folder: ckpts/chameleon/tokenizer/
    "../tokenizer",             # a converted checkpoint saved next to the tokenizer folder
    "../chameleon/tokenizer",   # Lumina-mGPT: ckpts/Lumina-mGPT-7B-768/ next to ckpts/chameleon/tokenizer/
    "../../tokenizer",          # Meta / Anole: <root>/models/7b/ -> <root>/tokenizer/
)


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"vqgan config: {name} must be a positive int, got {value!r}")
    return value


@dataclass
class ChameleonVQConfig:
    """The VQGAN's hyper-parameters, named as in ``vqgan.yaml`` (``model.params`` + its ``ddconfig``).
    Defaults are those of transformers' ``ChameleonVQVAEConfig`` (Chameleon's 8192 x 256 codebook)."""

    embed_dim: int = 256
    n_embed: int = 8192
    z_channels: int = 256
    resolution: int = 512
    in_channels: int = 3
    out_ch: int = 3
    ch: int = 128
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    attn_resolutions: list[int] = field(default_factory=list)
    dropout: float = 0.0
    attn_type: str = "vanilla"  # "none": no attention blocks (taming's identity attention)
    tanh_out: bool = False

    def __post_init__(self) -> None:
        for name in ("embed_dim", "n_embed", "z_channels", "resolution", "in_channels", "out_ch", "ch",
                     "num_res_blocks"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.ch_mult, (list, tuple)) or not self.ch_mult:
            raise ValueError(f"vqgan config: ch_mult must be a non-empty list, got {self.ch_mult!r}")
        self.ch_mult = [_positive_int("ch_mult entries", m) for m in self.ch_mult]
        attn = self.attn_resolutions if self.attn_resolutions is not None else []
        if not isinstance(attn, (list, tuple)):
            raise ValueError(f"vqgan config: attn_resolutions must be a list, got {attn!r}")
        self.attn_resolutions = [_positive_int("attn_resolutions entries", r) for r in attn]
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % NORM_GROUPS]
        if bad:
            raise ValueError(f"vqgan config: channel count {bad[0]} (ch * ch_mult) is not a multiple of "
                             f"the {NORM_GROUPS} GroupNorm groups")
        if self.attn_type not in ("vanilla", "none"):
            raise ValueError(f"vqgan config: attn_type {self.attn_type!r} is not supported (vanilla or none)")
        p = self.dropout
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
            raise ValueError(f"vqgan config: dropout must be in [0, 1), got {self.dropout!r}")
        self.tanh_out = bool(self.tanh_out)

    @property
    def downsample(self) -> int:
        """Pixels per token side."""
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "vqgan config") -> "ChameleonVQConfig":
        """From the parsed ``vqgan.yaml`` (``{"model": {"params": ...}}``) or its ``params`` mapping."""
        params = doc
        if isinstance(doc, dict) and "model" in doc:
            params = doc["model"].get("params") if isinstance(doc["model"], dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("ddconfig"), dict):
            raise ValueError(f"{where}: expected model.params with embed_dim, n_embed and ddconfig")
        dd = params["ddconfig"]
        # taming options that would change the network: only the values Chameleon's VQGAN uses
        fixed = {"double_z": False, "resamp_with_conv": True, "give_pre_end": False, "use_linear_attn": False}
        for key, want in fixed.items():
            if key in dd and bool(dd[key]) != want:
                raise ValueError(f"{where}: ddconfig.{key}={dd[key]!r} is not supported (only {want})")
        if params.get("remap") is not None:
            raise ValueError(f"{where}: quantiser index remapping (params.remap) is not supported")
        missing = [k for k in ("embed_dim", "n_embed") if k not in params] + \
                  [f"ddconfig.{k}" for k in ("z_channels", "ch", "ch_mult", "num_res_blocks", "resolution")
                   if k not in dd]
        if missing:
            raise ValueError(f"{where}: missing {missing[0]}")
        kwargs = {"embed_dim": params["embed_dim"], "n_embed": params["n_embed"]}
        for key in ("z_channels", "resolution", "in_channels", "out_ch", "ch", "ch_mult", "num_res_blocks",
                    "attn_resolutions", "dropout", "attn_type", "tanh_out"):
            if key in dd:
                kwargs[key] = dd[key]
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"{where}: {one_line(exc).removeprefix('vqgan config: ')}") from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "ChameleonVQConfig":
        try:
            import yaml
        except ImportError:
            raise ImportError("reading vqgan.yaml needs PyYAML: pip install pyyaml (or specvis[hf])") from None
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except FileNotFoundError:
            raise ValueError(f"VQGAN config not found: {path}") from None
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
            raise ValueError(f"unreadable VQGAN config {path}: {one_line(exc)}") from None
        return cls.from_dict(doc, str(path))


# --------------------------------------------------------------------------- model


class ChameleonVQ(nn.Module):
    """Chameleon's VQGAN: images in [-1, 1] <-> (B, h*w) row-major codes in [0, n_embed).

    Parameter names equal the ``state_dict`` of Meta's ``vqgan.ckpt``. ``grid`` is the default (h, w)
    of :meth:`decode` (none: square codes). ``image_token_ids`` (set by :func:`load_chameleon_vq` when
    the tokenizer folder has ``text_tokenizer.json``) lists the text-vocabulary id of each code."""

    def __init__(self, config: ChameleonVQConfig | None = None, grid: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.config = cfg = config if config is not None else ChameleonVQConfig()
        vanilla = cfg.attn_type == "vanilla"
        shape = dict(ch=cfg.ch, ch_mult=cfg.ch_mult, num_res_blocks=cfg.num_res_blocks, resolution=cfg.resolution,
                     attn_resolutions=cfg.attn_resolutions if vanilla else [], groups=NORM_GROUPS,
                     dropout=cfg.dropout, mid_attention=vanilla)
        self.encoder = Encoder(in_channels=cfg.in_channels, out_channels=cfg.z_channels, **shape)
        self.decoder = Decoder(in_channels=cfg.z_channels, out_channels=cfg.out_ch, tanh_out=cfg.tanh_out, **shape)
        # the nearest-code quantiser of the LlamaGen VQ, without its L2 normalisation (Chameleon has none)
        self.quantize = Quantizer(VQConfig(codebook_size=cfg.n_embed, codebook_embed_dim=cfg.embed_dim,
                                            codebook_l2_norm=False))
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        self.image_token_ids: list[int] | None = None
        self.eval()

    # ---- properties (the HFVQDecoder interface)
    @property
    def codebook(self) -> torch.Tensor:
        """(V, d) code vectors as decoding consumes them (``quantize.embedding`` rows); detached."""
        return self.quantize.embedding.weight.detach()

    @property
    def codebook_size(self) -> int:
        return self.config.n_embed

    @property
    def downsample(self) -> int:
        """Pixels per token side."""
        return self.config.downsample

    # ---- encode / decode
    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, in_channels, H, W) in [-1, 1], H and W multiples of ``downsample`` -> LongTensor
        codes (B, h*w), row-major: encoder, quant_conv, nearest codebook row by squared distance."""
        cfg, f = self.config, self.downsample
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != cfg.in_channels:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a float tensor (B, {cfg.in_channels}, H, W), got {shape}")
        if not images.is_floating_point():
            raise ValueError(f"images must be a float tensor in [-1, 1], got dtype {images.dtype}")
        if images.shape[2] % f or images.shape[3] % f:
            raise ValueError(f"images height and width must be multiples of {f}, got {tuple(images.shape[2:])}")
        weight = self.quant_conv.weight
        z = self.quant_conv(self.encoder(images.to(weight.device, weight.dtype)))
        return self.quantize.lookup(self.quantize.prepare(z)).flatten(1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, height: int | None = None, width: int | None = None) -> torch.Tensor:
        """Codes (B, height*width), row-major, in [0, codebook_size) -> images (B, out_ch, height*f,
        width*f) clamped to [-1, 1] (f = ``downsample``), on the decoder's device. Without
        height/width: ``grid``, else a square."""
        h, w = code_grid(codes, height, width, self.grid)
        B = codes.shape[0]
        emb = self.quantize.embedding.weight
        codes = codes.to(emb.device).long()
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        z = emb[codes].view(B, h, w, -1).permute(0, 3, 1, 2).contiguous()
        return self.decoder(self.post_quant_conv(z)).clamp(-1.0, 1.0)

    # ---- loading
    @classmethod
    def from_files(cls, config_path: str | os.PathLike, ckpt_path: str | os.PathLike,
                   grid: tuple[int, int] | None = None, *, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> "ChameleonVQ":
        """Build from ``vqgan.yaml`` and load ``vqgan.ckpt`` (every tensor but ``loss.*`` must match),
        memory-mapped and streamed into ``dtype`` on ``device``."""
        cfg = ChameleonVQConfig.from_yaml(config_path)
        sd = read_vqgan_state_dict(ckpt_path)
        # one-line errors for missing, unexpected, mis-shaped
        return build_from_state_dict(lambda: cls(cfg, grid), sd, str(ckpt_path), dtype=dtype, device=device)


# --------------------------------------------------------------------------- files


def read_vqgan_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a ``vqgan.ckpt`` (``{"state_dict": {...}, ...}`` or a bare state dict), opened with
    ``weights_only=True`` and memory-mapped, ``loss.*`` dropped. Problems raise one-line ValueErrors."""
    try:
        obj = read_torch_file(path)
    except (FileNotFoundError, IsADirectoryError):
        raise ValueError(f"VQGAN checkpoint not found: {path}") from None
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found:
            raise ValueError(f"{path}: a weights_only torch.load refuses the Python object {found.group(1)} in it; "
                             "re-save just its tensors, torch.save({'state_dict': sd}, path), where the file is "
                             "trusted") from None
        raise ValueError(f"unreadable VQGAN checkpoint {path}: {one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"unreadable VQGAN checkpoint {path}: not a torch checkpoint file "
                         f"({type(exc).__name__})") from None
    sd = obj.get("state_dict") if isinstance(obj, dict) and "state_dict" in obj else obj
    if not isinstance(sd, dict) or not sd or not all(isinstance(k, str) for k in sd):
        raise ValueError(f"{path}: expected a checkpoint with a state_dict of tensors")
    out = {k: v for k, v in sd.items() if not k.startswith(IGNORED_PREFIXES)}
    bad = [k for k, v in out.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"{path}: state_dict entry {bad[0]!r} is not a tensor")
    return out


def read_text_vocab(path: str | os.PathLike) -> dict[str, int]:
    """``model.vocab`` (token name -> id) of a tokenizers ``text_tokenizer.json``."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"text tokenizer not found: {path}") from None
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"unreadable text tokenizer {path}: {one_line(exc)}") from None
    vocab = doc.get("model", {}).get("vocab") if isinstance(doc, dict) and isinstance(doc.get("model"), dict) else None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in vocab.values()):
        raise ValueError(f"{path}: expected a tokenizers JSON with a model.vocab mapping of names to ids")
    return vocab


_DIGIT_OF = {chr(ord("A") + d): str(d) for d in range(10)}


def image_token_ids(vocab: dict[str, int] | str | os.PathLike, where: str | None = None) -> list[int]:
    """Text-vocabulary ids of the image tokens in code order: ``ids[c]`` is the BPE id of VQ code c.

    ``vocab`` is a name -> id mapping or the path of ``text_tokenizer.json``. An image token is a name
    starting with ``IMGIMG``; its code is the text between that prefix and the last character with
    letters A..J read as digits 0..9. The codes must be exactly 0 .. n-1."""
    if not isinstance(vocab, dict):
        where = where or str(vocab)
        vocab = read_text_vocab(vocab)
    where = where or "vocabulary"
    ids: dict[int, int] = {}
    for name, bpe in vocab.items():
        if not name.startswith("IMGIMG"):
            continue
        digits = "".join(_DIGIT_OF.get(c, c) for c in name[len("IMGIMG"):-1])
        if not re.fullmatch(r"[0-9]+", digits):
            raise ValueError(f"{where}: image token {name!r} does not spell a code")
        code = int(digits)
        if code in ids:
            raise ValueError(f"{where}: two image tokens for code {code}")
        ids[code] = int(bpe)
    if not ids:
        raise ValueError(f"{where}: no IMGIMG image tokens in the vocabulary")
    missing = sorted(set(range(len(ids))) - set(ids))
    if missing:
        raise ValueError(f"{where}: image tokens do not cover codes 0..{len(ids) - 1} (no code {missing[0]})")
    return [ids[c] for c in range(len(ids))]


def find_tokenizer_dir(directory: str | os.PathLike) -> Path:
    """The first of :data:`TOKENIZER_PLACES` under ``directory`` holding ``vqgan.yaml`` or ``vqgan.ckpt``
    (it must then hold both); a one-line ValueError when there is none."""
    base = Path(directory)
    if not base.is_dir():
        raise ValueError(f"not a directory: {base}")
    for place in TOKENIZER_PLACES:
        cand = (base / place).resolve() if place != "." else base
        present = [name for name in (CONFIG_FILE, CKPT_FILE) if (cand / name).is_file()]
        if len(present) == 2:
            return cand
        if present:
            other = CKPT_FILE if present[0] == CONFIG_FILE else CONFIG_FILE
            raise ValueError(f"{cand} has {present[0]} but no {other}")
    raise ValueError(f"no Chameleon VQGAN tokenizer (vqgan.yaml + vqgan.ckpt) in {base} or its "
                     f"{', '.join(p for p in TOKENIZER_PLACES if p != '.')} folders; put Meta's tokenizer/ "
                     "folder next to or inside the checkpoint")


def load_chameleon_vq(directory: str | os.PathLike, device: str | torch.device | None = None,
                      dtype: torch.dtype | None = None, grid: tuple[int, int] | None = None) -> ChameleonVQ:
    """The VQGAN of the Chameleon tokenizer folder found from ``directory`` (:func:`find_tokenizer_dir`),
    with ``image_token_ids`` from its ``text_tokenizer.json`` when present (it must then list one image
    token per code). ``grid`` is the default (h, w) of ``decode`` (none: square codes)."""
    folder = find_tokenizer_dir(directory)
    model = ChameleonVQ.from_files(folder / CONFIG_FILE, folder / CKPT_FILE, grid, device=device or "cpu",
                                   dtype=dtype or torch.float32)
    vocab_file = folder / VOCAB_FILE
    if vocab_file.is_file():
        ids = image_token_ids(vocab_file)
        if len(ids) != model.codebook_size:
            raise ValueError(f"{vocab_file}: {len(ids)} image tokens for a codebook of {model.codebook_size}")
        model.image_token_ids = ids
    return model
