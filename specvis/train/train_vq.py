"""Train a small LlamaGen-architecture VQ tokenizer on the emoji dataset (CPU, time-limited, resumable).

Loss: L1 + MSE reconstruction + codebook + 0.25 * commitment. Codes unused during the last
``--reinit-every`` steps are re-initialised from random encoder outputs of the current batch
(until 80% of the time budget). Every ``--ckpt-every`` seconds the full state goes to
``OUT/ckpt.pt``; rerunning the same command resumes from it. Losses go to ``OUT/losses.csv``,
periodic held-out PSNR to ``OUT/eval.csv``. At the end: ``OUT/report.json`` (held-out PSNR,
codebook usage and perplexity on the training split) and ``OUT/final/`` (``VQModel.save_pretrained``).

    python -m specvis.train.train_vq --data data/emoji --out runs/vq --minutes 25 --threads 1
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specvis.models.vq import VQConfig, VQModel
from specvis.train import atomic_write
from specvis.train.common import append_row, run_main, save_final
from specvis.train.emoji_data import augment, flip_safe, load_split

LOSS_FIELDS = ["step", "elapsed_s", "lr", "loss", "l1", "mse", "codebook", "commit", "usage", "perplexity"]


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> float (N, 3, H, W) in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """float (N, 3, H, W) in [-1, 1] -> uint8 (N, H, W, 3)."""
    x = images.detach().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-image PSNR in dB between uint8 image batches."""
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).reshape(len(a), -1).mean(1)
    return 10.0 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-10))


@torch.no_grad()
def reconstruct(model: VQModel, images: np.ndarray, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 reconstructions, codes (N, h*w)) of uint8 images, in eval mode."""
    was_training = model.training
    model.eval()
    recs, codes = [], []
    for i in range(0, len(images), batch_size):
        c = model.encode(to_tensor(images[i:i + batch_size]))
        codes.append(c)
        recs.append(to_uint8(model.decode(c)))
    model.train(was_training)
    return np.concatenate(recs), torch.cat(codes).numpy()


def code_stats(codes: np.ndarray, codebook_size: int) -> dict[str, float]:
    """Fraction of the codebook used and perplexity (exp entropy) of the code histogram."""
    return count_stats(np.bincount(np.asarray(codes).ravel(), minlength=codebook_size))


def count_stats(counts: np.ndarray) -> dict[str, float]:
    """Usage fraction and perplexity from per-code counts."""
    counts = np.asarray(counts, dtype=np.float64)
    p = counts / max(counts.sum(), 1.0)
    nz = p[p > 0]
    return {"usage": float((counts > 0).mean()), "perplexity": float(np.exp(-(nz * np.log(nz)).sum()))}


def lr_at(step: int, frac: float, base: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from base to base/10 over the time budget."""
    w = min(1.0, (step + 1) / max(1, warmup))
    return base * w * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))


def reinit_dead_codes(model: VQModel, counts: torch.Tensor, latents: torch.Tensor, gen: torch.Generator) -> int:
    """Replace codebook rows with zero count by random (jittered) latents; returns how many."""
    dead = torch.nonzero(counts == 0).flatten()
    if dead.numel() == 0:
        return 0
    pick = torch.randint(0, latents.shape[0], (dead.numel(),), generator=gen)
    new = latents[pick] + 0.01 * torch.randn(dead.numel(), latents.shape[1], generator=gen)
    if model.config.codebook_l2_norm:
        new = F.normalize(new, dim=-1)
    with torch.no_grad():
        model.quantize.embedding.weight[dead] = new
    return int(dead.numel())


