"""Train an EAGLE draft head for a target (time-limited, resumable): a trained LlamaGen target on a
token file (``--target DIR --tokens FILE``), or a text-to-image checkpoint on samples it generates
itself from prompts (``--model DIR_OR_HUB_ID [--prompts FILE]``).

Objective (EAGLE; LANTERN for images): for each stream token x_i, the head reads the token and the
target's feature h_{i-1} (plus uniform noise) and regresses the target's next feature h_i (smooth L1,
weight ``--v-weight``); the target's frozen output head turns the prediction into logits trained by
cross-entropy against the target's own next-token distribution (weight ``--p-weight``; positions whose
next token is forced, such as Emu3's row ends, are left out of it). With probability
``--class-dropout`` a sample's condition is the unconditional one (the null class; for prompts, the
unconditional row the pipeline's CFG uses) so the unconditional CFG branch is learnt too. Embeddings
start from the target's and stay frozen (prompt models: the head borrows the target's image
embedding); the target is frozen. AdamW (0.9, 0.95), linear warm-up then cosine decay to lr/10 over
the wall-clock budget.

``--model``: the checkpoint (``specvis.families``) generates ``--samples`` images with plain AR
sampling under its default sampling (CFG included) from the prompts of ``--prompts`` (one a line;
default: a small built-in list of generic prompts), cycled, at ``--height`` x ``--width`` image
tokens (default: native); prompt rows, unconditional rows and token streams (row ends included) go
to ``OUT/samples.pt`` and are reused on resume. The last eighth of the samples is held out.

The budget (``--minutes``) is wall time summed over resumes. Every ``--ckpt-every`` seconds the state
goes to ``OUT/ckpt.pt``; rerunning the same command resumes. Logs: ``OUT/losses.csv``, ``OUT/eval.csv``
(held-out losses and top-1/top-3 agreement with the target's argmax). At the end: ``OUT/final/``
(EAGLE layout: ``config.json`` + ``model.safetensors``, ``EagleDrafter.from_pretrained``) and
``OUT/report.json``.

    python -m specvis.train.train_drafter --target runs/target/final --tokens data/emoji_tokens.npz \\
        --out runs/drafter --minutes 30 --threads 1
    specvis train-drafter --model deepseek-ai/Janus-Pro-1B --prompts prompts.txt --samples 512 \\
        --device cuda --out runs/janus-head      # then: specvis generate --model ... --drafter runs/janus-head
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from specvis.io import atomic_write
from specvis.methods.ar import AR
from specvis.models.base import Prompts
from specvis.models.drafter import DrafterConfig, EagleDrafter
from specvis.models.llamagen import LlamaGen
from specvis.train.common import append_row, drop_rows_after, machine_info, run_main, save_final

DEFAULT_PROMPTS = [
    "a red apple on a wooden table", "a cat sleeping on a sofa", "a mountain lake at sunrise",
    "a city street at night in the rain", "a bowl of fruit, still life painting", "a portrait of an old man",
    "a sailing boat on a calm sea", "a forest path in autumn", "a cup of coffee on a desk",
    "a dog running on the beach", "a snowy village with lights", "a field of sunflowers under a blue sky",
    "a vintage car parked by a house", "a colourful bird on a branch", "a plate of pasta, food photography",
    "an astronaut riding a horse",
]

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


@torch.no_grad()
def stream_features(target, conditions, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw logits (R, S, V) and features (R, S, D) of ``target`` teacher-forced on streams (R, S) through
    its cached protocol (``models/base.py``): index i is what the target computed to predict stream
    token i (the prefill for i = 0). Works for any ``CachedTokenModel`` and condition rows."""
    R, S = stream.shape
    target.setup_cache(R, 0)
    first, h0 = target.prefill(conditions)
    positions = torch.arange(S - 1, device=stream.device)[None].expand(R, -1)
    logits, h = target.forward_tokens(stream[:, :-1], positions)
    target.cache = None  # the cache is scratch here
    return torch.cat([first[:, None], logits], 1), torch.cat([h0[:, None], h], 1)


