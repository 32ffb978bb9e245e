"""Realism report for the trained emoji models: how peaked the target is, and how well the draft agrees.

On the target's own samples (AR, temperature 1, no top-k/top-p, CFG ``--cfg``) it measures the
target's next-token law along those sequences (the law it sampled from): mean top-1 probability and
entropy (compare LANTERN, Fig. 2c: LlamaGen's mean top-1 probability is only ~0.2-0.3), a 16x16
per-position map of the top-1 probability (ADT-Tree, Fig. 4), and the draft's agreement with the
target on the same prefixes (top-1: same argmax; top-3: target argmax in the draft's top 3;
``sum min(p, q)``: the per-token acceptance probability of exact speculative sampling). The same
numbers are computed teacher-forced on the held-out token sequences. It also plots the VQ, target
and draft loss curves from their run logs and decodes the samples into an image grid.

Outputs under ``--out``: ``training_report.json``, ``img/*.png``; the markdown snippet is printed and,
with ``--md``, replaces the generated blocks of that file (between ``<!-- report:NAME -->`` and
``<!-- /report:NAME -->``). Parts whose inputs are missing are reported as pending.

    python -m specvis.train.report --vq runs/vq/final --target runs/target/final --draft runs/draft/final \\
        --tokens data/emoji_tokens.npz --out docs/ --md docs/training.md
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

import specvis
from specvis.io import atomic_write, write_text
from specvis.models.llamagen import LlamaGen
from specvis.train.common import machine_info
from specvis.train.train_ar import load_model, load_tokens

PENDING = "pending"


# ---------------------------------------------------------------- measurements
@torch.no_grad()
def next_token_laws(model: LlamaGen, conditions: torch.Tensor, tokens: torch.Tensor,
                    sampling: specvis.Sampling) -> torch.Tensor:
    """The sampling law (B, L, V) of ``model`` at every position of ``tokens``, teacher-forced; the
    unconditional CFG branch is the null class, or for prompts the model's own unconditional rule."""
    cond = model.logits(conditions, tokens[:, :-1])
    uncond = None
    if sampling.uses_cfg:
        null = (model.unconditional(conditions) if isinstance(conditions, specvis.Prompts)
                else torch.full_like(conditions, model.null_condition))
        uncond = model.logits(null, tokens[:, :-1])
    return sampling.probs(cond, uncond)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last axis."""
    return -torch.special.xlogy(p, p).sum(-1)


@torch.no_grad()
def law_stats(target: LlamaGen, draft: LlamaGen | None, conditions: torch.Tensor, tokens: torch.Tensor,
              sampling: specvis.Sampling, batch_size: int = 16) -> dict:
    """Per-position target top-1 probability / entropy and draft agreement along ``tokens`` (B, L)."""
    top1, ent, agree1, agree3, overlap = [], [], [], [], []
    for i in range(0, len(tokens), batch_size):
        c, t = conditions[i:i + batch_size], tokens[i:i + batch_size]
        p = next_token_laws(target, c, t, sampling)
        top1.append(p.max(-1).values)
        ent.append(entropy(p))
        if draft is not None:
            q = next_token_laws(draft, c, t, sampling)
            arg_p = p.argmax(-1, keepdim=True)
            agree1.append((q.argmax(-1, keepdim=True) == arg_p)[..., 0].float())
            agree3.append((q.topk(3, dim=-1).indices == arg_p).any(-1).float())
            overlap.append(torch.minimum(p, q).sum(-1))
    top1_t, ent_t = torch.cat(top1), torch.cat(ent)
    out = {"sequences": len(tokens), "positions": int(tokens.shape[1]),
           "target_top1_mean": float(top1_t.mean()), "target_top1_median": float(top1_t.median()),
           "target_entropy_mean": float(ent_t.mean()),
           "target_top1_per_position": top1_t.mean(0).tolist()}
    if draft is not None:
        out.update({"draft_top1_agreement": float(torch.cat(agree1).mean()),
                    "draft_top3_agreement": float(torch.cat(agree3).mean()),
                    "draft_acceptance_prob": float(torch.cat(overlap).mean())})
    return out


def spread_classes(num_classes: int, per_class: int) -> torch.Tensor:
    """``per_class`` copies of every class id, interleaved (0, 1, ..., C-1, 0, 1, ...)."""
    return torch.arange(num_classes).repeat(per_class)


# ---------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_fig(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    _plt().close(fig)


def read_csv(path: Path) -> dict[str, np.ndarray]:
    """Numeric columns of a CSV log (empty dict if missing or empty)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    cols = {}
    for key in rows[0]:
        try:
            cols[key] = np.array([float(r[key]) for r in rows])
        except (TypeError, ValueError):
            continue
    return cols


