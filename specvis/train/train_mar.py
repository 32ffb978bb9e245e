"""Train a class-conditional MAR (target or CSpD draft) on continuous emoji tokens (CPU, time-limited,
resumable), writing the official ``checkpoint-last.pth`` layout.

Data: a ``--latents`` token file of :mod:`specvis.train.tokenize` (the emoji VQ's normalised
pre-quantisation latents, 16x16 positions of 8 channels, row-major: MAR's patchified layout with
``patch_size`` 1). Objective: MAR's own (``MAR.forward_train``: random order, one truncated-normal mask
ratio per batch on [mask_ratio_min, 1], the DiffLoss on the masked tokens, each repeated
``diffusion_batch_mul`` times, labels dropped to ``fake_latent`` with ``label_drop_prob``). The loop,
optimiser (AdamW 0.9/0.95, decay on matrices), warm-up + cosine schedule over the wall-clock budget,
clipping, logs, checkpoint/resume and signal handling are ``specvis.train.train_ar``'s (``fit``,
``make_optimizer``, ``open_run``, ``restore``, ``stoppable``).

EMA: after every optimiser step, ema = d ema + (1 - d) w with d = min(``--ema-rate``, (1 + step) /
(10 + step)) (the official 0.9999 would keep a ~1,000-step CPU run at its initial weights; the warm-up
form lets early steps count). Files in ``OUT``: ``ckpt.pt`` (full training state, resume),
``checkpoint-last.pth`` (official layout via ``MAR.save_checkpoint``: ``model``, ``model_ema``,
``epoch``, ``args``; written at every checkpoint; ``load_mar_checkpoint`` reads the EMA weights),
``losses.csv``, ``eval.csv``, ``report.json``.

Presets (same grid, token dimension and classes, so the draft can serve CSpD on the target): the
sampler respaces DiffLoss to 25 steps, ``clip_denoised`` = sqrt(8) (a normalised latent's channel
bound, as the continuous AR models use), dropout 0 (short runs underfit).

    python -m specvis.train.train_mar --tokens data/emoji_latents.npz --preset mar-emoji --out runs/mar_emoji --minutes 75
    python -m specvis.train.train_mar --tokens data/emoji_latents.npz --preset mar-emoji-draft --out runs/mar_emoji_draft --minutes 40
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from dataclasses import asdict

import numpy as np
import torch

from specvis.models.mar import CHECKPOINT_NAME, MAR, MARConfig
from specvis.train import atomic_write
from specvis.io import write_text
from specvis.train.common import machine_info, run_main
from specvis.train.train_ar import (StopFlag, add_loop_arguments, fit, load_tokens, make_optimizer, num_classes_of, open_run,
                                    restore, stoppable)

MODEL_PRESETS: dict[str, dict] = {
    "mar-emoji": dict(encoder_embed_dim=192, encoder_depth=3, encoder_num_heads=4, decoder_embed_dim=192,
                      decoder_depth=3, decoder_num_heads=4, diffloss_d=3, diffloss_w=256, buffer_size=16,
                      diffusion_batch_mul=2),
    "mar-emoji-draft": dict(encoder_embed_dim=96, encoder_depth=1, encoder_num_heads=2, decoder_embed_dim=96,
                            decoder_depth=2, decoder_num_heads=2, diffloss_d=2, diffloss_w=128, buffer_size=16,
                            diffusion_batch_mul=4),
}
TRAIN_PRESETS: dict[str, dict] = {
    "mar-emoji": {"batch_size": 16, "lr": 8e-4, "warmup": 100},
    "mar-emoji-draft": {"batch_size": 32, "lr": 1e-3, "warmup": 200},
}
COMMON = dict(patch_size=1, mlp_ratio=4.0, mask_ratio_min=0.7, label_drop_prob=0.1, attn_dropout=0.0,
              proj_dropout=0.0, num_sampling_steps=25, num_train_steps=1000)
VQ_STRIDE = 4  # the emoji VQ downsamples 64x64 images to 16x16 (informational in MARConfig)
EVAL_SEED = 1234


def build_config(preset: str, token_dim: int, num_classes: int, L: int, overrides: dict) -> MARConfig:
    side = math.isqrt(L)
    if side * side != L:
        raise ValueError(f"MAR needs a square grid of tokens, got {L} per image")
    fields = {**COMMON, **MODEL_PRESETS[preset], "img_size": side * VQ_STRIDE, "vae_stride": VQ_STRIDE,
              "vae_embed_dim": token_dim, "class_num": num_classes, "clip_denoised": token_dim ** 0.5,
              "model": preset, **overrides}
    try:
        return MARConfig(**fields)
    except TypeError as exc:
        raise ValueError(f"--config: {exc}") from None


class EMA:
    """Exponential moving average of a model's floating-point state (parameters and buffers)."""

    def __init__(self, model: torch.nn.Module, rate: float) -> None:
        self.model, self.rate, self.steps = model, rate, 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self) -> None:
        d = min(self.rate, (1 + self.steps) / (10 + self.steps))
        for k, v in self.model.state_dict().items():
            if v.dtype.is_floating_point:
                self.shadow[k].mul_(d).add_(v.detach(), alpha=1 - d)
            else:
                self.shadow[k].copy_(v)
        self.steps += 1

    def state(self) -> dict:
        return {"shadow": self.shadow, "steps": self.steps, "rate": self.rate}

    def load(self, state: dict) -> None:
        self.shadow = {k: v.clone() for k, v in state["shadow"].items()}
        self.steps = int(state["steps"])


