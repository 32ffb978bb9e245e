"""Distil the emoji draft LlamaGen or the EAGLE head on the target's own guided sampling law (issue #17).

The draft and the head were trained by next-token prediction on the dataset (the head: toward the
target's conditional law), but they are used under the target's *guided* law (temperature 1, CFG 3),
so they match it poorly. Like DistillSpec / EAGLE self-distillation, this trainer first draws
``--samples`` sequences x from the target with that law (plain AR, no top-k/top-p, classes cycled
over all classes, ``--sample-batch`` per call; tokens and labels in ``OUT/samples.pt``, reused on
resume; the last eighth is held out) and then minimises, online (teacher under ``no_grad``),

    loss = mean_{x, i}  KL( p_guided(. | c, x_<i) || q_guided(. | c, x_<i) )      (--divergence kl)
    or     mean_{x, i}  1 - sum_v min(p_guided, q_guided)(v | c, x_<i)            (--divergence tv),
    p_guided = softmax((u_p + s * (c_p - u_p)) / T),   q_guided = softmax((u_q + s * (c_q - u_q)) / T),

with c_., u_. the conditional and unconditional (null-class) logits and s = ``--cfg-scale``, exactly
the formula of ``specvis.Sampling.guide``/``probs`` that the sampler uses.

* ``--student draft``: q from the draft LlamaGen's own cond/uncond forwards (init ``--init``, default
  the bundle's ``draft/``), at every position i = 0..L-1.
* ``--student drafter``: q from the EAGLE head (init: the bundle's ``drafter/``) through the target's
  frozen output head; as in EagleTree drafting (``methods/trees.py``, ``log_draft``) the cond row of
  the head reads the target's conditional features and the uncond row the target's null-class
  features, and the two logits are guided with the same formula; positions i = 1..L-1 (the target
  itself draws x_0). Plus ``--v-weight`` times the smooth-L1 feature regression of ``train_drafter``
  on both rows (keeps the head's own features usable deeper in the tree).

Training uses the shared resumable loop ``train_ar.fit`` (AdamW, warm-up + cosine over the budget,
``--minutes`` summed over resumes, ``OUT/ckpt.pt``, ``OUT/losses.csv``, ``OUT/eval.csv`` with the
held-out KL). At the end: ``OUT/final/`` (same layout as the input: ``LlamaGen.from_pretrained`` /
``EagleDrafter.from_pretrained(dir, target)``) and ``OUT/report.json`` with ``before`` (the initial
student) and ``after``: held-out mean KL, mean sum_x min(p_guided, q_guided) (acceptance probability
of exact speculative sampling) and top-1 agreement.

    python -m specvis.train.distill --student draft --out runs/distill_draft --samples 512 --minutes 30 --threads 1
    python -m specvis.train.distill --student drafter --out runs/distill_drafter --samples 512 --minutes 20 --threads 1
    python -m specvis.train.distill --student draft --out /tmp/distill_smoke --samples 16 --max-steps 3   # smoke
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import specvis
from specvis.io import atomic_write
from specvis.models.drafter import EagleDrafter
from specvis.models.llamagen import LlamaGen
from specvis.sampling import Sampling
from specvis.train.common import machine_info, run_main, save_final
from specvis.train.train_ar import StopFlag, add_loop_arguments, fit, make_optimizer, open_run, restore, stoppable

BUNDLE = Path(__file__).resolve().parents[1] / "assets" / "emoji"
DEFAULTS = {"draft": {"batch_size": 16, "lr": 2e-4, "warmup": 20},
            "drafter": {"batch_size": 16, "lr": 2e-4, "warmup": 20}}


# ---------------------------------------------------------------- laws
def guided_log_law(sampling: Sampling, cond: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
    """log of the sampling law at temperature ``sampling.temperature`` (> 0), no top-k/top-p:
    log_softmax(guide(cond, uncond) / T), differentiable; ``Sampling.probs`` is its exp."""
    return torch.log_softmax(sampling.guide(cond.float(), uncond.float()) / sampling.temperature, dim=-1)


def null_like(model, labels: torch.Tensor) -> torch.Tensor:
    """The unconditional CFG branch's condition: the null class, as ``Condition`` builds it."""
    return torch.full_like(labels, model.null_condition)


def teacher_log_law(target: LlamaGen, labels: torch.Tensor, codes: torch.Tensor, sampling: Sampling):
    """(log p_guided (B, L, V), cond features (B, L, D), uncond features) of the target on ``codes`` (B, L)."""
    with torch.no_grad():
        c, hc = target.forward_train(labels, codes[:, :-1])
        u, hu = target.forward_train(null_like(target, labels), codes[:, :-1])
        return guided_log_law(sampling, c, u), hc, hu


