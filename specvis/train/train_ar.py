"""Train a class-conditional AR model (target or draft) on token sequences (CPU, time-limited, resumable).

Two families, chosen by the preset: LlamaGen on VQ codes (``target``, ``draft``), objective next-token
cross-entropy over all image tokens, ``forward_train(labels, codes[:, :-1])`` predicting ``codes``; and
``ContinuousAR`` on continuous tokens (``continuous-target``, ``continuous-draft``, a ``--latents`` file
of :mod:`specvis.train.tokenize`), objective the diffusion head's loss (epsilon MSE + iDDPM variance
term) on every token given z from [class, x_<i], each token repeated ``--batch-mul`` times with its own
diffusion step and noise (MAR). Labels are replaced by the null class with probability ``--class-dropout`` so that
classifier-free guidance works. AdamW (0.9, 0.95), weight decay on matrices only, linear warm-up then
cosine decay (to lr/10) over the wall-clock budget, gradient clipping at 1.0.

The budget (``--minutes``) is wall time summed over resumes (evaluation and checkpoints included).
Every ``--ckpt-every`` seconds (and on SIGTERM/SIGINT, which then stop the run) the full state goes
to ``OUT/ckpt.pt``; rerunning the same command resumes, a larger ``--minutes`` extends the budget. Logs: ``OUT/losses.csv`` (training loss), ``OUT/eval.csv`` (held-out loss on ``eval_codes``).
At the end: ``OUT/final/`` (``model.safetensors`` + ``config.json``, ``LlamaGen.from_pretrained``)
and ``OUT/report.json``.

    python -m specvis.train.train_ar --tokens data/emoji_tokens.npz --preset target --out runs/target --minutes 70
    python -m specvis.train.train_ar --tokens data/emoji_latents.npz --preset continuous-target --out runs/continuous_target
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Self

import numpy as np
import torch
import torch.nn.functional as F

from specvis.models.continuous import ContinuousAR, ContinuousARConfig
from specvis.models.llamagen import LlamaGen, LlamaGenConfig
from specvis.train import atomic_write
from specvis.train.common import append_row, drop_rows_after, machine_info, run_main, save_final

# Model shapes and optimisation defaults; throughput on one CPU thread is in docs/training.md.
PRESETS: dict[str, dict] = {
    "target": {"dim": 256, "n_layer": 5, "n_head": 4, "multiple_of": 32, "batch_size": 16, "lr": 8e-4, "warmup": 100},
    "draft": {"dim": 96, "n_layer": 2, "n_head": 2, "multiple_of": 32, "batch_size": 32, "lr": 1e-3, "warmup": 200},
    "continuous-target": {"dim": 256, "n_layer": 5, "n_head": 4, "multiple_of": 32, "batch_size": 16, "lr": 8e-4,
                          "warmup": 100},  # head: HEAD_DEFAULTS
    "continuous-draft": {"dim": 96, "n_layer": 2, "n_head": 2, "multiple_of": 32, "batch_size": 32, "lr": 1e-3,
                         "warmup": 200, "head_width": 128, "head_depth": 2, "batch_mul": 4},
}
HEAD_DEFAULTS = {"head_width": 256, "head_depth": 3, "batch_mul": 4}  # continuous presets; unused by LlamaGen
EVAL_BATCH_MUL = 4  # diffusion copies per token in held-out losses (fixed seed)
SAMPLING_STEPS = 25  # respaced reverse steps of the continuous models' heads (1000 training steps)
LOSS_FIELDS = ["step", "elapsed_s", "lr", "loss", "grad_norm", "tokens_per_s"]
EVAL_FIELDS = ["step", "elapsed_s", "train_loss", "eval_loss"]


# ---------------------------------------------------------------- data
def load_tokens(path: str | os.PathLike, kind: str = "codes") -> dict[str, np.ndarray]:
    """Arrays of a token ``.npz`` from :mod:`specvis.train.tokenize`: train/eval ``kind`` ("codes" with
    codebook_size, or "latents") and labels."""
    try:
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ValueError(f"token file not found: {path}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"unreadable token file {path}: {type(exc).__name__}") from None
    needed = (f"train_{kind}", "train_labels", f"eval_{kind}", "eval_labels") + (("codebook_size",) if kind == "codes" else ())
    for key in needed:
        if key not in data:
            hint = " (continuous presets need a --latents token file)" if kind == "latents" else ""
            raise ValueError(f"{path}: missing array {key!r}{hint}")
    ndim = 2 if kind == "codes" else 3
    if data[f"train_{kind}"].ndim != ndim or len(data[f"train_{kind}"]) != len(data["train_labels"]):
        raise ValueError(f"{path}: train_{kind} must have {ndim} dimensions with one label per row")
    return data


def num_classes_of(data: dict[str, np.ndarray]) -> int:
    """Number of classes: one more than the largest train/eval label."""
    return int(max(data["train_labels"].max(initial=0), data["eval_labels"].max(initial=0))) + 1


def fake_tokens(path: str | os.PathLike, n_train: int = 64, n_eval: int = 16, vocab: int = 32,
                grid: int = 4, num_classes: int = 3, seed: int = 0) -> None:
    """A small learnable token ``.npz`` (class-dependent stripes plus 10% noise) for tests and smoke runs."""
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, num_classes, n)
        rows = np.arange(grid * grid) // grid
        codes = (labels[:, None] * 5 + rows[None] + rng.integers(0, 2, (n, 1))) % vocab
        noise = rng.random(codes.shape) < 0.1
        codes = np.where(noise, rng.integers(0, vocab, codes.shape), codes)
        return codes.astype(np.int16), labels.astype(np.int64)

    tc, tl = split(n_train)
    ec, el = split(n_eval)
    arrays = {"train_codes": tc, "train_labels": tl, "eval_codes": ec, "eval_labels": el,
              "grid": np.array([grid, grid], np.int64), "codebook_size": np.array(vocab, np.int64)}
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    atomic_write(path, write)


# ---------------------------------------------------------------- model and optimiser
def build_config(args: argparse.Namespace, vocab: int, num_classes: int, block_size: int) -> LlamaGenConfig:
    return LlamaGenConfig(vocab_size=vocab, dim=args.dim, n_layer=args.n_layer, n_head=args.n_head,
                          multiple_of=args.multiple_of, num_classes=num_classes, block_size=block_size,
                          class_dropout_prob=args.class_dropout)


def build_continuous_config(args: argparse.Namespace, token_dim: int, num_classes: int, L: int) -> ContinuousARConfig:
    side = math.isqrt(L)
    if side * side != L:
        raise ValueError(f"continuous tokens must form a square grid, got {L} per image")
    return ContinuousARConfig(token_dim=token_dim, height=side, width=side, dim=args.dim, n_layer=args.n_layer,
                              n_head=args.n_head, multiple_of=args.multiple_of, num_classes=num_classes,
                              class_dropout_prob=args.class_dropout, head_width=args.head_width,
                              head_depth=args.head_depth, num_sampling_steps=SAMPLING_STEPS,
                              clip_denoised=token_dim ** 0.5)  # latent tokens have norm sqrt(C): |channel| <= sqrt(C)


def is_continuous(preset: str) -> bool:
    return preset.startswith("continuous")


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (linear and embedding weights) only."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def lr_schedule(step: int, frac: float, base: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps times a cosine from 1 to 0.1 over the budget fraction ``frac``."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    return base * warm * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, frac)))))


def drop_labels(labels: torch.Tensor, null: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Replace each label by ``null`` with probability ``p`` (classifier-free guidance training)."""
    mask = torch.rand(labels.shape, generator=gen) < p
    return torch.where(mask, torch.full_like(labels, null), labels)


