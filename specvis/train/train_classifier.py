"""Train the small emoji classifier behind the benchmark's ``fid_proxy`` and ``class_accuracy``.

CPU, time-limited (``--minutes`` of wall time summed over resumes), resumable from ``OUT/ckpt.pt``.
Augmentation: random scale/shift/flip (``emoji_data.augment``, flips only where harmless) and, on a
third of each batch, a down-up resampling blur so that decoded (VQ-blurred) images stay in
distribution. AdamW, linear warm-up then cosine decay over the time budget, label smoothing 0.1.

At the end ``OUT/final/`` holds ``model.safetensors`` + ``config.json`` (``EmojiClassifier``) with
the held-out images' features stored as the ``fid_proxy`` reference, and ``OUT/report.json`` the
held-out accuracy (overall and per class) and the proxy's real-vs-real floor (train vs held-out).

    python -m specvis.train.train_classifier --data data/emoji --out runs/classifier --minutes 8 --threads 1
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

from specvis.bench.quality import ClassifierConfig, EmojiClassifier, classifier_outputs, frechet_distance, to_input
from specvis.io import atomic_write, write_text
from specvis.train.common import run_main, save_final
from specvis.train.emoji_data import CLASSES, augment, flip_safe, load_split

EVAL_FIELDS = ["step", "epoch", "elapsed_s", "lr", "train_loss", "eval_accuracy"]


def blur_some(x: torch.Tensor, frac: float, gen: torch.Generator) -> torch.Tensor:
    """Down-up (factor 2) bilinear resampling on a random ``frac`` of the batch."""
    pick = torch.rand(x.shape[0], generator=gen) < frac
    if pick.any():
        s = x.shape[-1]
        low = F.interpolate(x[pick], size=(s // 2, s // 2), mode="bilinear", antialias=True, align_corners=False)
        x = x.clone()
        x[pick] = F.interpolate(low, size=(s, s), mode="bilinear", align_corners=False)
    return x


def lr_at(step: int, frac: float, base: float, warmup: int = 100) -> float:
    return base * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def accuracy(model: EmojiClassifier, images: np.ndarray, labels: np.ndarray) -> tuple[float, list[float]]:
    """Overall and per-class accuracy."""
    _, logits = classifier_outputs(model, images)
    hit = logits.argmax(1) == labels
    per = [float(hit[labels == k].mean()) if (labels == k).any() else float("nan") for k in range(model.config.num_classes)]
    return float(hit.mean()), per


def vq_reconstructions(vq_dir: str, images: np.ndarray) -> np.ndarray:
    """Images passed through a trained VQ tokenizer (encode + decode)."""
    from specvis.models.vq import VQModel

    vq = VQModel.from_pretrained(vq_dir).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(images), 32):
            rec = vq.decode(vq.encode(to_input(images[i:i + 32])))
            out.append(rec.clamp(-1, 1).add(1).mul(127.5).round().byte().permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tr_x, tr_y, tr_cp = load_split(args.data, "train")
    ev_x, ev_y, _ = load_split(args.data, "eval")
    num_classes = int(max(tr_y.max(), ev_y.max()) + 1)
    torch.manual_seed(args.seed)
    model = EmojiClassifier(ClassifierConfig(num_classes=num_classes, image_size=tr_x.shape[1]))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step, epoch, elapsed = 0, 0, 0.0
    ckpt = out / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, epoch, elapsed = int(state["step"]), int(state["epoch"]), float(state["elapsed"])
        print(f"resumed from {ckpt} at step {step} ({elapsed:.0f}s)", flush=True)
    budget = args.minutes * 60.0
    flippable = flip_safe(tr_cp)
    gen = torch.Generator().manual_seed(args.seed)
    log = out / "eval.csv"
    if not log.exists():
        write_text(log, ",".join(EVAL_FIELDS) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"classifier: {n_params / 1e3:.0f}K parameters, {len(tr_x)} train / {len(ev_x)} held-out images, "
          f"{num_classes} classes, budget {args.minutes} min", flush=True)
    t0, last_ckpt = time.time() - elapsed, time.time()
    done = elapsed >= budget
    while not done:
        model.train()
        x_all = to_input(augment(tr_x, seed=args.seed * 100003 + epoch, flip=flippable))
        order = torch.randperm(len(tr_x), generator=gen)
        losses = []
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            if len(idx) < 2:
                continue
            frac = (time.time() - t0) / budget
            for g in opt.param_groups:
                g["lr"] = lr_at(step, frac, args.lr)
            x = blur_some(x_all[idx], 1 / 3, gen)
            loss = F.cross_entropy(model(x), torch.from_numpy(tr_y[idx.numpy()]), label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if time.time() - t0 >= budget:
                done = True
                break
        epoch += 1
        acc, _ = accuracy(model, ev_x, ev_y)
        now = time.time() - t0
        with open(log, "a", newline="") as f:
            csv.writer(f).writerow([step, epoch, f"{now:.1f}", f"{opt.param_groups[0]['lr']:.3g}",
                                    f"{np.mean(losses):.4f}", f"{acc:.4f}"])
        print(f"epoch {epoch:3d} step {step:5d} {now:5.0f}s loss {np.mean(losses):.3f} held-out acc {acc:.3f}", flush=True)
        if time.time() - last_ckpt >= args.ckpt_every or done:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch, "elapsed": now}
            atomic_write(ckpt, lambda p: torch.save(state, p))
            last_ckpt = time.time()
    return finish(model, args, tr_x, tr_y, ev_x, ev_y, step, epoch, time.time() - t0, n_params)


def finish(model: EmojiClassifier, args: argparse.Namespace, tr_x: np.ndarray, tr_y: np.ndarray, ev_x: np.ndarray,
           ev_y: np.ndarray, step: int, epoch: int, seconds: float, n_params: int) -> dict:
    """Evaluate, store the reference features, write ``final/`` and ``report.json``."""
    out = Path(args.out)
    model.eval()
    acc, per_class = accuracy(model, ev_x, ev_y)
    train_acc, _ = accuracy(model, tr_x, tr_y)
    ev_f, _ = classifier_outputs(model, ev_x)
    tr_f, _ = classifier_outputs(model, tr_x)
    model.set_reference(torch.from_numpy(ev_f), torch.from_numpy(ev_y))
    names = [c.name for c in CLASSES] if model.config.num_classes == len(CLASSES) else [str(k) for k in range(model.config.num_classes)]
    report = {
        "heldout_accuracy": acc, "train_accuracy": train_acc,
        "heldout_accuracy_per_class": dict(zip(names, per_class)),
        "n_train": int(len(tr_x)), "n_heldout": int(len(ev_x)), "parameters": n_params,
        "steps": step, "epochs": epoch, "train_seconds": round(seconds, 1), "threads": args.threads,
        "config": asdict(model.config),
        "fid_proxy_train_vs_heldout": frechet_distance(tr_f, ev_f),
    }
    if args.vq:
        rec = vq_reconstructions(args.vq, ev_x)
        rec_f, rec_logits = classifier_outputs(model, rec)
        report["vq_reconstruction"] = {"vq": str(args.vq), "heldout_accuracy": float((rec_logits.argmax(1) == ev_y).mean()),
                                       "fid_proxy_vs_heldout": frechet_distance(rec_f, ev_f)}
    save_final(model, out, report, f"held-out accuracy {acc:.3f} (train {train_acc:.3f})")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_classifier", description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/emoji")
    p.add_argument("--out", default="runs/classifier")
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=float, default=60.0, help="seconds between checkpoints")
    p.add_argument("--vq", help="optional VQ model directory: also report accuracy on its reconstructions")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.threads < 1 or args.batch_size < 2:
        print("error: --minutes must be > 0, --threads >= 1, --batch-size >= 2", file=sys.stderr)
        return 2
    return run_main(train, args)


if __name__ == "__main__":
    sys.exit(main())