def student_log_law(student, target: LlamaGen, labels: torch.Tensor, codes: torch.Tensor, sampling: Sampling,
                    feats: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(log q_guided, feature regression loss, first position compared): a LlamaGen draft at positions
    0..L-1, an EAGLE head at 1..L-1 from the target's cond/uncond features ``feats``."""
    if isinstance(student, EagleDrafter):
        hc, hu = feats
        zc, fc = student.forward_train(codes[:, :-1], hc[:, :-1])
        zu, fu = student.forward_train(codes[:, :-1], hu[:, :-1])
        v = 0.5 * (F.smooth_l1_loss(fc.float(), hc[:, 1:].float()) + F.smooth_l1_loss(fu.float(), hu[:, 1:].float()))
        return guided_log_law(sampling, zc, zu), v, 1
    c = student.logits(labels, codes[:, :-1])
    u = student.logits(null_like(student, labels), codes[:, :-1])
    return guided_log_law(sampling, c, u), torch.zeros(()), 0


def distill_losses(student, target: LlamaGen, labels: torch.Tensor, codes: torch.Tensor,
                   sampling: Sampling) -> dict[str, torch.Tensor]:
    """Means over rows and positions of KL(p_guided || q_guided) and of the total variation
    tv = 1 - sum_x min(p, q) (the rejection probability of exact speculative sampling), both
    differentiable; the feature term (head only); the acceptance probability ``overlap`` = 1 - tv and
    top-1 agreement (no gradient)."""
    logp, hc, hu = teacher_log_law(target, labels, codes, sampling)
    logq, v, first = student_log_law(student, target, labels, codes, sampling, (hc, hu))
    logp = logp[:, first:]
    p = logp.exp()
    kl = (p * (logp - logq)).sum(-1).mean()
    tv = 1.0 - torch.minimum(p, logq.exp()).sum(-1).mean()
    with torch.no_grad():
        top1 = (p.argmax(-1) == logq.argmax(-1)).float().mean()
    return {"kl": kl, "tv": tv, "v_loss": v, "overlap": 1.0 - tv.detach(), "top1": top1}


@torch.no_grad()
def evaluate(student, target: LlamaGen, labels: torch.Tensor, codes: torch.Tensor, sampling: Sampling,
             batch_size: int = 32) -> dict[str, float]:
    """Held-out means (row-weighted) of ``distill_losses``: kl, v_loss, sum min(p, q), top-1 agreement."""
    was = student.training
    student.eval()
    sums: dict[str, float] = {}
    for i in range(0, len(codes), batch_size):
        out = distill_losses(student, target, labels[i:i + batch_size], codes[i:i + batch_size], sampling)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(codes[i:i + batch_size])
    student.train(was)
    return {k: v / max(len(codes), 1) for k, v in sums.items()}


# ---------------------------------------------------------------- samples
@torch.no_grad()
def make_samples(target: LlamaGen, count: int, batch: int, sampling: Sampling, seed: int) -> dict:
    """``count`` sequences of the target's own AR sampling, classes cycled: {"labels", "codes"}."""
    labels = torch.arange(count) % target.num_conditions
    codes = []
    for i, start in enumerate(range(0, count, batch)):
        y = labels[start:start + batch]
        codes.append(specvis.generate(target, y, specvis.AR(), sampling, seed=seed + i).tokens.cpu())
        print(f"generated {start + len(y)}/{count} samples", flush=True)
    return {"labels": labels, "codes": torch.cat(codes).long(), "sampling": sampling.__dict__.copy(), "seed": seed}


def load_samples(path: Path, target: LlamaGen, args: argparse.Namespace, sampling: Sampling) -> dict:
    if path.exists() and not args.fresh:
        try:
            samples = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot read samples {path}: {exc}") from None
        if samples["codes"].shape[1] != target.layout.num_tokens:
            raise ValueError(f"{path}: samples of {samples['codes'].shape[1]} tokens, the target makes "
                             f"{target.layout.num_tokens}; use --fresh or another --out")
        print(f"reusing {len(samples['codes'])} samples from {path}", flush=True)
        return samples
    samples = make_samples(target, args.samples, args.sample_batch, sampling, args.seed)
    atomic_write(path, lambda tmp: torch.save(samples, tmp))
    return samples


# ---------------------------------------------------------------- run
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.distill", description=__doc__.split("\n")[0])
    p.add_argument("--student", choices=["draft", "drafter"], required=True,
                   help="draft: the draft LlamaGen; drafter: the EAGLE head")
    p.add_argument("--target", default=str(BUNDLE / "target"), help="target LlamaGen directory (default: the emoji bundle's)")
    p.add_argument("--init", default=None, help="student to start from (default: the bundle's draft/ or drafter/)")
    p.add_argument("--samples", type=int, default=512, help="target samples to generate (last eighth held out)")
    p.add_argument("--sample-batch", type=int, default=32, help="samples per generation call")
    p.add_argument("--cfg-scale", type=float, default=3.0, help="CFG scale of the sampling law (bundle: 3)")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampling law (bundle: 1)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps")
    p.add_argument("--v-weight", type=float, default=0.1, help="drafter: weight of the feature regression term")
    p.add_argument("--divergence", choices=["kl", "tv"], default="kl",
                   help="kl: KL(p || q); tv: total variation 1 - sum min(p, q), the rejection probability "
                        "itself (DistillSpec's TVD), e.g. to fine-tune a KL-distilled student")
    p.add_argument("--device", default="cpu")
    add_loop_arguments(p, minutes=30.0, weight_decay=0.0)
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.student].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.init is None:
        args.init = str(BUNDLE / args.student)
    for name in ("samples", "sample_batch", "batch_size", "lr", "minutes", "threads", "temperature",
                 "ckpt_every", "eval_every", "log_every", "grad_clip"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.samples < 2:
        p.error("--samples must be >= 2 (one eighth, at least one, is held out)")
    if args.cfg_scale < 0 or args.v_weight < 0:
        p.error("--cfg-scale and --v-weight must be >= 0")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return args


def load_student(kind: str, directory: str, target: LlamaGen):
    if kind == "drafter":
        student = EagleDrafter.from_pretrained(directory, target)
        if student.config.own_embeddings:
            student.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen (train_drafter)
        return student
    student = LlamaGen.from_pretrained(directory)
    if (student.layout.vocab_size, student.layout.num_tokens) != (target.layout.vocab_size, target.layout.num_tokens):
        raise ValueError(f"draft {directory} does not fit the target's vocabulary/grid")
    return student


def _train(args: argparse.Namespace, stop: StopFlag) -> dict | None:
    """Run (or resume) the distillation; the report written to ``OUT/report.json`` (None when stopped by a signal)."""
    out, state = open_run(args)
    hp = state["hparams"] if state is not None else {
        k: getattr(args, k) for k in ("student", "target", "init", "batch_size", "lr", "warmup", "weight_decay",
                                      "grad_clip", "seed", "cfg_scale", "temperature", "v_weight", "divergence")}
    hp["minutes"] = args.minutes
    if state is not None:
        print(f"resuming from {out / 'ckpt.pt'} at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    sampling = Sampling(temperature=hp["temperature"], cfg_scale=hp["cfg_scale"])
    divergence = hp.get("divergence", "kl")  # runs begun before --divergence minimised KL
    target = LlamaGen.from_pretrained(hp["target"]).float().eval().to(args.device)
    for prm in target.parameters():
        prm.requires_grad_(False)
    if target.cls_embedding.embedding_table.num_embeddings <= target.null_condition:
        raise ValueError("the target has no null class: no CFG to distil")
    samples = load_samples(out / "samples.pt", target, args, sampling)
    codes, labels = samples["codes"].to(args.device), samples["labels"].to(args.device)
    M = len(codes)
    held = max(1, M // 8)
    tr_codes, tr_labels, ev_codes, ev_labels = codes[:M - held], labels[:M - held], codes[M - held:], labels[M - held:]

    torch.manual_seed(hp["seed"])
    student = load_student(hp["student"], hp["init"], target).float().to(args.device).train()
    opt = make_optimizer(student, hp["lr"], hp["weight_decay"])
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    before = state.get("before") if state is not None else evaluate(student, target, ev_labels, ev_codes, sampling)
    step, elapsed = restore(state, student, opt, gen, out)
    n_params = sum(q.numel() for q in student.parameters() if q.requires_grad)
    print(f"distil {hp['student']} ({n_params / 1e6:.2f}M trainable) toward the target's guided law "
          f"(CFG {hp['cfg_scale']}, T {hp['temperature']}): {M - held} train / {held} held-out samples of "
          f"{codes.shape[1]}, batch {hp['batch_size']}, lr {hp['lr']}, budget {args.minutes} min, "
          f"{args.threads} thread(s)", flush=True)
    print("before: " + _fmt(before), flush=True)

    def save_ckpt(step: int, elapsed: float) -> None:
        blob = {"hparams": hp, "model": student.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "step": step, "elapsed": elapsed, "before": before}
        atomic_write(out / "ckpt.pt", lambda tmp: torch.save(blob, tmp))

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        parts = distill_losses(student, target, tr_labels[idx.to(args.device)], tr_codes[idx.to(args.device)], sampling)
        return parts[divergence] + hp["v_weight"] * parts["v_loss"]

    done = fit(student, opt, gen, hp, args, step, elapsed, len(tr_codes), codes.shape[1], batch_loss,
               lambda: evaluate(student, target, ev_labels, ev_codes, sampling)[divergence], save_ckpt, out, stop)
    if done is None:
        return None
    step, elapsed = done
    student.eval()
    after = evaluate(student, target, ev_labels, ev_codes, sampling)
    report = {"student": hp["student"], "before": before, "after": after, "steps": step,
              "train_minutes": round(elapsed / 60.0, 2), "budget_minutes": hp["minutes"], "hparams": hp,
              "samples": M, "held_out": held, "sampling": sampling.__dict__.copy(), "trainable_params": n_params,
              "machine": machine_info(args.threads)}
    save_final(student, out, report, f"after: {_fmt(after)}; {step} steps in {elapsed / 60:.1f} min")
    return report


train = stoppable(_train)


def _fmt(ev: dict[str, float]) -> str:
    return (f"held-out KL {ev['kl']:.4f}, sum min(p,q) {ev['overlap']:.4f}, top-1 agreement {ev['top1']:.4f}"
            + (f", v_loss {ev['v_loss']:.4f}" if ev.get("v_loss") else ""))


def main(argv: list[str] | None = None) -> int:
    return run_main(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