def sequence_loss(model: LlamaGen, labels: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all ``L`` codes given the condition and the previous codes."""
    logits, _ = model.forward_train(labels, codes[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), codes.reshape(-1))


def as_tensor(x: np.ndarray) -> torch.Tensor:
    """Codes as int64, continuous tokens as float32."""
    return torch.from_numpy(x.astype(np.int64 if np.issubdtype(x.dtype, np.integer) else np.float32))


def batch_loss(model: LlamaGen | ContinuousAR, labels: torch.Tensor, x: torch.Tensor, batch_mul: int,
               gen: torch.Generator) -> torch.Tensor:
    """Cross-entropy (LlamaGen) or diffusion loss with ``batch_mul`` copies per token (ContinuousAR,
    which in training mode also drops labels to the null class itself, with ``gen``)."""
    if isinstance(model, ContinuousAR):
        return model.loss(labels, x, batch_mul, gen)
    return sequence_loss(model, labels, x)


def train_loss(model: LlamaGen | ContinuousAR, labels: torch.Tensor, x: torch.Tensor, hp: dict,
               gen: torch.Generator) -> torch.Tensor:
    """One training batch's loss, labels dropped to the null class with probability ``class_dropout``."""
    if not isinstance(model, ContinuousAR):
        labels = drop_labels(labels, model.null_condition, hp["class_dropout"], gen)
    return batch_loss(model, labels, x, hp.get("batch_mul", 1), gen)


@torch.no_grad()
def mean_loss(model: LlamaGen | ContinuousAR, codes: np.ndarray, labels: np.ndarray, batch_size: int = 64) -> float:
    """Token-averaged loss of ``codes`` under their true labels, in eval mode: cross-entropy (nats) for
    LlamaGen, the diffusion loss for ContinuousAR (fixed noise seed, so evaluations compare)."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    total, count = 0.0, 0
    for i in range(0, len(codes), batch_size):
        c = as_tensor(codes[i:i + batch_size])
        y = torch.from_numpy(labels[i:i + batch_size].astype(np.int64))
        total += float(batch_loss(model, y, c, EVAL_BATCH_MUL, gen)) * len(c)
        count += len(c)
    model.train(was)
    return total / max(count, 1)


def load_model(directory: str | os.PathLike) -> LlamaGen | ContinuousAR:
    """A trained model from ``OUT/final`` (``model.safetensors`` + ``config.json``), in eval mode."""
    config = json.loads((Path(directory) / "config.json").read_text())
    return (ContinuousAR if "token_dim" in config else LlamaGen).from_pretrained(directory)


# ---------------------------------------------------------------- logs
# ---------------------------------------------------------------- training
def add_loop_arguments(p: argparse.ArgumentParser, minutes: float, weight_decay: float) -> None:
    """The options of :func:`fit`'s loop that every trainer takes (run directory, budget, optimiser
    extras, checkpoint/eval/log periods, resume)."""
    p.add_argument("--out", required=True, help="run directory (checkpoint, logs, final model, report)")
    p.add_argument("--minutes", type=float, default=minutes, help="wall-clock budget, summed over resumes")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--weight-decay", type=float, default=weight_decay)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--ckpt-every", type=float, default=180.0, help="checkpoint period (seconds)")
    p.add_argument("--eval-every", type=float, default=300.0, help="held-out loss period (seconds)")
    p.add_argument("--log-every", type=int, default=10, help="training-loss log period (steps)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (tests, smoke runs)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --out")
    p.add_argument("--seed", type=int, default=0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_ar", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="data/emoji_tokens.npz", help="token .npz from specvis.train.tokenize")
    p.add_argument("--preset", choices=sorted(PRESETS), default="target", help="model size and optimiser defaults")
    add_loop_arguments(p, minutes=70.0, weight_decay=0.05)
    for name, kind in (("dim", int), ("n-layer", int), ("n-head", int), ("multiple-of", int),
                       ("batch-size", int), ("lr", float), ("warmup", int), ("head-width", int),
                       ("head-depth", int), ("batch-mul", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help="override the preset")
    p.add_argument("--class-dropout", type=float, default=0.1, help="probability of the null condition")
    args = p.parse_args(argv)
    for key, value in {**HEAD_DEFAULTS, **PRESETS[args.preset]}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("minutes", "threads", "dim", "n_layer", "n_head", "multiple_of", "batch_size", "lr",
                 "ckpt_every", "eval_every", "log_every", "grad_clip", "head_width", "head_depth", "batch_mul"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 < args.class_dropout < 1.0:
        p.error("--class-dropout must be in (0, 1): the null class is needed for guidance")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return args


class StopFlag:
    """Set by SIGTERM/SIGINT: the loop checkpoints after the current step and exits without finishing."""

    def __init__(self) -> None:
        self.set = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> Self:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no signal handling
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.set = True

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def stoppable(run: Callable[[argparse.Namespace, "StopFlag"], dict | None]) -> Callable[[argparse.Namespace], dict | None]:
    """``train(args)`` of a trainer from its ``run(args, stop)``: SIGTERM/SIGINT set ``stop``, the loop
    checkpoints and ``train`` returns None (rerun the same command to resume)."""
    def train(args: argparse.Namespace) -> dict | None:
        with StopFlag() as stop:
            return run(args, stop)

    train.__doc__ = run.__doc__
    return train


def open_run(args: argparse.Namespace) -> tuple[Path, dict | None]:
    """What every trainer does first: set the thread count, create ``OUT`` and read ``OUT/ckpt.pt``
    (the state to resume, None for a fresh run)."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, read_checkpoint(out / "ckpt.pt", args.fresh)