@torch.no_grad()
def mean_loss(model: MAR, x: np.ndarray, labels: np.ndarray, batch_size: int = 64) -> float:
    """MAR's training loss on ``x`` (N, L, C) in eval mode (no label drop), fixed seed so evaluations compare."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(EVAL_SEED)
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb = torch.from_numpy(x[i:i + batch_size].astype(np.float32))
        yb = torch.from_numpy(labels[i:i + batch_size].astype(np.int64))
        total += float(model.forward_train(xb, yb, gen)) * len(xb)
        count += len(xb)
    model.train(was)
    return total / max(count, 1)


def fake_latents(path, n_train: int = 64, n_eval: int = 16, grid: int = 4, dim: int = 8, num_classes: int = 3,
                 seed: int = 0) -> None:
    """A small learnable latent ``.npz`` (class-dependent row patterns plus noise), for tests and smoke runs."""
    rng = np.random.default_rng(seed)
    proto = rng.normal(size=(num_classes, grid, dim))

    def split(n: int):
        labels = rng.integers(0, num_classes, n)
        x = np.repeat(proto[labels], grid, axis=1) + 0.3 * rng.normal(size=(n, grid * grid, dim))
        return x.astype(np.float16), labels.astype(np.int64)

    tx, tl = split(n_train)
    ex, el = split(n_eval)
    arrays = {"train_latents": tx, "train_labels": tl, "eval_latents": ex, "eval_labels": el,
              "grid": np.array([grid, grid], np.int64)}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    atomic_write(path, write)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_mar", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="data/emoji_latents.npz", help="latent .npz from specvis.train.tokenize --latents")
    p.add_argument("--preset", choices=sorted(MODEL_PRESETS), default="mar-emoji")
    add_loop_arguments(p, minutes=75.0, weight_decay=0.02)
    p.add_argument("--config", default="{}", help="JSON object of MARConfig fields overriding the preset")
    for name, kind in (("batch-size", int), ("lr", float), ("warmup", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help="override the preset")
    p.add_argument("--ema-rate", type=float, default=0.999)
    args = p.parse_args(argv)
    for key, value in TRAIN_PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.config = json.loads(args.config)
    except json.JSONDecodeError as exc:
        p.error(f"--config must be a JSON object: {exc}")
    if not isinstance(args.config, dict):
        p.error("--config must be a JSON object")
    for name in ("minutes", "threads", "batch_size", "lr", "ckpt_every", "eval_every", "log_every", "grad_clip"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 < args.ema_rate < 1.0:
        p.error("--ema-rate must be in (0, 1)")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return args


def _train(args: argparse.Namespace, stop: StopFlag) -> dict | None:
    """Run (or resume) training; the report (also ``OUT/report.json``), or None when stopped by a signal."""
    out, state = open_run(args)
    ckpt_path = out / "ckpt.pt"
    data = load_tokens(args.tokens, "latents")
    train_x, train_labels = data["train_latents"], data["train_labels"]
    eval_x, eval_labels = data["eval_latents"], data["eval_labels"]
    L, C = int(train_x.shape[1]), int(train_x.shape[2])
    if state is not None:
        cfg = MARConfig(**state["config"])
        hp = state["hparams"]
        print(f"resuming from {ckpt_path} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        cfg = build_config(args.preset, C, num_classes_of(data), L, args.config)
        hp = {k: getattr(args, k) for k in ("preset", "batch_size", "lr", "warmup", "weight_decay", "grad_clip",
                                            "ema_rate", "seed")}
        hp["class_dropout"] = cfg.label_drop_prob
    hp["minutes"] = args.minutes
    if (cfg.seq_len, cfg.token_embed_dim) != (L, C):
        raise ValueError(f"checkpoint expects {cfg.seq_len} tokens of {cfg.token_embed_dim} channels, "
                         f"the token file has {L} of {C}")

    torch.manual_seed(hp["seed"])
    model = MAR(cfg).train()
    opt = make_optimizer(model, hp["lr"], hp["weight_decay"])
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    ema = EMA(model, hp["ema_rate"])
    if state is None:
        hp["initial_eval_loss"] = mean_loss(model, eval_x, eval_labels)
    step, elapsed = restore(state, model, opt, gen, out)
    if state is not None:
        ema.load(state["ema"])
    opt.register_step_post_hook(lambda *_: ema.update())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{hp['preset']}: MAR {n_params / 1e6:.2f}M params (encoder {cfg.encoder_embed_dim}x{cfg.encoder_depth}, "
          f"decoder {cfg.decoder_embed_dim}x{cfg.decoder_depth}, DiffLoss {cfg.diffloss_w}x{cfg.diffloss_d}), "
          f"{cfg.class_num} classes, {len(train_x)} train / {len(eval_x)} eval grids of {L}x{C}, batch "
          f"{hp['batch_size']} x {cfg.diffusion_batch_mul}, lr {hp['lr']}, budget {args.minutes} min, "
          f"{args.threads} thread(s)", flush=True)

    def save_ckpt(step: int, elapsed: float) -> None:
        blob = {"config": asdict(cfg), "hparams": hp, "model": model.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "ema": ema.state(), "step": step, "elapsed": elapsed}
        atomic_write(ckpt_path, lambda tmp: torch.save(blob, tmp))
        atomic_write(out / CHECKPOINT_NAME, lambda tmp: model.save_checkpoint(tmp, ema_state_dict=ema.shadow))

    x_t = torch.from_numpy(train_x.astype(np.float32))
    y_t = torch.from_numpy(train_labels.astype(np.int64))
    done = fit(model, opt, gen, hp, args, step, elapsed, len(x_t), L,
               lambda idx: model.forward_train(x_t[idx], y_t[idx], gen),
               lambda: mean_loss(model, eval_x, eval_labels), save_ckpt, out, stop)
    if done is None:
        return None
    step, elapsed = done
    ema_model = copy.deepcopy(model)
    ema_model.load_state_dict(ema.shadow)
    report = {"preset": hp["preset"], "initial_eval_loss": hp["initial_eval_loss"],
              "final_eval_loss": mean_loss(model, eval_x, eval_labels),
              "final_eval_loss_ema": mean_loss(ema_model, eval_x, eval_labels),
              "steps": step, "train_minutes": round(elapsed / 60.0, 2), "budget_minutes": hp["minutes"],
              "hparams": hp, "params": n_params, "config": asdict(cfg), "tokens_file": str(args.tokens),
              "checkpoint": str(out / CHECKPOINT_NAME), "machine": machine_info(args.threads)}
    write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    print(f"eval loss {report['initial_eval_loss']:.4f} -> {report['final_eval_loss']:.4f} "
          f"(EMA {report['final_eval_loss_ema']:.4f}); {step} steps in {elapsed / 60:.1f} min; "
          f"wrote {out / CHECKPOINT_NAME} and {out / 'report.json'}", flush=True)
    return report


train = stoppable(_train)


def main(argv: list[str] | None = None) -> int:
    return run_main(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
