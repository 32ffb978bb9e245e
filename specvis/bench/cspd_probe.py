"""Where CSpD's acceptance goes: per-step log density ratios of a draft/target pair on real prefixes.

For held-out token grids, both models see the same true prefix (teacher-forced) at a few positions;
the draft samples its next token's denoising run; then, per row:
- ``trajectory``: log p(x_{k-1} | x_k) - log q(x_{k-1} | x_k) along the draft's run, step by step
  (their sum is the exact ratio of ``CSpD(ratio="trajectory")``);
- ``paper``: with the target's run aligned to the draft's noise (CSpD Eq. 3), log Sigma (Eq. 4) and the
  last-step term log p(x_0 | x_1^p) - log q(x_0 | x_1^q) of Eq. 5, the last step's standard deviation
  and the gap |x_1^p - x_1^q| between the aligned runs just before it;
- the acceptance probability E[min(1, ratio)] of one draft token under each ratio.

    python -m specvis.bench.cspd_probe --model emoji-continuous --out docs/results/data/emoji-cspd-probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from ..diffusion import transition_log_density
from ..outputs import write_text


def _median(t: torch.Tensor) -> float:
    return round(float(t.median()), 4)


@torch.no_grad()
def probe(target, draft, tokens: torch.Tensor, labels: torch.Tensor, positions: list[int], cfg_scale: float,
          temperature: float, seed: int = 0) -> dict:
    """Statistics of one draft token per row at each position in ``positions`` (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    null = torch.full_like(labels, target.null_condition)
    out = {}
    for pos in positions:
        prefix = tokens[:, :pos]
        zp, zq = target.features(labels, prefix)[:, -1], draft.features(labels, prefix)[:, -1]
        zpu = target.features(null, prefix)[:, -1] if cfg_scale != 1 else None
        zqu = draft.features(null, prefix)[:, -1] if cfg_scale != 1 else None
        q = draft.head.sample_trajectory(zq, zqu, cfg_scale, temperature, g)
        means, logvars = target.head.evaluate(q.states, zp, zpu, cfg_scale)
        per_step = transition_log_density(q.states[:, 1:], means, logvars, temperature) - q.step_log_densities(temperature)
        traj = per_step.sum(1)
        p = target.head.sample_trajectory(zp, zpu, cfg_scale, temperature, g, x_T=q.states[:, 0], noise=q.noise)
        dens_p, dens_q = p.step_log_densities(temperature), q.step_log_densities(temperature)
        log_sigma = (dens_p[:, :-1] - dens_q[:, :-1]).sum(1)
        last = transition_log_density(q.x0, p.means[:, -1], p.logvars[:, -1], temperature) - dens_q[:, -1]
        out[str(pos)] = {
            "trajectory_step_log_ratio_mean": [round(float(v), 3) for v in per_step.mean(0)],
            "trajectory_log_ratio_median": _median(traj),
            "trajectory_acceptance": round(float(traj.clamp(max=0).exp().mean()), 4),
            "paper_log_sigma_median": _median(log_sigma),
            "paper_last_step_log_ratio_median": _median(last),
            "paper_acceptance": round(float((log_sigma + last).clamp(max=0).exp().mean()), 4),
            "coupled_acceptance": round(float(last.clamp(max=0).exp().mean()), 4),
            "last_step_std": round(float((0.5 * p.logvars[:, -1]).exp().mean() * temperature), 5),
            "aligned_gap_before_last_step": round(float((p.states[:, -2] - q.states[:, -2]).abs().mean()), 4),
            "aligned_gap_x0": round(float((p.x0 - q.x0).abs().mean()), 4),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specvis.bench.cspd_probe", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="emoji-continuous")
    p.add_argument("--latents", default="data/emoji_latents.npz", help="token file with eval_latents/eval_labels")
    p.add_argument("--rows", type=int, default=64, help="held-out grids to probe")
    p.add_argument("--positions", default="13,64,128,192", help="token positions (comma-separated)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--cfg-scale", type=float, default=None)
    p.add_argument("--out", help="JSON report")
    a = p.parse_args(argv)
    try:
        from ..zoo import load

        pipe = load(a.model)
        if pipe.draft is None:
            raise ValueError(f"model {a.model} has no draft")
        try:
            with np.load(a.latents) as z:
                tokens = torch.from_numpy(z["eval_latents"][: a.rows].astype(np.float32))
                labels = torch.from_numpy(z["eval_labels"][: a.rows].astype(np.int64))
        except (OSError, KeyError) as e:
            raise ValueError(f"--latents {a.latents}: {e}") from None
        positions = [int(x) for x in a.positions.split(",")]
        L = tokens.shape[1]
        if not all(1 <= x < L for x in positions):
            raise ValueError(f"--positions must lie in 1..{L - 1}, got {positions}")
        s = pipe.default_sampling
        cfg = s.cfg_scale if a.cfg_scale is None else a.cfg_scale
        tau = s.temperature if a.temperature is None else a.temperature
        if tau <= 0:
            raise ValueError("--temperature must be > 0 (densities of a greedy run are not defined)")
        report = {"model": a.model, "rows": len(tokens), "cfg_scale": cfg, "temperature": tau,
                  "sampling_steps": pipe.target.head.num_steps,
                  "positions": probe(pipe.target, pipe.draft, tokens, labels, positions, cfg, tau)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=1) + "\n"
    if a.out:
        write_text(a.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