def _train(args: argparse.Namespace, stop: StopFlag) -> dict | None:
    """Run (or resume) training; returns the report written to ``OUT/report.json``, or None when
    stopped by SIGTERM/SIGINT (state checkpointed: rerun to resume, e.g. with a larger ``--minutes``)."""
    out, state = open_run(args)
    ckpt_path = out / "ckpt.pt"
    continuous = is_continuous(state["hparams"]["preset"] if state is not None else args.preset)
    kind = "latents" if continuous else "codes"
    data = load_tokens(args.tokens, kind)
    train_codes, train_labels = data[f"train_{kind}"], data["train_labels"]
    eval_codes, eval_labels = data[f"eval_{kind}"], data["eval_labels"]
    L = int(train_codes.shape[1])
    vocab = int(train_codes.shape[2]) if continuous else int(data["codebook_size"])  # token_dim when continuous
    if not continuous and (int(train_codes.max()) >= vocab or int(train_codes.min()) < 0):
        raise ValueError(f"{args.tokens}: codes outside [0, {vocab})")
    model_cls, config_cls = (ContinuousAR, ContinuousARConfig) if continuous else (LlamaGen, LlamaGenConfig)
    if state is not None:
        cfg = config_cls(**state["config"])
        hp = state["hparams"]  # the run keeps the hyper-parameters it started with
        print(f"resuming from {ckpt_path} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        build = build_continuous_config if continuous else build_config
        cfg = build(args, vocab, num_classes_of(data), L)
        hp = {k: getattr(args, k) for k in ("preset", "batch_size", "lr", "warmup", "weight_decay", "class_dropout",
                                            "grad_clip", "seed", "minutes") + (("batch_mul",) if continuous else ())}
    hp["minutes"] = args.minutes  # the budget may be extended on resume
    shape = (cfg.token_dim, cfg.height * cfg.width) if continuous else (cfg.vocab_size, cfg.block_size)
    if shape != (vocab, L):
        raise ValueError(f"checkpoint expects vocab/token_dim and length {shape}, tokens have {(vocab, L)}")

    torch.manual_seed(hp["seed"])
    model = model_cls(cfg).train()
    opt = make_optimizer(model, hp["lr"], hp["weight_decay"])
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    step, elapsed = restore(state, model, opt, gen, out)
    n_params = sum(p.numel() for p in model.parameters())
    B = hp["batch_size"]
    print(f"{hp['preset']}: {model_cls.__name__} {n_params / 1e6:.2f}M params (dim {cfg.dim}, {cfg.n_layer} layers, "
          f"{cfg.n_head} heads), {'token dim' if continuous else 'vocab'} {vocab}, {cfg.num_classes} classes, "
          f"{len(train_codes)} train / {len(eval_codes)} eval sequences of {L}, batch {B}, lr {hp['lr']}, "
          f"budget {args.minutes} min, {args.threads} thread(s)", flush=True)

    def save_ckpt(step: int, elapsed: float) -> None:
        blob = {"config": model.config_dict(), "hparams": hp, "model": model.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "step": step, "elapsed": elapsed}
        atomic_write(ckpt_path, lambda tmp: torch.save(blob, tmp))

    codes_t = as_tensor(train_codes)
    labels_t = torch.from_numpy(train_labels.astype(np.int64))
    done = fit(model, opt, gen, hp, args, step, elapsed, len(codes_t), L,
               lambda idx: train_loss(model, labels_t[idx], codes_t[idx], hp, gen),
               lambda: mean_loss(model, eval_codes, eval_labels), save_ckpt, out, stop)
    if done is None:
        return None
    step, elapsed = done
    return finish(model, out, train_codes, train_labels, eval_codes, eval_labels, step, elapsed, hp, args, n_params)


train = stoppable(_train)


def read_checkpoint(path: Path, fresh: bool) -> dict | None:
    """The training state at ``path`` (None when absent or ``fresh``); an unreadable one is a ValueError."""
    if fresh or not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot read checkpoint {path}: {exc}") from None


def restore(state: dict | None, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
            out: Path) -> tuple[int, float]:
    """Load model, optimiser and generator state and cut the logs back to the checkpoint's step;
    (step, elapsed seconds), (0, 0.0) for a fresh run (whose logs are removed)."""
    logs = (out / "losses.csv", out / "eval.csv")
    if state is None:
        for path in logs:
            path.unlink(missing_ok=True)
        return 0, 0.0
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["gen"])
    for path in logs:
        drop_rows_after(path, state["step"])
    return state["step"], state["elapsed"]


