"""Training record and realism report of the ``emoji-t2i`` bundle, next to the class-conditional model's.

    python -m specvis.train.t2i_report --data data/emoji_t2i --tokens data/emoji_t2i_tokens.npz \\
        --runs runs --out docs/ --md docs/training.md

Measures what :mod:`specvis.train.report` measures for the class model, with prompts as conditions:
along the target's own AR samples (temperature 1, no top-k, the bundle's CFG; ``--per-split`` short
names of training glyphs and as many of held-out glyphs, spread over the codepoint order) and
teacher-forced along the held-out glyphs' code sequences under their short names: the target's mean /
median top-1 probability and entropy of the guided law, and the draft's top-1 / top-3 agreement and
sum min(p, q). Also: loss curves of the two runs, and image sheets (real glyph above, sample below)
for the training and the held-out prompts. Writes ``OUT/training_t2i_report.json``, ``OUT/img/t2i_*.png``
and the ``t2i-recipe`` / ``t2i-realism`` blocks of ``--md``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import specvis
from specvis.io import write_text
from specvis.zoo import ASSETS
from specvis.train.report import law_stats, plot_ar_losses, save_image_grid, update_md_blocks

__all__ = ["spread_prompts", "build_report", "main"]


def spread_prompts(table: dict[str, dict], split: str, count: int) -> list[str]:
    """``count`` short names of ``split`` glyphs evenly spaced in codepoint order."""
    names = sorted((v["codepoint"], k) for k, v in table.items() if v["split"] == split)
    idx = np.linspace(0, len(names) - 1, min(count, len(names))).round().astype(int)
    return [names[i][1] for i in idx]


def _real_images(data: Path, table: dict[str, dict], names: list[str]) -> list:
    from PIL import Image

    images = {}
    for split in ("train", "eval"):
        with np.load(data / f"{split}.npz") as z:
            for cp, img in zip(z["codepoints"].tolist(), z["images"]):
                images[f"U+{cp:04X}"] = img
    return [Image.fromarray(images[table[n]["codepoint"]]) for n in names]


def _row(stats: dict) -> str:
    f = lambda k: f"{stats[k]:.3f}" if stats.get(k) is not None else "-"
    return (f"{f('target_top1_mean')} | {f('target_top1_median')} | {f('target_entropy_mean')} | "
            f"{f('draft_top1_agreement')} | {f('draft_top3_agreement')} | {f('draft_acceptance_prob')} |")


def recipe_markdown(meta: dict) -> str:
    """The training record of the bundle's parts (``bundle.json``'s ``training``) as a markdown table."""
    lines = ["| model | run | params | steps | epochs | minutes | final train loss | final held-out loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in ("target", "draft"):
        r = meta.get(k, {})
        if r:
            lines.append(f"| emoji-t2i {k} | `runs/t2i_{k}` | {r['params'] / 1e6:.2f}M | {r['steps']} | {r['epochs']:.2f} | "
                         f"{r['train_minutes']:.1f} | {r['final_train_loss']:.3f} | {r['final_eval_loss']:.3f} |")
    d = meta.get("drafter")
    if d:
        lines.append(f"| emoji-t2i EAGLE head | `runs/t2i_drafter` | {d['trainable_params'] / 1e6:.2f}M trainable | "
                     f"{d['steps']} | {d['samples']} target samples | {d['train_minutes']:.1f} | - | - |")
    return "\n".join(lines)


def build_report(args: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    pipe = specvis.load("emoji-t2i")
    table = json.loads((ASSETS / "emoji_t2i" / "prompts.json").read_text())
    sampling = pipe.default_sampling
    out, img = Path(args.out), Path(args.out) / "img"
    rep: dict = {"settings": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                              "cfg_scale": sampling.cfg_scale, "seed": args.seed, "per_split": args.per_split}}
    for split in ("train", "eval"):
        names = spread_prompts(table, split, args.per_split)
        gen = pipe(prompts=names, method=specvis.AR(), sampling=sampling, seed=args.seed)
        prompts = pipe.prefix(names, "prompts", *pipe.grid)
        rep[f"samples_{split}_prompts"] = {"prompts": names, **law_stats(pipe.target, pipe.draft, prompts, gen.tokens, sampling)}
        sheet = _real_images(Path(args.data), table, names[:12]) + gen.images[:12]
        save_image_grid(sheet, img / f"t2i_{split}_prompts.png", columns=min(12, len(names)))
    with np.load(args.tokens) as z:
        codes = torch.from_numpy(z["eval_codes"][: args.eval_sequences].astype(np.int64))
        cps = z["eval_codepoints"][: args.eval_sequences].tolist()
    by_cp = {v["codepoint"]: k for k, v in table.items()}
    names = [by_cp[f"U+{cp:04X}"] for cp in cps]
    prompts = pipe.prefix(names, "prompts", *pipe.grid)
    rep["heldout_teacher_forced"] = law_stats(pipe.target, pipe.draft, prompts, codes, sampling)
    for name in ("target", "draft"):
        plot_ar_losses(Path(args.runs) / f"t2i_{name}", img / f"t2i_loss_{name}.png", f"t2i {name}", pipe.target.layout.vocab_size)
    meta = pipe.extras["meta"]["training"]
    rep["runs"] = {k: {kk: v for kk, v in r.items() if kk not in ("spec", "machine")} for k, r in meta.items()}
    class_rep = json.loads((out / "training_report.json").read_text()) if (out / "training_report.json").exists() else {}

    recipe = recipe_markdown(meta)

    s = rep["settings"]
    rows = [f"Laws: the guided, tempered next-token distributions the sampler used (T={s['temperature']}, "
            f"CFG {s['cfg_scale']}, seed {s['seed']}).", "",
            "| model | measured on | target mean top-1 prob | median top-1 | mean entropy (nats) | draft top-1 agree | "
            "draft top-3 agree | sum min(p, q) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, key in ((f"own samples, {args.per_split} training prompts", "samples_train_prompts"),
                       (f"own samples, {args.per_split} held-out prompts", "samples_eval_prompts"),
                       ("held-out glyphs (teacher-forced)", "heldout_teacher_forced")):
        rows.append(f"| emoji-t2i | {label} | " + _row(rep[key]))
    for label, key in (("own samples", "target_samples"), ("held-out sequences (teacher-forced)", "eval_data")):
        if class_rep.get(key):
            rows.append(f"| emoji (class) | {label} | " + _row(class_rep[key]))
    rows += ["", "![t2i samples, training prompts](img/t2i_train_prompts.png)",
             "![t2i samples, held-out prompts](img/t2i_eval_prompts.png)",
             "![t2i target loss](img/t2i_loss_target.png)", "![t2i draft loss](img/t2i_loss_draft.png)"]
    return rep, {"t2i-recipe": recipe, "t2i-realism": "\n".join(rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.t2i_report", description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/emoji_t2i")
    p.add_argument("--tokens", default="data/emoji_t2i_tokens.npz")
    p.add_argument("--runs", default="runs", help="holds t2i_target/ and t2i_draft/ (loss logs)")
    p.add_argument("--out", default="docs")
    p.add_argument("--md", default="docs/training.md")
    p.add_argument("--per-split", type=int, default=24, help="prompts sampled per split")
    p.add_argument("--eval-sequences", type=int, default=64, help="held-out glyphs teacher-forced")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--recipe-only", action="store_true", help="only rewrite the t2i-recipe block from bundle.json")
    args = p.parse_args(argv)
    if args.recipe_only:
        meta = json.loads((ASSETS / "emoji_t2i" / "bundle.json").read_text())["training"]
        print(update_md_blocks(Path(args.md), {"t2i-recipe": recipe_markdown(meta)}))
        return 0
    torch.set_num_threads(args.threads)
    try:
        rep, blocks = build_report(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_text(Path(args.out) / "training_t2i_report.json", json.dumps(rep, indent=1) + "\n")
    done = update_md_blocks(Path(args.md), blocks)
    print(f"wrote {args.out}/training_t2i_report.json; updated blocks {done} of {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
