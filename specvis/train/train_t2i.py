"""Train a text-to-image emoji model (target or draft) in the Janus-Pro layout (CPU, time-limited, resumable).

Data: the code sequences of :mod:`specvis.train.tokenize` run over an :mod:`specvis.train.emoji_captions`
dataset (``--tokens``; each row's ``train_source`` names its glyph), that dataset's captions
(``--data``) and the caption tokenizer (``--tokenizer``). A row's prompt is one of its glyph's captions,
drawn afresh at every visit, encoded as Janus image mode encodes it (BOS, caption, begin-of-image).
With probability ``--caption-dropout`` the prompt is replaced by Janus's unconditional prompt (every
token but BOS and begin-of-image replaced by pad, same length), so CFG works with the family's own
rule. Objective: next-code cross-entropy over all 256 codes (``PromptDecoder.forward_train``, prompts
left-padded, padding never attended). Optimiser, schedule, budget, checkpoints and logs are
:func:`specvis.train.train_ar.fit`'s.

Output: ``OUT/final/`` (``model.safetensors`` + ``spec.json``: a :class:`JanusSpec`; export it with
:mod:`specvis.train.janus_export`) and ``OUT/report.json``.

    python -m specvis.train.train_t2i --preset target --out runs/t2i_target --minutes 80
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specvis.train import atomic_write
from specvis.train.common import machine_info, run_main, write_text
from specvis.train.emoji_captions import load_captions
from specvis.train.janus_format import JanusSpec, new_decoder
from specvis.train.train_ar import StopFlag, add_loop_arguments, fit, load_tokens, make_optimizer, open_run, restore, stoppable

PRESETS: dict[str, dict] = {
    "target": {"dim": 256, "n_layer": 5, "n_head": 4, "ffn_hidden": 704, "batch_size": 16, "lr": 8e-4, "warmup": 100},
    "draft": {"dim": 96, "n_layer": 2, "n_head": 2, "ffn_hidden": 256, "batch_size": 32, "lr": 1e-3, "warmup": 200},
}


class CaptionTable:
    """Every caption of every glyph pre-encoded as Janus image-mode prompt ids; batches of left-padded prompts."""

    def __init__(self, tokenizer, captions: dict[int, list[str]], codepoints: np.ndarray) -> None:
        boi = tokenizer.boi_token
        self.pad, self.keep = tokenizer.pad_token_id, (tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids(boi))
        self.options = []  # per row of codepoints: list of id lists
        for cp in codepoints:
            if int(cp) not in captions:
                raise ValueError(f"no captions for U+{int(cp):04X} in the dataset's captions.json")
            self.options.append([tokenizer(c + boi)["input_ids"] for c in captions[int(cp)]])

    def batch(self, rows: torch.Tensor, gen: torch.Generator | None, dropout: float = 0.0,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, P) left-padded, lengths (B,)): a random caption per row (the first when ``gen`` is
        None), made unconditional with probability ``dropout``."""
        chosen = []
        for r in rows.tolist():
            opts = self.options[r]
            ids = list(opts[0 if gen is None else int(torch.randint(len(opts), (1,), generator=gen))])
            if gen is not None and dropout > 0 and float(torch.rand((), generator=gen)) < dropout:
                ids = [t if t in self.keep else self.pad for t in ids]
            chosen.append(ids)
        P = max(map(len, chosen))
        out = torch.full((len(chosen), P), self.pad, dtype=torch.long)
        for i, ids in enumerate(chosen):
            out[i, P - len(ids):] = torch.tensor(ids)
        return out, torch.tensor([len(c) for c in chosen])


def caption_loss(model, table: CaptionTable, rows: torch.Tensor, codes: torch.Tensor,
                 gen: torch.Generator | None, dropout: float) -> torch.Tensor:
    """Mean next-code cross-entropy of ``codes`` (B, L) given the rows' prompts."""
    ids, lengths = table.batch(rows, gen, dropout)
    logits = model.forward_train(ids, lengths, codes)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), codes.reshape(-1))