def _trim_csv(path: Path, max_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    keep = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= max_step]
    atomic_write(path, lambda tmp: Path(tmp).write_text("".join(",".join(r) + "\n" for r in keep)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_vq", description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/emoji", help="dataset directory (train.npz, eval.npz)")
    p.add_argument("--out", default="runs/vq", help="run directory (checkpoints, logs, final model)")
    p.add_argument("--minutes", type=float, default=25.0, help="training time budget, summed over resumes")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--ch", type=int, default=32)
    p.add_argument("--ch-mult", default="1,2,2", help="encoder and decoder channel multipliers")
    p.add_argument("--num-res-blocks", type=int, default=1)
    p.add_argument("--z-channels", type=int, default=64)
    p.add_argument("--codebook-size", type=int, default=1024)
    p.add_argument("--codebook-dim", type=int, default=8)
    p.add_argument("--norm-groups", type=int, default=32)
    p.add_argument("--reinit-every", type=int, default=200, help="dead-code re-initialisation period (steps)")
    p.add_argument("--ckpt-every", type=float, default=60.0, help="checkpoint period (seconds)")
    p.add_argument("--eval-every", type=float, default=300.0, help="held-out PSNR period (seconds)")
    p.add_argument("--log-every", type=int, default=20, help="loss log period (steps)")
    p.add_argument("--no-augment", action="store_true", help="train on the raw images only")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("minutes", "threads", "batch_size", "lr", "ckpt_every", "eval_every", "log_every", "reinit_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    try:
        args.ch_mult = [int(x) for x in args.ch_mult.split(",")]
    except ValueError:
        p.error(f"--ch-mult must be comma-separated ints, got {args.ch_mult!r}")
    return args


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_x, _, train_cp = load_split(args.data, "train")
    eval_x, _, _ = load_split(args.data, "eval")
    flip_ok = flip_safe(train_cp)
    ckpt_path, loss_csv, eval_csv = out / "ckpt.pt", out / "losses.csv", out / "eval.csv"

    state = None
    if ckpt_path.exists() and not args.fresh:
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot read checkpoint {ckpt_path}: {exc}") from None
    if state is not None:
        cfg = VQConfig(**state["config"])
        print(f"resuming from {ckpt_path} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        cfg = VQConfig(codebook_size=args.codebook_size, codebook_embed_dim=args.codebook_dim, codebook_l2_norm=True,
                       encoder_ch_mult=args.ch_mult, decoder_ch_mult=args.ch_mult, z_channels=args.z_channels,
                       ch=args.ch, num_res_blocks=args.num_res_blocks, norm_groups=args.norm_groups)
        for path in (loss_csv, eval_csv):
            path.unlink(missing_ok=True)
    torch.manual_seed(args.seed)
    model = VQModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    step, elapsed, counts = 0, 0.0, torch.zeros(cfg.codebook_size)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, elapsed, counts = state["step"], state["elapsed"], state["counts"]
        _trim_csv(loss_csv, step)
    budget = args.minutes * 60.0
    n_params = sum(p.numel() for p in model.parameters())
    print(f"VQ {n_params / 1e6:.2f}M params, {len(train_x)} train / {len(eval_x)} eval images, "
          f"{cfg.codebook_size}x{cfg.codebook_embed_dim} codebook, budget {args.minutes} min", flush=True)

    def save_ckpt() -> None:
        blob = {"config": asdict(cfg), "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "step": step, "elapsed": elapsed, "counts": counts}
        atomic_write(ckpt_path, lambda tmp: torch.save(blob, tmp))

    def eval_psnr() -> float:
        rec, _ = reconstruct(model, eval_x)
        return float(psnr(eval_x, rec).mean())

    last_ckpt = last_eval = elapsed
    acc: dict[str, float] = {}
    acc_n = 0
    t_start = time.monotonic() - elapsed
    while elapsed < budget:
        idx = torch.randint(0, len(train_x), (args.batch_size,), generator=gen).numpy()
        batch = train_x[idx]
        if not args.no_augment:
            batch = augment(batch, seed=args.seed * 1_000_003 + step, flip=flip_ok[idx])
        x = to_tensor(batch)
        lr = lr_at(step, elapsed / budget, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        z = model.encode_latents(x)
        zq, codes, vq = model.quantize(z)
        recon = model.decoder(model.post_quant_conv(zq))
        l1, mse = (recon - x).abs().mean(), F.mse_loss(recon, x)
        loss = l1 + mse + vq["codebook"] + vq["commit"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        counts += torch.bincount(codes.flatten(), minlength=cfg.codebook_size).float()
        step += 1
        for k, v in (("loss", loss), ("l1", l1), ("mse", mse), ("codebook", vq["codebook"]), ("commit", vq["commit"])):
            acc[k] = acc.get(k, 0.0) + float(v.detach())
        acc_n += 1
        if step % args.reinit_every == 0:
            window = count_stats(counts.numpy())
            n_dead = 0
            if elapsed < 0.8 * budget:
                latents = model.quantize.prepare(z.detach()).reshape(-1, cfg.codebook_embed_dim)
                n_dead = reinit_dead_codes(model, counts, latents, gen)
            print(f"step {step} usage {window['usage']:.3f} ppl {window['perplexity']:.0f} reinit {n_dead}", flush=True)
            counts.zero_()
        elapsed = time.monotonic() - t_start
        if step % args.log_every == 0:
            hist = code_stats(codes.numpy(), cfg.codebook_size)
            row = {"step": step, "elapsed_s": round(elapsed, 1), "lr": f"{lr:.3g}",
                   **{k: f"{v / acc_n:.5f}" for k, v in acc.items()},
                   "usage": f"{hist['usage']:.4f}", "perplexity": f"{hist['perplexity']:.1f}"}
            append_row(loss_csv, LOSS_FIELDS, row)
            print(f"step {step} {elapsed / 60:.1f}min lr {lr:.2e} loss {row['loss']} l1 {row['l1']} "
                  f"mse {row['mse']} batch-usage {row['usage']}", flush=True)
            acc, acc_n = {}, 0
        if elapsed - last_eval >= args.eval_every:
            value = eval_psnr()
            append_row(eval_csv, ["step", "elapsed_s", "eval_psnr"], {"step": step, "elapsed_s": round(elapsed, 1),
                                                                      "eval_psnr": f"{value:.3f}"})
            print(f"step {step} eval PSNR {value:.2f} dB", flush=True)
            t_start += time.monotonic() - t_start - elapsed  # evaluation time is not training time
            last_eval = elapsed
        if elapsed - last_ckpt >= args.ckpt_every:
            save_ckpt()
            t_start += time.monotonic() - t_start - elapsed
            last_ckpt = elapsed
    save_ckpt()
    return finish(model, out, train_x, eval_x, step, elapsed, args)


def finish(model: VQModel, out: Path, train_x: np.ndarray, eval_x: np.ndarray, step: int, elapsed: float,
           args: argparse.Namespace) -> dict:
    """Evaluate, write report.json, a reconstruction grid and the final model."""
    model.eval()
    eval_rec, _ = reconstruct(model, eval_x)
    train_rec, train_codes = reconstruct(model, train_x)
    stats = code_stats(train_codes, model.config.codebook_size)
    report = {
        "eval_psnr_db": float(psnr(eval_x, eval_rec).mean()),
        "train_psnr_db": float(psnr(train_x, train_rec).mean()),
        "codebook_usage_train": stats["usage"],
        "codebook_perplexity_train": stats["perplexity"],
        "codebook_size": model.config.codebook_size,
        "steps": step, "batch_size": args.batch_size, "train_minutes": round(elapsed / 60.0, 2),
        "threads": args.threads, "num_train": len(train_x), "num_eval": len(eval_x),
        "params": sum(p.numel() for p in model.parameters()),
        "config": asdict(model.config), "tokens_per_image": int(train_codes.shape[1]),
    }
    from PIL import Image

    n = min(16, len(eval_x))
    grid = np.concatenate([np.concatenate(list(eval_x[:n]), 1), np.concatenate(list(eval_rec[:n]), 1)], 0)
    atomic_write(out / "recon_eval.png", lambda tmp: Image.fromarray(grid).save(tmp, format="PNG"))
    save_final(model, out, report, f"eval PSNR {report['eval_psnr_db']:.2f} dB, train usage {stats['usage']:.3f}, "
                                   f"perplexity {stats['perplexity']:.0f}")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(train, args)


if __name__ == "__main__":
    sys.exit(main())
