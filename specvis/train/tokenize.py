"""Turn the emoji dataset into VQ token sequences for training the AR models.

For every training image: the original, its horizontal mirror (where :func:`flip_safe` allows it)
and ``--augment`` randomly shifted/scaled/flipped copies; the eval split is encoded as is.
Output ``.npz`` (written atomically):

- ``train_codes`` int16 (M, h*w), ``train_labels`` int64 (M,), ``train_source`` int64 (M,) index of the
  source image in ``train.npz``, ``train_variant`` int64 (M,): 0 original, 1 mirror, 2.. augmented copy
- ``eval_codes`` int16 (N, h*w), ``eval_labels`` int64 (N,), ``eval_codepoints`` int64 (N,)
- ``grid`` int64 [h, w], ``codebook_size`` int64, ``meta`` (JSON string: vq path, augment count, seed)

With ``--latents`` the same images become continuous tokens for ``ContinuousAR`` instead:
``train_latents``/``eval_latents`` float16 (M, h*w, d), the VQ encoder's pre-quantisation latents,
L2-normalised as the quantiser sees them and multiplied by sqrt(d) so each channel has about unit
scale (what the diffusion head's noise schedule assumes). The VQ decoder renders them after the
scale is undone by the L2 normalisation of ``VQModel.decode_continuous``: 23.4 dB held-out PSNR against
22.3 dB for the quantised codes (docs/training.md).

    python -m specvis.train.tokenize --vq runs/vq/final --data data/emoji --out data/emoji_tokens.npz --augment 8
    python -m specvis.train.tokenize --latents --vq runs/vq/final --out data/emoji_latents.npz --augment 8
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specvis.models.vq import VQModel
from specvis.train import atomic_write
from specvis.train.emoji_data import augment, flip_safe, load_split


def load_vq(path: str | Path) -> VQModel:
    """A VQModel from a ``save_pretrained`` directory or an official checkpoint file."""
    p = Path(path)
    if p.is_dir():
        return VQModel.from_pretrained(p)
    if p.is_file():
        return VQModel.from_checkpoint(p)
    raise ValueError(f"vq path {p} does not exist")


def to_input(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, 3) -> float (N, 3, H, W) in [-1, 1], the VQ's input."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 127.5 - 1


@torch.no_grad()
def _encode_batches(model: VQModel, images: np.ndarray, batch_size: int, encode, empty_shape: tuple, dtype) -> np.ndarray:
    """``encode(x)`` over ``images`` in batches of ``batch_size``, concatenated (eval mode)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    out = [encode(to_input(images[i:i + batch_size])).numpy() for i in range(0, len(images), batch_size)]
    return np.concatenate(out).astype(dtype) if out else np.zeros((0, *empty_shape), dtype)