@torch.no_grad()
def mean_loss(model, table: CaptionTable, codes: np.ndarray, batch_size: int = 64) -> float:
    """Token-averaged cross-entropy (nats) of ``codes`` under each row's first caption, eval mode."""
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(codes), batch_size):
        rows = torch.arange(i, min(i + batch_size, len(codes)))
        total += float(caption_loss(model, table, rows, torch.from_numpy(codes[rows.numpy()].astype(np.int64)), None, 0.0)) * len(rows)
    model.train(was)
    return total / max(len(codes), 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specvis.train.train_t2i", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="data/emoji_t2i_tokens.npz", help="codes .npz from specvis.train.tokenize")
    p.add_argument("--data", default="data/emoji_t2i", help="dataset directory of specvis.train.emoji_captions")
    p.add_argument("--tokenizer", default="data/emoji_t2i/tokenizer", help="caption tokenizer directory")
    p.add_argument("--preset", choices=sorted(PRESETS), default="target", help="model size and optimiser defaults")
    add_loop_arguments(p, minutes=80.0, weight_decay=0.05)
    for name, kind in (("dim", int), ("n-layer", int), ("n-head", int), ("ffn-hidden", int), ("batch-size", int),
                       ("lr", float), ("warmup", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help="override the preset")
    p.add_argument("--caption-dropout", type=float, default=0.1, help="probability of the unconditional prompt")
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("minutes", "threads", "dim", "n_layer", "n_head", "ffn_hidden", "batch_size", "lr", "ckpt_every",
                 "eval_every", "log_every", "grad_clip"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 < args.caption_dropout < 1.0:
        p.error("--caption-dropout must be in (0, 1): the unconditional prompt is needed for guidance")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return args


def _train(args: argparse.Namespace, stop: StopFlag) -> dict | None:
    """Run (or resume) training; the report, or None when stopped by a signal (checkpointed)."""
    from specvis.train.text_tokenizer import load as load_tokenizer

    out, state = open_run(args)
    data = load_tokens(args.tokens)
    try:
        with np.load(Path(args.data) / "train.npz") as z:
            train_cps = z["codepoints"][data["train_source"]]
        eval_cps = data["eval_codepoints"]
        tokenizer = load_tokenizer(args.tokenizer)
    except (OSError, KeyError) as exc:
        raise ValueError(f"cannot read the dataset or tokenizer: {exc}") from None
    captions = load_captions(args.data)
    train_table, eval_table = CaptionTable(tokenizer, captions, train_cps), CaptionTable(tokenizer, captions, eval_cps)
    train_codes, eval_codes = data["train_codes"], data["eval_codes"]
    L, grid = int(train_codes.shape[1]), math.isqrt(int(train_codes.shape[1]))
    if state is not None:
        spec, hp = JanusSpec(**state["config"]), state["hparams"]
        print(f"resuming at step {state['step']} ({state['elapsed'] / 60:.1f} min done)", flush=True)
    else:
        spec = JanusSpec(text_vocab_size=len(tokenizer), bos=tokenizer.bos_token_id, pad=tokenizer.pad_token_id,
                         boi=tokenizer.convert_tokens_to_ids(tokenizer.boi_token), dim=args.dim, n_layer=args.n_layer,
                         n_head=args.n_head, n_kv_head=args.n_head, ffn_hidden=args.ffn_hidden,
                         codes=int(data["codebook_size"]), grid=grid)
        hp = {k: getattr(args, k) for k in ("preset", "batch_size", "lr", "warmup", "weight_decay", "caption_dropout",
                                            "grad_clip", "seed")}
    hp["minutes"] = args.minutes
    if (spec.codes, spec.grid ** 2) != (int(data["codebook_size"]), L):
        raise ValueError(f"checkpoint expects {spec.codes} codes x {spec.grid ** 2} tokens, the token file has "
                         f"{int(data['codebook_size'])} x {L}")
    torch.manual_seed(hp["seed"])
    model = new_decoder(spec).train()
    opt = make_optimizer(model, hp["lr"], hp["weight_decay"])
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    step, elapsed = restore(state, model, opt, gen, out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{hp['preset']}: Janus-layout decoder {n_params / 1e6:.2f}M params (dim {spec.dim}, {spec.n_layer} layers), "
          f"text vocab {spec.text_vocab_size}, {len(train_codes)} train / {len(eval_codes)} eval sequences of {L}, "
          f"batch {hp['batch_size']}, budget {args.minutes} min, {args.threads} thread(s)", flush=True)

    def save_ckpt(step: int, elapsed: float) -> None:
        blob = {"config": spec.to_dict(), "hparams": hp, "model": model.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "step": step, "elapsed": elapsed}
        atomic_write(out / "ckpt.pt", lambda tmp: torch.save(blob, tmp))

    codes_t = torch.from_numpy(train_codes.astype(np.int64))
    done = fit(model, opt, gen, hp, args, step, elapsed, len(codes_t), L,
               lambda idx: caption_loss(model, train_table, idx, codes_t[idx], gen, hp["caption_dropout"]),
               lambda: mean_loss(model, eval_table, eval_codes), save_ckpt, out, stop)
    if done is None:
        return None
    step, elapsed = done
    model.eval()
    sub = np.random.default_rng(0).choice(len(train_codes), size=min(512, len(train_codes)), replace=False)
    sub_table = CaptionTable(tokenizer, captions, train_cps[sub])
    report = {"preset": hp["preset"], "final_train_loss": mean_loss(model, sub_table, train_codes[sub]),
              "final_eval_loss": mean_loss(model, eval_table, eval_codes), "train_loss_subset": len(sub),
              "uniform_loss": math.log(spec.codes), "steps": step, **hp,
              "tokens_seen": step * hp["batch_size"] * L, "epochs": step * hp["batch_size"] / len(train_codes),
              "train_minutes": round(elapsed / 60.0, 2), "params": n_params, "spec": spec.to_dict(),
              "num_train_sequences": len(train_codes), "num_eval_sequences": len(eval_codes),
              "tokens_file": str(args.tokens), "machine": machine_info(args.threads)}
    save_final(model, spec, out / "final")
    write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    print(f"final train loss {report['final_train_loss']:.4f}, eval loss {report['final_eval_loss']:.4f}; "
          f"{step} steps in {elapsed / 60:.1f} min; wrote {out / 'final'}", flush=True)
    return report


train = stoppable(_train)


def save_final(model, spec: JanusSpec, directory: Path) -> None:
    """``model.safetensors`` + ``spec.json`` (atomic files)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(sd, tmp))
    write_text(directory / "spec.json", json.dumps(spec.to_dict(), indent=2) + "\n")


def load_final(directory: str | Path):
    """(model in eval mode, spec) from ``OUT/final``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    try:
        spec = JanusSpec(**json.loads((directory / "spec.json").read_text()))
    except (OSError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{directory}: not a train_t2i final directory ({exc})") from None
    model = new_decoder(spec)
    model.load_state_dict(load_file(str(directory / "model.safetensors")))
    return model.eval(), spec


def main(argv: list[str] | None = None) -> int:
    return run_main(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