def plot_heatmap(per_position: list[float], grid: tuple[int, int], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    im = ax.imshow(np.asarray(per_position).reshape(grid), cmap="viridis", vmin=0.0)
    fig.colorbar(im, ax=ax, label="mean top-1 probability")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    _save_fig(fig, path)


def plot_ar_losses(run_dir: Path, path: Path, name: str, vocab: int | None) -> bool:
    """Training and held-out loss of a train_ar run; False when it has no log yet."""
    train, ev = read_csv(run_dir / "losses.csv"), read_csv(run_dir / "eval.csv")
    if not train:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(train["step"], train["loss"], lw=0.8, label="train (running mean)")
    if ev:
        ax.plot(ev["step"], ev["eval_loss"], "o-", ms=3, label="held-out")
    if vocab:
        ax.axhline(math.log(vocab), color="gray", ls=":", lw=0.8, label=f"uniform ln {vocab}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    done = (run_dir / "report.json").exists()
    ax.set_title(f"{name} loss" + ("" if done else f" (in progress, step {int(train['step'][-1])})"), fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save_fig(fig, path)
    return True


def plot_vq_losses(run_dir: Path, path: Path) -> bool:
    """VQ reconstruction losses and held-out PSNR; False when it has no log yet."""
    train, ev = read_csv(run_dir / "losses.csv"), read_csv(run_dir / "eval.csv")
    if not train:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for key in ("loss", "l1", "mse"):
        if key in train:
            ax.plot(train["step"], train[key], lw=0.8, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if ev and "eval_psnr" in ev:
        ax2 = ax.twinx()
        ax2.plot(ev["step"], ev["eval_psnr"], "o-", color="C3", ms=3, label="held-out PSNR (dB)")
        ax2.set_ylabel("PSNR (dB)")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8)
    ax.set_title("VQ tokenizer training", fontsize=10)
    _save_fig(fig, path)
    return True


def save_image_grid(images: list, path: Path, columns: int) -> None:
    from PIL import Image

    w, h = images[0].size
    rows = -(-len(images) // columns)
    sheet = Image.new("RGB", (columns * w, rows * h), "white")
    for i, im in enumerate(images):
        sheet.paste(im, ((i % columns) * w, (i // columns) * h))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: sheet.save(tmp, format="PNG"))


@torch.no_grad()
def decode_tokens(vq_dir: Path, tokens: torch.Tensor) -> list:
    """PIL images of token grids (B, h*w) through the VQ decoder."""
    from PIL import Image

    from specvis.train.tokenize import load_vq

    vq = load_vq(vq_dir).eval()
    images = vq.decode_latents(vq.codes_to_latents(tokens))
    arr = images.add(1).mul(127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arr]


# ---------------------------------------------------------------- markdown
def _read_report(final_dir: Path | None) -> dict | None:
    if final_dir is None:
        return None
    path = Path(final_dir).parent / "report.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return PENDING
    if isinstance(v, float):
        return f"{v:.{digits}g}" if 0 < abs(v) < 0.01 else f"{v:.{digits}f}"
    return str(v)


def recipe_markdown(runs: dict[str, dict | None]) -> str:
    """A table of the recipe numbers from the runs' report.json files (pending where missing)."""
    vq, tgt, drf = runs.get("vq"), runs.get("target"), runs.get("draft")
    lines = ["| | VQ tokenizer | target | draft |", "| --- | --- | --- | --- |"]

    def row(label: str, vq_v, t_key: str | None = None, fmt=_fmt) -> None:
        vals = [fmt(vq_v) if vq is not None else PENDING]
        for r in (tgt, drf):
            vals.append(fmt(r.get(t_key)) if r is not None and t_key else (PENDING if r is None else "-"))
        lines.append(f"| {label} | " + " | ".join(vals) + " |")

    g = (lambda k: vq.get(k)) if vq is not None else (lambda k: None)
    row("parameters", g("params"), "params", lambda v: f"{v / 1e6:.2f}M" if isinstance(v, int) else _fmt(v))
    row("steps", g("steps"), "steps")
    row("batch size", g("batch_size"), "batch_size")
    row("peak lr", None if vq is None else "3e-4 (default)", "lr")
    def fixed(digits: int):
        return lambda v: f"{v:.{digits}f}" if isinstance(v, (int, float)) else _fmt(v)

    row("training minutes", g("train_minutes"), "train_minutes", fixed(1))
    row("epochs over the training set", None if vq is None else "-", "epochs", fixed(2))
    row("final train loss (nats/token)", "-", "final_train_loss")
    row("final held-out loss (nats/token)", "-", "final_eval_loss")
    row("held-out PSNR (dB)", g("eval_psnr_db"), None)
    row("codebook usage / perplexity", None if vq is None else
        f"{vq.get('codebook_usage_train', 0):.3f} / {vq.get('codebook_perplexity_train', 0):.0f}", None)
    threads = [str(r.get("threads", r.get("machine", {}).get("torch_threads", "?"))) if r else PENDING
               for r in (vq, tgt, drf)]
    lines.append("| torch threads | " + " | ".join(threads) + " |")
    m, where = next(((r["machine"], "from the AR runs' report.json") for r in (tgt, drf) if r and r.get("machine")),
                    (machine_info(torch.get_num_threads()), "where this report was generated"))
    lines += ["", (f"Machine ({where}): {m.get('platform')}, {m.get('processor')}, {m.get('cpu_count')} CPUs, "
                   f"torch {m.get('torch')}.")]
    return "\n".join(lines)


def realism_markdown(rep: dict) -> str:
    """The realism numbers as a markdown table (pending when the models are missing)."""
    own, data = rep.get("target_samples"), rep.get("eval_data")
    if own is None:
        return f"Realism numbers: {PENDING} (target and draft not trained yet)."
    s = rep["settings"]
    lines = [(f"Target samples: {own['sequences']} sequences (AR, temperature {s['temperature']}, "
             f"top-k none, CFG {s['cfg_scale']}, seed {s['seed']}); "
             f"laws are the guided, tempered next-token distributions the sampler used."), "",
             ("| measured on | target mean top-1 prob | median top-1 | mean entropy (nats) | "
             "draft top-1 agree | draft top-3 agree | sum min(p, q) |"), "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in (("target's own samples", own), ("held-out sequences (teacher-forced)", data)):
        if r is None:
            continue
        lines.append(f"| {name} | {r['target_top1_mean']:.3f} | {r['target_top1_median']:.3f} | "
                     f"{r['target_entropy_mean']:.3f} | {_fmt(r.get('draft_top1_agreement'))} | "
                     f"{_fmt(r.get('draft_top3_agreement'))} | {_fmt(r.get('draft_acceptance_prob'))} |")
    lines += ["", ("Reference: LANTERN (Fig. 2c) reports a mean top-1 probability of roughly 0.2-0.3 for "
              "LlamaGen on ImageNet; a much higher value here means our small emoji model is far more "
              "peaked (easier to draft for) than the real thing.")]
    return "\n".join(lines)


def update_md_blocks(path: Path, blocks: dict[str, str]) -> list[str]:
    """Replace ``<!-- report:NAME -->...<!-- /report:NAME -->`` blocks in ``path``; returns names replaced."""
    text = path.read_text()
    done = []
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- report:{name} -->\n).*?(<!-- /report:{name} -->)", re.DOTALL)
        if pattern.search(text):
            text = pattern.sub(lambda m, b=body: m.group(1) + b.rstrip() + "\n" + m.group(2), text)
            done.append(name)
    write_text(path, text)
    return done


# ---------------------------------------------------------------- main
def build_report(args: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    """Measure, plot and return (json report, markdown blocks)."""
    out = Path(args.out)
    img = out / "img"
    run_dirs = {name: Path(getattr(args, name)).parent for name in ("vq", "target", "draft")}
    runs = {name: _read_report(Path(getattr(args, name))) for name in ("vq", "target", "draft")}
    rep: dict = {"settings": {"temperature": 1.0, "top_k": None, "cfg_scale": args.cfg, "seed": args.seed,
                              "per_class": args.per_class},
                 "runs": {k: ({kk: v[kk] for kk in v if kk != "config"} if v else None) for k, v in runs.items()},
                 "images": {}}
    plots = {"vq": plot_vq_losses(run_dirs["vq"], img / "loss_vq.png")}
    target_dir, draft_dir = Path(args.target), Path(args.draft)
    have_target = (target_dir / "config.json").exists()
    have_draft = (draft_dir / "config.json").exists()
    vocab = None
    if have_target:
        target = load_model(target_dir)
        vocab = target.layout.vocab_size
    plots["target"] = plot_ar_losses(run_dirs["target"], img / "loss_target.png", "target", vocab)
    plots["draft"] = plot_ar_losses(run_dirs["draft"], img / "loss_draft.png", "draft", vocab)
    for name, ok in plots.items():
        rep["images"][f"loss_{name}"] = f"img/loss_{name}.png" if ok else None
    rep["target_samples"] = rep["eval_data"] = None
    if have_target:
        draft = load_model(draft_dir) if have_draft else None
        sampling = specvis.Sampling(temperature=1.0, top_k=None, top_p=None, cfg_scale=args.cfg)
        conds = spread_classes(target.num_conditions, args.per_class)
        t0 = time.monotonic()
        tokens = specvis.generate(target, conds, specvis.AR(), sampling, seed=args.seed).tokens
        rep["settings"]["sampling_seconds"] = round(time.monotonic() - t0, 1)
        rep["target_samples"] = law_stats(target, draft, conds, tokens, sampling)
        if args.tokens and Path(args.tokens).exists():
            data = load_tokens(args.tokens)
            n = min(args.eval_sequences, len(data["eval_codes"]))
            rep["eval_data"] = law_stats(target, draft, torch.from_numpy(data["eval_labels"][:n].astype(np.int64)),
                                         torch.from_numpy(data["eval_codes"][:n].astype(np.int64)), sampling)
        grid = (target.layout.height, target.layout.width)
        plot_heatmap(rep["target_samples"]["target_top1_per_position"], grid, img / "top1_heatmap.png",
                     f"target top-1 probability per position\n(own samples, CFG {args.cfg}, T=1)")
        rep["images"]["top1_heatmap"] = "img/top1_heatmap.png"
        if (Path(args.vq) / "config.json").exists():
            save_image_grid(decode_tokens(Path(args.vq), tokens), img / "target_samples.png",
                            columns=target.num_conditions)
            rep["images"]["target_samples"] = "img/target_samples.png"
    blocks = {"recipe": recipe_markdown(runs), "realism": realism_markdown(rep)}
    figs = [f"![{k}]({v})" for k, v in rep["images"].items() if v]
    if figs:
        blocks["realism"] += "\n\n" + "\n".join(figs)
    return rep, blocks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.report", description=__doc__.split("\n")[0])
    p.add_argument("--vq", default="runs/vq/final", help="VQ save_pretrained directory (its run logs are next to it)")
    p.add_argument("--target", default="runs/target/final", help="target LlamaGen directory")
    p.add_argument("--draft", default="runs/draft/final", help="draft LlamaGen directory")
    p.add_argument("--tokens", default="data/emoji_tokens.npz", help="token .npz (held-out sequences)")
    p.add_argument("--out", default="docs", help="where training_report.json and img/ go")
    p.add_argument("--md", default=None, help="markdown file whose report blocks are refreshed")
    p.add_argument("--cfg", type=float, default=3.0, help="classifier-free guidance scale for the samples")
    p.add_argument("--per-class", type=int, default=4, help="samples per class")
    p.add_argument("--eval-sequences", type=int, default=111, help="held-out sequences to measure (at most)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.per_class < 1 or args.threads < 1 or args.eval_sequences < 1:
        p.error("--per-class, --threads and --eval-sequences must be >= 1")
    torch.set_num_threads(args.threads)
    try:
        rep, blocks = build_report(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "training_report.json", json.dumps(rep, indent=2) + "\n")
    snippet = "### Recipe\n\n" + blocks["recipe"] + "\n\n### Realism\n\n" + blocks["realism"]
    print(snippet)
    if args.md and not Path(args.md).exists():
        print(f"\n{args.md} does not exist; no blocks refreshed", file=sys.stderr)
    elif args.md:
        done = update_md_blocks(Path(args.md), blocks)
        print(f"\nrefreshed blocks {done} in {args.md}; wrote {out / 'training_report.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