def drafter_losses(drafter: EagleDrafter, target, labels, codes: torch.Tensor,
                   noise: float = 0.0, gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Feature regression and soft cross-entropy of the head on (conditions, streams (B, L)): class
    labels teacher-force the target's ``forward_train``, ``Prompts`` its cached path. Also the
    top-1/top-3 agreement of the head's logits with the target's argmax. The cross-entropy and the
    agreement skip positions whose next token is forced (their law is a point mass, never drafted)."""
    with torch.no_grad():
        if isinstance(labels, Prompts):
            t_logits, h = stream_features(target, labels, codes)
        else:
            t_logits, h = target.forward_train(labels, codes[:, :-1])  # h[:, i]: feature that predicts x_i
    h_in = h[:, :-1]
    if noise > 0:
        h_in = h_in + (torch.rand(h_in.shape, generator=gen) * 2 - 1).to(h_in) * noise
    logits, f = drafter.forward_train(codes[:, :-1], h_in)
    goal, t_next = h[:, 1:], t_logits[:, 1:]
    sampled = target.layout.forced(codes.device)[1: codes.shape[1]] < 0  # next token drawn, not forced
    v_loss = F.smooth_l1_loss(f.float(), goal.float())
    t_next, logits = t_next[:, sampled], logits[:, sampled]
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
    batches = ((torch.from_numpy(labels[i:i + batch_size].astype(np.int64)),
                torch.from_numpy(codes[i:i + batch_size].astype(np.int64))) for i in range(0, len(codes), batch_size))
    return evaluate_batches(drafter, target, batches)


@torch.no_grad()
def evaluate_batches(drafter: EagleDrafter, target, batches) -> dict[str, float]:
    """Means of ``drafter_losses`` over (conditions, streams) batches, weighted by rows; no noise."""
    was = drafter.training
    drafter.eval()
    sums: dict[str, float] = {}
    total = 0
    for cond, codes in batches:
        out = drafter_losses(drafter, target, cond, codes)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(codes)
        total += len(codes)
    drafter.train(was)
    return {k: v / max(total, 1) for k, v in sums.items()}


class ClassData:
    """A trained LlamaGen target (``--target``) and class-labelled codes from a token file (``--tokens``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        target = LlamaGen.from_pretrained(args.target).float().eval().to(args.device)
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
        self.target, self.data, self.device = target, data, args.device
        self.codes = torch.from_numpy(train_codes.astype(np.int64))
        self.labels = torch.from_numpy(train_labels.astype(np.int64))
        self.summary = f"{len(train_codes)} train / {len(data['eval_codes'])} eval sequences of {L}"
        self.info = {"target": str(args.target), "tokens_file": str(args.tokens)}

    def batch(self, size: int, p_uncond: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, len(self.codes), (size,), generator=gen)
        labels = drop_labels(self.labels[idx], self.target.null_condition, p_uncond, gen)
        return labels.to(self.device), self.codes[idx].to(self.device)

    def evaluate(self, drafter: EagleDrafter) -> dict[str, float]:
        d = self.data
        return evaluate_batches(drafter, self.target, (
            (torch.from_numpy(d["eval_labels"][i:i + 64].astype(np.int64)).to(self.device),
             torch.from_numpy(d["eval_codes"][i:i + 64].astype(np.int64)).to(self.device))
            for i in range(0, len(d["eval_codes"]), 64)))


@dataclass(frozen=True)
class RecordedAR(AR):
    """Plain AR sampling that also keeps, per call, the rows it decoded from (the pipeline's
    conditional prompts then, under CFG, its unconditional ones), the batch size and the whole token
    stream (structural tokens included)."""

    records: list = field(default_factory=list, compare=False, repr=False)

    def decode(self, ctx) -> None:
        super().decode(ctx)
        self.records.append((ctx.target.conditions, ctx.target.batch, ctx.tokens[:, : ctx.L].clone()))


def read_prompts(path: str | None) -> list[str]:
    """One prompt a line (blank lines skipped); the built-in list when ``path`` is None."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    try:
        prompts = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompts {path}: cannot read ({e.__class__.__name__})") from None
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts (one a line)")
    return prompts


@torch.no_grad()
def generate_samples(pipe, prompts: list[str], count: int, batch: int, seed: int,
                     height: int | None, width: int | None) -> dict:
    """``count`` samples of the pipeline's own AR generation under its default sampling, prompts
    cycled: prompt rows, unconditional rows (None without CFG) and streams (count, stream_len)."""
    method = RecordedAR()
    for i, start in enumerate(range(0, count, batch)):
        chunk = [prompts[(start + j) % len(prompts)] for j in range(min(batch, count - start))]
        pipe(prompts=chunk, method=method, seed=seed + i, decode=False, height=height, width=width)
        print(f"generated {min(start + batch, count)}/{count} samples", flush=True)
    cond, uncond, streams = [], [], []
    for rows, B, stream in method.records:
        ids, lengths = rows.ids.cpu(), rows.lengths.cpu().tolist()
        cond += [ids[r, : lengths[r]].tolist() for r in range(B)]
        uncond += [ids[B + r, : lengths[B + r]].tolist() if len(lengths) > B else None for r in range(B)]
        streams.append(stream.cpu())
    layout = pipe.target.layout
    return {"cond": cond, "uncond": uncond, "streams": torch.cat(streams), "prompts": prompts,
            "grid": [layout.height, layout.width]}


class PromptData:
    """A text-to-image checkpoint (``--model``) and samples it generated from prompts (module docstring)."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        from specvis.zoo import load_pipeline

        pipe = load_pipeline(args.model, device=args.device, dtype="fp32")  # trained against fp32 features
        path = out / "samples.pt"
        if path.exists() and not args.fresh:
            try:
                samples = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as exc:  # noqa: BLE001
                raise ValueError(f"cannot read samples {path}: {exc}") from None
            print(f"reusing {len(samples['cond'])} samples from {path}", flush=True)
            pipe.set_grid(*samples["grid"])
        else:
            samples = generate_samples(pipe, read_prompts(args.prompts), args.samples, args.sample_batch,
                                       args.seed, args.height, args.width)
            atomic_write(path, lambda tmp: torch.save(samples, tmp))
        for p in pipe.target.parameters():
            p.requires_grad_(False)
        self.target, self.device, self.samples = pipe.target, pipe.device, samples
        M = len(samples["cond"])
        held = max(1, M // 8) if M > 1 else 0
        self.train_idx, self.eval_idx = list(range(M - held)), list(range(M - held, M)) or [0]
        S = samples["streams"].shape[1]
        self.summary = f"{M - held} train / {held} eval samples of {S} stream tokens"
        self.info = {"target": str(args.model), "prompts": str(args.prompts) if args.prompts else "built-in",
                     "samples": M, "grid": samples["grid"]}

    def _rows(self, idx: list[int], uncond: list[bool]) -> tuple[Prompts, torch.Tensor]:
        s = self.samples
        rows = [s["uncond"][i] if u and s["uncond"][i] is not None else s["cond"][i] for i, u in zip(idx, uncond)]
        return Prompts.of(rows, self.device), s["streams"][idx].to(self.device)

    def batch(self, size: int, p_uncond: float, gen: torch.Generator) -> tuple[Prompts, torch.Tensor]:
        pick = torch.randint(0, len(self.train_idx), (size,), generator=gen)
        uncond = (torch.rand(size, generator=gen) < p_uncond).tolist()
        return self._rows([self.train_idx[i] for i in pick.tolist()], uncond)

    def evaluate(self, drafter: EagleDrafter) -> dict[str, float]:
        both = [(i, u) for u in (False, True) for i in self.eval_idx
                if not u or self.samples["uncond"][i] is not None]
        return evaluate_batches(drafter, self.target, (
            self._rows([i for i, _ in both[k:k + 16]], [u for _, u in both[k:k + 16]]) for k in range(0, len(both), 16)))


class _Parser(argparse.ArgumentParser):
    """Bad flags are one line (``error: ...``, exit 2), not the whole usage."""

    def error(self, message: str) -> None:
        raise ValueError(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked: one ValueError naming the flag (``main`` prints it as one line, exit 2)."""
    p = _Parser(prog="specvis train-drafter", description=__doc__.split("\n")[0])
    p.add_argument("--target", help="trained LlamaGen target directory (LlamaGen.from_pretrained), with --tokens")
    p.add_argument("--tokens", default="data/emoji_tokens.npz", help="token .npz from specvis.train.tokenize")
    p.add_argument("--model", help="text-to-image checkpoint directory or Hub id (specvis.families): trains on "
                                   "samples it generates from --prompts")
    p.add_argument("--prompts", help="--model: a file with one prompt a line (default: a built-in generic list)")
    p.add_argument("--samples", type=int, default=256, help="--model: images to generate for training")
    p.add_argument("--sample-batch", type=int, default=16, help="--model: images per generation call")
    p.add_argument("--height", type=int, help="--model: image height in tokens for the samples (default native)")
    p.add_argument("--width", type=int, help="--model: image width in tokens (default native)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (target and head)")
    p.add_argument("--out", required=True, help="run directory (checkpoint, logs, samples, final head, report)")
    p.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget, summed over resumes")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--layers", type=int, default=1, help="decoder layers in the head (EAGLE: 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=200, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--class-dropout", type=float, default=0.1,
                   help="probability of the null condition (--model: of the unconditional prompt row)")
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
    if (args.target is None) == (args.model is None):
        p.error("give --target DIR (a LlamaGen target, with --tokens) or --model DIR_OR_HUB_ID (a text-to-image checkpoint)")
    for name in ("samples", "sample_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("minutes", "threads", "layers", "batch_size", "lr", "ckpt_every", "eval_every", "log_every", "grad_clip"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 <= args.class_dropout < 1.0:
        p.error("--class-dropout must be in [0, 1)")
    if args.noise < 0 or args.v_weight < 0 or args.p_weight < 0:
        p.error("--noise, --v-weight and --p-weight must be >= 0")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    for name in ("minutes", "lr", "weight_decay", "class_dropout", "noise", "v_weight", "p_weight", "grad_clip",
                 "ckpt_every", "eval_every"):
        if not math.isfinite(getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        p.error(f"--out {args.out}: exists and is not a directory")
    from specvis.checks import device, seed

    device(args.device, "--device")
    seed(args.seed, "--seed")
    return args


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) training; returns the report written to ``OUT/report.json``."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = ClassData(args) if args.target is not None else PromptData(args, out)
    target = data.target
    for prm in target.parameters():
        prm.requires_grad_(False)
    V = target.layout.vocab_size
    ckpt_path, loss_csv, eval_csv = out / "ckpt.pt", out / "losses.csv", out / "eval.csv"

    state = None
    if ckpt_path.exists() and not args.fresh:
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot read checkpoint {ckpt_path}: {exc}") from None
    if state is not None:
        drafter = EagleDrafter(DrafterConfig(**state["config"])).to(args.device).attach(target)
        hp = state["hparams"]
        print(f"resuming from {ckpt_path} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        drafter = EagleDrafter.from_target(target, num_hidden_layers=args.layers, seed=args.seed)
        hp = {k: getattr(args, k) for k in ("batch_size", "lr", "warmup", "weight_decay", "class_dropout", "noise",
                                            "v_weight", "p_weight", "grad_clip", "seed", "layers")}
        for path in (loss_csv, eval_csv):
            path.unlink(missing_ok=True)
    hp["minutes"] = args.minutes
    if drafter.config.own_embeddings:
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
          f"target vocab {V}, {data.summary}, "
          f"batch {hp['batch_size']}, lr {hp['lr']}, budget {args.minutes} min, {args.threads} thread(s)", flush=True)

    def save_ckpt() -> None:
        blob = {"config": drafter.config.__dict__.copy(), "hparams": hp, "model": drafter.state_dict(),
                "opt": opt.state_dict(), "gen": gen.get_state(), "step": step, "elapsed": elapsed}
        atomic_write(ckpt_path, lambda tmp: torch.save(blob, tmp))

    def run_eval() -> dict[str, float]:
        ev = data.evaluate(drafter)
        append_row(eval_csv, EVAL_FIELDS, {"step": step, "elapsed_s": f"{elapsed:.1f}",
                                        **{k: f"{ev[k]:.5f}" for k in ("v_loss", "p_loss", "top1", "top3")}})
        print(f"step {step} eval v_loss {ev['v_loss']:.4f} p_loss {ev['p_loss']:.4f} "
              f"top1 {ev['top1']:.3f} top3 {ev['top3']:.3f}", flush=True)
        return ev

    initial = run_eval() if step == 0 else None
    t0 = time.monotonic() - elapsed
    last_ckpt = last_eval = elapsed
    acc = {"loss": 0.0, "v_loss": 0.0, "p_loss": 0.0}
    n_acc = 0
    B = hp["batch_size"]
    while elapsed < budget and (args.max_steps is None or step < args.max_steps):
        labels, codes = data.batch(B, hp["class_dropout"], gen)
        lr = lr_at(step, elapsed / budget, hp["lr"], hp["warmup"])
        for g in opt.param_groups:
            g["lr"] = lr
        parts = drafter_losses(drafter, target, labels, codes, hp["noise"], gen)
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
              "config": drafter.config.to_json(), **data.info, "machine": machine_info(args.threads)}
    save_final(drafter, out, report, f"final eval v_loss {final['v_loss']:.4f} p_loss {final['p_loss']:.4f} "
                                     f"top1 {final['top1']:.3f} top3 {final['top3']:.3f}; {step} steps in {elapsed / 60:.1f} min")
    return report


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as exc:
        print(f"specvis train-drafter: error: {exc}", file=sys.stderr)
        return 2
    return run_main(train, args)


if __name__ == "__main__":
    sys.exit(main())
