"""Widen a trained LlamaGen without changing what it computes (function-preserving growth, as in Net2Net's
idea of starting a larger student from a smaller one's function; here by zero writes, not by copies).

A model of width d0 with H0 heads of size h becomes one of width D > d0 with H > H0 heads of the same
size h (so the per-head RoPE frequencies are unchanged) and a wider feed-forward F >= F0:

- every weight that *reads* the residual stream keeps its old block and gets fresh random entries for
  the new inputs and the new units (new heads, new feed-forward rows, the output head's new columns);
- every weight that *writes* into the residual stream is zero from the new units (new heads' columns of
  ``wo``, new rows' columns of ``w2``) and zero into the new residual coordinates (the embeddings' new
  columns, ``wo`` / ``w2``'s new rows);

so the residual stream's new coordinates start at 0 and the old ones follow the old computation. The only
change is RMSNorm's mean over D instead of d0 coordinates: with the new ones at zero,
sqrt(mean_D(x^2) + eps d0 / D) = sqrt(d0 / D) sqrt(mean_d0(x^2) + eps), so the widened model takes
norm_eps * d0 / D and every norm weight w * sqrt(d0 / D) (exact: the eps term matters where the
activations are small, as after the embeddings). Gradients reach the new coordinates through the
random reads, so training uses the width from the first step.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import torch

from ..models.llamagen import LlamaGen


@torch.no_grad()
def widen(model: LlamaGen, dim: int, n_head: int, seed: int = 0) -> LlamaGen:
    """The same function in a model of width ``dim`` with ``n_head`` heads of the old head size."""
    cfg = model.config
    head = cfg.head_dim
    if type(model) is not LlamaGen:
        raise ValueError(f"widen: only class-conditional LlamaGen models, got {type(model).__name__}")
    if cfg.n_kv_head != cfg.n_head:
        raise ValueError(f"widen: needs n_kv_head == n_head, got {cfg.n_kv_head}/{cfg.n_head}")
    if dim != n_head * head or n_head <= cfg.n_head:
        raise ValueError(f"widen: dim must be n_head x {head} (the old head size) with n_head > {cfg.n_head}, "
                         f"got dim {dim}, n_head {n_head}")
    wide = replace(cfg, dim=dim, n_head=n_head, n_kv_head=n_head, norm_eps=cfg.norm_eps * cfg.dim / dim)
    with torch.random.fork_rng(devices=[]):  # the new random reads, without moving the caller's generator
        torch.manual_seed(seed)
        new = LlamaGen(wide).to(model.output.weight.dtype)
    old_sd, sd = model.state_dict(), new.state_dict()
    d0, h0 = cfg.dim, cfg.n_head * head
    scale = math.sqrt(d0 / dim)

    for key, w in sd.items():
        o = old_sd[key]
        if key.endswith("norm.weight"):
            w[:d0] = o * scale
            w[d0:] = o.mean() * scale
        elif key.endswith(("embedding_table.weight", "tok_embeddings.weight")):
            w[:, :d0], w[:, d0:] = o, 0.0
        elif key == "output.weight" or key.endswith(("w1.weight", "w3.weight")):
            w[:o.shape[0], :d0] = o
        elif key.endswith("wqkv.weight"):
            for part in range(3):  # q, k, v blocks of n_head * head rows each; the old heads come first
                w[part * dim:part * dim + h0, :d0] = o[part * h0:(part + 1) * h0]
        elif key.endswith(("wo.weight", "w2.weight")):
            w.zero_()
            w[:d0, :o.shape[1]] = o
        else:
            raise ValueError(f"widen: no rule for weight {key}")
    new.load_state_dict(sd)
    return new.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.train.grow", description=__doc__.split("\n")[0])
    p.add_argument("--src", required=True, help="LlamaGen directory to widen")
    p.add_argument("--out", required=True, help="directory for the widened model")
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--n-head", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="seed of the new weights' random reads")
    args = p.parse_args(argv)
    try:
        old = LlamaGen.from_pretrained(args.src).float()
        new = widen(old, args.dim, args.n_head, args.seed)
    except ValueError as exc:
        p.error(str(exc))
    new.save_pretrained(args.out)
    n = lambda m: sum(t.numel() for t in m.parameters())  # noqa: E731
    print(f"widened {args.src} ({n(old) / 1e6:.2f}M, {old.config.dim} wide) -> {args.out} "
          f"({n(new) / 1e6:.2f}M, {args.dim} wide, {args.n_head} heads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