def fit(model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, hp: dict, args: argparse.Namespace,
        step: int, elapsed: float, n_train: int, tokens_per_row: int, batch_loss_of, eval_loss_of, save_ckpt,
        out: Path, stop: StopFlag) -> tuple[int, float] | None:
    """The time-limited loop shared by the trainers: batches of ``hp["batch_size"]`` random rows
    (``batch_loss_of(idx)``), the warm-up + cosine schedule, clipping, loss/eval logs, periodic
    checkpoints (``save_ckpt(step, elapsed)``). Returns (step, elapsed) after a final checkpoint, or
    None when stopped by a signal (checkpointed)."""
    loss_csv, eval_csv = out / "losses.csv", out / "eval.csv"
    budget = args.minutes * 60.0
    B, L = hp["batch_size"], tokens_per_row
    t0 = time.monotonic() - elapsed
    last_ckpt = last_eval = elapsed
    run_loss, run_n, recent = 0.0, 0, float("nan")
    t_log, step_log = time.monotonic(), step
    while elapsed < budget and (args.max_steps is None or step < args.max_steps):
        idx = torch.randint(0, n_train, (B,), generator=gen)
        lr = lr_schedule(step, elapsed / budget, hp["lr"], hp["warmup"])
        for g in opt.param_groups:
            g["lr"] = lr
        loss = batch_loss_of(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"]))
        opt.step()
        step += 1
        run_loss += float(loss.detach())
        run_n += 1
        elapsed = time.monotonic() - t0
        if step % args.log_every == 0:
            now = time.monotonic()
            tps = (step - step_log) * B * L / max(now - t_log, 1e-9)
            recent = run_loss / run_n
            append_row(loss_csv, LOSS_FIELDS, {"step": step, "elapsed_s": f"{elapsed:.1f}", "lr": f"{lr:.4g}",
                                                "loss": f"{recent:.5f}", "grad_norm": f"{grad_norm:.3f}",
                                                "tokens_per_s": f"{tps:.0f}"})
            print(f"step {step} {elapsed / 60:.1f}min lr {lr:.2e} loss {recent:.4f} gnorm {grad_norm:.2f} "
                  f"{tps:.0f} tok/s ({tps / (B * L):.2f} steps/s)", flush=True)
            run_loss, run_n, t_log, step_log = 0.0, 0, now, step
        if elapsed - last_eval >= args.eval_every:
            ev = eval_loss_of()
            elapsed = time.monotonic() - t0
            append_row(eval_csv, EVAL_FIELDS, {"step": step, "elapsed_s": f"{elapsed:.1f}",
                                                "train_loss": f"{recent:.5f}", "eval_loss": f"{ev:.5f}"})
            print(f"step {step} eval loss {ev:.4f}", flush=True)
            last_eval = elapsed
        if elapsed - last_ckpt >= args.ckpt_every:
            save_ckpt(step, elapsed)
            elapsed = last_ckpt = time.monotonic() - t0
        if stop.set:
            save_ckpt(step, elapsed)
            print(f"stopped by signal at step {step} ({elapsed / 60:.1f} min); rerun the command to resume", flush=True)
            return None
    save_ckpt(step, elapsed)
    return step, elapsed


def finish(model: LlamaGen | ContinuousAR, out: Path, train_x: np.ndarray, train_labels: np.ndarray,
           eval_x: np.ndarray, eval_labels: np.ndarray, step: int, elapsed: float, hp: dict,
           args: argparse.Namespace, n_params: int) -> dict:
    """Final held-out and training losses, ``OUT/final/`` and ``OUT/report.json``."""
    model.eval()
    rng = np.random.default_rng(0)
    sub = rng.choice(len(train_x), size=min(512, len(train_x)), replace=False)
    train_loss = mean_loss(model, train_x[sub], train_labels[sub])
    eval_loss = mean_loss(model, eval_x, eval_labels)
    L = int(train_x.shape[1])
    report = {
        "preset": hp["preset"], "final_train_loss": train_loss, "final_eval_loss": eval_loss,
        "train_loss_subset": len(sub),
        **({} if isinstance(model, ContinuousAR) else {"uniform_loss": math.log(model.config.vocab_size)}),
        "steps": step, "batch_size": hp["batch_size"], "lr": hp["lr"], "warmup": hp["warmup"],
        "weight_decay": hp["weight_decay"], "class_dropout": hp["class_dropout"], "grad_clip": hp["grad_clip"],
        "tokens_seen": step * hp["batch_size"] * L,
        "epochs": step * hp["batch_size"] / max(1, len(train_x)),
        "train_minutes": round(elapsed / 60.0, 2), "budget_minutes": hp["minutes"],
        "params": n_params, "config": model.config_dict(),
        "num_train_sequences": len(train_x), "num_eval_sequences": len(eval_x),
        "tokens_file": str(args.tokens), "machine": machine_info(args.threads),
    }
    save_final(model, out, report, f"final train loss {train_loss:.4f}, eval loss {eval_loss:.4f}; "
                                   f"{step} steps in {elapsed / 60:.1f} min")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(train, args)


if __name__ == "__main__":
    sys.exit(main())