def encode_images(model: VQModel, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """uint8 images (N, H, W, 3) -> int16 codes (N, h*w)."""
    if model.config.codebook_size > np.iinfo(np.int16).max + 1:
        raise ValueError(f"codebook_size {model.config.codebook_size} does not fit int16 codes")
    side = images.shape[1] // model.downsample
    return _encode_batches(model, images, batch_size, model.encode, (side * side,), np.int16)


def encode_latent_tokens(model: VQModel, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """uint8 images (N, H, W, 3) -> float16 continuous tokens (N, h*w, d): normalised latents * sqrt(d)."""
    d = model.config.codebook_embed_dim
    side = images.shape[1] // model.downsample

    def encode(x: torch.Tensor) -> torch.Tensor:
        return (F.normalize(model.encode_latents(x), dim=1) * d ** 0.5).flatten(2).transpose(1, 2)

    return _encode_batches(model, images, batch_size, encode, (side * side, d), np.float16)


@torch.no_grad()
def reconstruction_psnr(model: VQModel, images: np.ndarray) -> dict[str, float]:
    """Mean PSNR (dB, images in [-1, 1]) of the VQ reconstructions through the codes and through the
    continuous latent tokens: how well the decoder renders what each AR family models."""
    x = to_input(images)

    def psnr(y: torch.Tensor) -> float:
        return float((10 * torch.log10(4.0 / ((y - x) ** 2).mean(dim=(1, 2, 3)))).mean())

    tokens = torch.from_numpy(encode_latent_tokens(model, images).astype(np.float32))
    return {"codes": psnr(model.decode(model.encode(x))), "latents": psnr(model.decode_continuous(tokens))}


def tokenize_split(model: VQModel, images: np.ndarray, labels: np.ndarray, codepoints: np.ndarray,
                   copies: int, seed: int, flip: bool = True, batch_size: int = 64,
                   encode=encode_images) -> dict[str, np.ndarray]:
    """Codes for originals, mirrors (flip-safe images only) and ``copies`` augmented versions."""
    if copies < 0:
        raise ValueError(f"augment copies must be >= 0, got {copies}")
    n = len(images)
    mask = flip_safe(codepoints) if flip else np.zeros(n, dtype=bool)
    parts: list[tuple[np.ndarray, np.ndarray, int]] = [(images, np.arange(n), 0)]  # (images, source index, variant)
    if mask.any():
        idx = np.flatnonzero(mask)
        parts.append((images[idx][:, :, ::-1], idx, 1))
    for j in range(copies):
        parts.append((augment(images, seed=seed * 1_000_003 + j, flip=mask), np.arange(n), 2 + j))
    codes, source, variant = [], [], []
    for imgs, src, var in parts:
        codes.append(encode(model, imgs, batch_size))
        source.append(src)
        variant.append(np.full(len(src), var, np.int64))
    source_all = np.concatenate(source)
    return {"codes": np.concatenate(codes), "labels": np.asarray(labels, np.int64)[source_all],
            "source": source_all.astype(np.int64), "variant": np.concatenate(variant)}


def build_tokens(model: VQModel, data_dir: str | Path, copies: int, seed: int = 0, flip: bool = True,
                 batch_size: int = 64, latents: bool = False) -> dict[str, np.ndarray]:
    """Everything written to the output ``.npz`` (see module docstring); ``latents``: continuous tokens."""
    tx, tl, tc = load_split(data_dir, "train")
    ex, el, ec = load_split(data_dir, "eval")
    f = model.downsample
    if tx.shape[1] % f or tx.shape[2] % f:
        raise ValueError(f"image size {tx.shape[1:3]} is not a multiple of the VQ downsampling {f}")
    encode, kind = (encode_latent_tokens, "latents") if latents else (encode_images, "codes")
    train = tokenize_split(model, tx, tl, tc, copies, seed, flip, batch_size, encode)
    meta = {"vq_codebook_size": model.config.codebook_size, "augment": copies, "seed": seed, "flip": flip,
            "data": str(data_dir), "kind": kind, "eval_psnr": reconstruction_psnr(model, ex)}
    return {
        f"train_{kind}": train["codes"], "train_labels": train["labels"], "train_source": train["source"],
        "train_variant": train["variant"],
        f"eval_{kind}": encode(model, ex, batch_size), "eval_labels": el, "eval_codepoints": ec,
        "grid": np.array([tx.shape[1] // f, tx.shape[2] // f], np.int64),
        "codebook_size": np.array(model.config.codebook_size, np.int64),
        "meta": np.array(json.dumps(meta)),
    }


def save_tokens(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    atomic_write(path, write)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.tokenize", description=__doc__.split("\n")[0])
    p.add_argument("--vq", default="runs/vq/final", help="VQ model directory (save_pretrained) or checkpoint file")
    p.add_argument("--data", default="data/emoji", help="dataset directory")
    p.add_argument("--out", default="data/emoji_tokens.npz", help="output .npz")
    p.add_argument("--augment", type=int, default=8, help="augmented copies per training image")
    p.add_argument("--latents", action="store_true", help="continuous tokens (normalised pre-quantisation latents) instead of codes")
    p.add_argument("--no-flip", action="store_true", help="no mirrored copies and no flips in augmentation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    try:
        model = load_vq(args.vq)
        arrays = build_tokens(model, args.data, args.augment, args.seed, not args.no_flip, args.batch_size, args.latents)
        arrays["meta"] = np.array(json.dumps({**json.loads(str(arrays["meta"])), "vq": str(args.vq)}))
        save_tokens(args.out, arrays)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = "latents" if args.latents else "codes"
    print(f"wrote {args.out}: train {arrays[f'train_{kind}'].shape}, eval {arrays[f'eval_{kind}'].shape}, "
          f"grid {tuple(int(v) for v in arrays['grid'])}, codebook {int(arrays['codebook_size'])}; held-out PSNR "
          + ", ".join(f"{k} {v:.2f} dB" for k, v in json.loads(str(arrays["meta"]))["eval_psnr"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
