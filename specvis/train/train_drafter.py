"""Train an EAGLE draft head for a trained LlamaGen target (CPU, time-limited, resumable).

Objective (EAGLE; LANTERN for images): for each image token x_i, the head reads the token and the
target's feature h_{i-1} (plus uniform noise) and regresses the target's next feature h_i (smooth L1,
weight ``--v-weight``); the target's frozen output head turns the prediction into logits trained by
cross-entropy against the target's own next-token distribution (weight ``--p-weight``). Labels are
replaced by the null class with probability ``--class-dropout`` so the unconditional CFG branch is
learnt too. Embeddings start from the target's and stay frozen; the target is frozen.
AdamW (0.9, 0.95), linear warm-up then cosine decay to lr/10 over the wall-clock budget.

The budget (``--minutes``) is wall time summed over resumes. Every ``--ckpt-every`` seconds the state
goes to ``OUT/ckpt.pt``; rerunning the same command resumes. Logs: ``OUT/losses.csv``, ``OUT/eval.csv``
(held-out losses and top-1/top-3 agreement with the target's argmax). At the end: ``OUT/final/``
(EAGLE layout: ``config.json`` + ``model.safetensors``, ``EagleDrafter.from_pretrained``) and
``OUT/report.json``.

    python -m specvis.train.train_drafter --target runs/target/final --tokens data/emoji_tokens.npz \\
        --out runs/drafter --minutes 30 --threads 1
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specvis.io import atomic_write
from specvis.models.drafter import DrafterConfig, EagleDrafter
from specvis.models.llamagen import LlamaGen
from specvis.train.common import append_row, drop_rows_after, machine_info, run_main, save_final

LOSS_FIELDS = ["step", "elapsed_s", "lr", "loss", "v_loss", "p_loss", "grad_norm"]
EVAL_FIELDS = ["step", "elapsed_s", "v_loss", "p_loss", "top1", "top3"]


def load_tokens(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays of a token ``.npz`` (``train_codes``/``train_labels``/``eval_codes``/``eval_labels``)."""
    try:
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ValueError(f"token file not found: {path}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"unreadable token file {path}: {type(exc).__name__}") from None
    for key in ("train_codes", "train_labels", "eval_codes", "eval_labels"):
        if key not in data:
            raise ValueError(f"{path}: missing array {key!r}")
    return data


def drop_labels(labels: torch.Tensor, null: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Replace each label by ``null`` with probability ``p``."""
    return torch.where(torch.rand(labels.shape, generator=gen) < p, torch.full_like(labels, null), labels)


def lr_at(step: int, frac: float, base: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps times a cosine from 1 to 0.1 over the budget fraction."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    return base * warm * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, frac)))))


def drafter_losses(drafter: EagleDrafter, target: LlamaGen, labels: torch.Tensor, codes: torch.Tensor,
                   noise: float = 0.0, gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Feature regression and soft cross-entropy of the head on (labels, codes (B, L)); also the
    top-1/top-3 agreement of the head's logits with the target's argmax."""
    with torch.no_grad():
        t_logits, h = target.forward_train(labels, codes[:, :-1])  # h[:, i]: feature that predicts x_i
    h_in = h[:, :-1]
    if noise > 0:
        h_in = h_in + (torch.rand(h_in.shape, generator=gen) * 2 - 1).to(h_in) * noise
    logits, f = drafter.forward_train(codes[:, :-1], h_in)
    goal, t_next = h[:, 1:], t_logits[:, 1:]
    v_loss = F.smooth_l1_loss(f.float(), goal.float())
    p_loss = -(torch.softmax(t_next, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()
    with torch.no_grad():
        best = t_next.argmax(-1, keepdim=True)
        top3 = logits.topk(min(3, logits.shape[-1]), -1).indices
        top1 = (top3[..., :1] == best).float().mean()
        top3 = (top3 == best).any(-1).float().mean()
    return {"v_loss": v_loss, "p_loss": p_loss, "top1": top1, "top3": top3}


@torch.no_grad()
def evaluate(drafter: EagleDrafter, target: LlamaGen, codes: np.ndarray, labels: np.ndarray,
             batch_size: int = 64) -> dict[str, float]:
    """Held-out means (token-weighted) of ``drafter_losses`` with true labels, no noise."""
    was = drafter.training
    drafter.eval()
    sums: dict[str, float] = {}
    total = 0
    for i in range(0, len(codes), batch_size):
        c = torch.from_numpy(codes[i:i + batch_size].astype(np.int64))
        y = torch.from_numpy(labels[i:i + batch_size].astype(np.int64))
        out = drafter_losses(drafter, target, y, c)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(c)
        total += len(c)
    drafter.train(was)
    return {k: v / max(total, 1) for k, v in sums.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_drafter", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="trained target directory (LlamaGen.from_pretrained)")
    p.add_argument("--tokens", default="data/emoji_tokens.npz", help="token .npz from specvis.train.tokenize")
    p.add_argument("--out", required=True, help="run directory (checkpoint, logs, final head, report)")
    p.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget, summed over resumes")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--layers", type=int, default=1, help="decoder layers in the head (EAGLE: 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=200, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--class-dropout", type=float, default=0.1, help="probability of the null condition")
    p.add_argument("--noise", type=float, default=0.1, help="half-width of the uniform noise on input features")
    p.add_argument("--v-weight", type=float, default=1.0, help="feature regression weight")
    p.add_argument("--p-weight", type=float, default=0.1, help="cross-entropy weight")
    p.add_argument("--grad-clip", type=float, default=0.5)
    p.add_argument("--ckpt-every", type=float, default=180.0, help="checkpoint period (seconds)")
    p.add_argument("--eval-every", type=float, default=300.0, help="held-out evaluation period (seconds)")
    p.add_argument("--log-every", type=int, default=10, help="training-loss log period (steps)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (tests, smoke runs)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in --out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("minutes", "threads", "layers", "batch_size", "lr", "ckpt_every", "eval_every", "log_every", "grad_clip"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 <= args.class_dropout < 1.0:
        p.error("--class-dropout must be in [0, 1)")
    if args.noise < 0 or args.v_weight < 0 or args.p_weight < 0:
        p.error("--noise, --v-weight and --p-weight must be >= 0")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return args


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) training; returns the report written to ``OUT/report.json``."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = LlamaGen.from_pretrained(args.target).float().eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    data = load_tokens(args.tokens)
    train_codes, train_labels = data["train_codes"], data["train_labels"]
    V, L = target.layout.vocab_size, target.layout.num_tokens
    if train_codes.ndim != 2 or train_codes.shape[1] != L:
        raise ValueError(f"{args.tokens}: codes must be (M, {L}) for this target, got {train_codes.shape}")
    for name in ("train_codes", "eval_codes"):
        if data[name].size and (int(data[name].max()) >= V or int(data[name].min()) < 0):
            raise ValueError(f"{args.tokens}: {name} outside [0, {V})")
    for name in ("train_labels", "eval_labels"):
        if data[name].size and int(data[name].max()) >= target.num_conditions:
            raise ValueError(f"{args.tokens}: {name} has classes the target does not know")
    if not len(data["eval_codes"]):  # no held-out split: evaluate on a fixed training subset
        data["eval_codes"], data["eval_labels"] = train_codes[:64], train_labels[:64]
    if args.class_dropout > 0 and target.cls_embedding.embedding_table.num_embeddings <= target.null_condition:
        raise ValueError("the target has no null class (trained without class dropout); pass --class-dropout 0")
    ckpt_path, loss_csv, eval_csv = out / "ckpt.pt", out / "losses.csv", out / "eval.csv"

    state = None
    if ckpt_path.exists() and not args.fresh:
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot read checkpoint {ckpt_path}: {exc}") from None
    if state is not None:
        drafter = EagleDrafter(DrafterConfig(**state["config"])).attach(target)
        hp = state["hparams"]
        print(f"resuming from {ckpt_path} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        drafter = EagleDrafter.from_target(target, num_hidden_layers=args.layers, seed=args.seed)
        hp = {k: getattr(args, k) for k in ("batch_size", "lr", "warmup", "weight_decay", "class_dropout", "noise",
                                            "v_weight", "p_weight", "grad_clip", "seed", "layers")}
        for path in (loss_csv, eval_csv):
            path.unlink(missing_ok=True)
    hp["minutes"] = args.minutes
    drafter.embed_tokens.weight.requires_grad_(False)
    params = [q for q in drafter.parameters() if q.requires_grad]
    decay = [q for q in params if q.dim() >= 2]
    rest = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=hp["lr"], betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    step, elapsed = 0, 0.0
    if state is not None:
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, elapsed = state["step"], state["elapsed"]
        for path in (loss_csv, eval_csv):
            drop_rows_after(path, step)
    drafter.train()
    budget = args.minutes * 60.0
    n_params = sum(q.numel() for q in params)
    print(f"EAGLE head: {n_params / 1e6:.2f}M trainable params ({hp['layers']} layer(s), width {drafter.config.hidden_size}), "
          f"target vocab {V}, {len(train_codes)} train / {len(data['eval_codes'])} eval sequences of {L}, "
          f"batch {hp['batch_size']}, lr {hp['lr']}, budget {args.minutes} min, {args.threads} thread(s)", flush=True)

    def save_ckpt() -> None:
        blob = {"config": drafter.config.__dict__.copy(), "hparams": hp, "model": drafter.state_dict(),
                "opt": opt.state_dict(), "gen": gen.get_state(), "step": step, "elapsed": elapsed}
        atomic_write(ckpt_path, lambda tmp: torch.save(blob, tmp))

    def run_eval() -> dict[str, float]:
        ev = evaluate(drafter, target, data["eval_codes"], data["eval_labels"])
        append_row(eval_csv, EVAL_FIELDS, {"step": step, "elapsed_s": f"{elapsed:.1f}",
                                        **{k: f"{ev[k]:.5f}" for k in ("v_loss", "p_loss", "top1", "top3")}})
        print(f"step {step} eval v_loss {ev['v_loss']:.4f} p_loss {ev['p_loss']:.4f} "
              f"top1 {ev['top1']:.3f} top3 {ev['top3']:.3f}", flush=True)
        return ev

    initial = run_eval() if step == 0 else None
    codes_t = torch.from_numpy(train_codes.astype(np.int64))
    labels_t = torch.from_numpy(train_labels.astype(np.int64))
    t0 = time.monotonic() - elapsed
    last_ckpt = last_eval = elapsed
    acc = {"loss": 0.0, "v_loss": 0.0, "p_loss": 0.0}
    n_acc = 0
    B = hp["batch_size"]
    while elapsed < budget and (args.max_steps is None or step < args.max_steps):
        idx = torch.randint(0, len(codes_t), (B,), generator=gen)
        labels = drop_labels(labels_t[idx], target.null_condition, hp["class_dropout"], gen)
        lr = lr_at(step, elapsed / budget, hp["lr"], hp["warmup"])
        for g in opt.param_groups:
            g["lr"] = lr
        parts = drafter_losses(drafter, target, labels, codes_t[idx], hp["noise"], gen)
        loss = hp["v_weight"] * parts["v_loss"] + hp["p_weight"] * parts["p_loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, hp["grad_clip"]))
        opt.step()
        step += 1
        acc["loss"] += float(loss.detach())
        acc["v_loss"] += float(parts["v_loss"].detach())
        acc["p_loss"] += float(parts["p_loss"].detach())
        n_acc += 1
        elapsed = time.monotonic() - t0
        if step % args.log_every == 0:
            row = {k: v / n_acc for k, v in acc.items()}
            append_row(loss_csv, LOSS_FIELDS, {"step": step, "elapsed_s": f"{elapsed:.1f}", "lr": f"{lr:.4g}",
                                            **{k: f"{v:.5f}" for k, v in row.items()}, "grad_norm": f"{gnorm:.3f}"})
            print(f"step {step} {elapsed / 60:.1f}min lr {lr:.2e} loss {row['loss']:.4f} "
                  f"(v {row['v_loss']:.4f} p {row['p_loss']:.4f}) gnorm {gnorm:.2f}", flush=True)
            acc = dict.fromkeys(acc, 0.0)
            n_acc = 0
        if elapsed - last_eval >= args.eval_every:
            run_eval()
            elapsed = last_eval = time.monotonic() - t0
        if elapsed - last_ckpt >= args.ckpt_every:
            save_ckpt()
            elapsed = last_ckpt = time.monotonic() - t0
    save_ckpt()
    drafter.eval()
    final = run_eval()
    report = {"final_eval": final, "initial_eval": initial, "steps": step, "train_minutes": round(elapsed / 60.0, 2),
              "budget_minutes": hp["minutes"], "hparams": hp, "trainable_params": n_params,
              "config": drafter.config.to_json(), "target": str(args.target), "tokens_file": str(args.tokens),
              "machine": machine_info(args.threads)}
    save_final(drafter, out, report, f"final eval v_loss {final['v_loss']:.4f} p_loss {final['p_loss']:.4f} "
                                     f"top1 {final['top1']:.3f} top3 {final['top3']:.3f}; {step} steps in {elapsed / 60:.1f} min")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(train, args)


if __name__ == "__main__":
    sys.exit(main())
