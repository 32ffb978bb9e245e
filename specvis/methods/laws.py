"""The law of each position, as the guided views return it: one object per kind of token.

``DiscreteLaw``: the sampling law of docs/design/api.md over image codes and structural ids (probabilities), with
the temperature-1 law of the same positions for greedy rules that relax on it (LANTERN).
``ContinuousLaw``: a diffusion head's sampler conditioned on the transformer's z (and z_uncond for
CFG, applied on epsilon): a token is the end x_0 of a reverse run x_K .. x_0, whose density is
N(x_K; 0, I) prod_k N(x_{k-1}; mu(x_k), sigma_k^2 tau^2) (CSpD Eq. 1/12). What continuous speculative
decoding needs of it is here, shared by CSpD on causal models (``cspd.py``) and on MAR
(``cspd_mar.py``): ``sample`` / ``run``, the log acceptance ratios (``trajectory_log_ratio``, exact;
``paper_log_ratio``, Eq. 5, with Sigma := 1 the exact "coupled" ratio) and the residual samplers
(``paper_residual``, Eq. 11; ``trajectory_residual``). Either law samples with ``law.sample(generator)``:
AR draws from a target's law without knowing which kind it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..diffusion import ResidualDraw, gaussian_log_density, residual_sample, transition_log_density
from ..models.continuous import Trajectory
from ..sampling import sample

GREEDY_ATOL = 1e-4  # temperature 0: a continuous draft equals the target's output within this (relative and absolute)


@dataclass(frozen=True)
class DiscreteLaw:
    """Probabilities (..., V) of each position, and the temperature-1 law of the same positions
    (greedy sampling with a rule that asks for it; else None)."""

    probs: torch.Tensor
    soft: torch.Tensor | None = None

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        return sample(self.probs, generator)

    def __getitem__(self, index) -> DiscreteLaw:
        return DiscreteLaw(self.probs[index], None if self.soft is None else self.soft[index])


@dataclass(frozen=True)
class GuidedHead:
    """A diffusion head (``DiffusionHead``, MAR's DiffLoss) at a CFG ``scale`` (a float, or one per row
    (N, 1)) and a temperature. ``random_start``: at temperature 0 the run still starts from a random
    x_K (MAR's convention: the temperature scales the step noise only); otherwise it starts at 0."""

    head: torch.nn.Module
    scale: float | torch.Tensor
    temperature: float
    random_start: bool = False

    def sample(self, z: torch.Tensor, z_uncond: torch.Tensor | None, generator: torch.Generator | None,
               x_T: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> Trajectory:
        if x_T is None and self.random_start and self.temperature == 0:
            x_T = torch.randn(z.shape[0], self.head.token_dim, device=z.device, generator=generator)
        return self.head.sample_trajectory(z, z_uncond, self.scale, self.temperature, generator, x_T, noise)

    def path_log_density(self, states: torch.Tensor, z: torch.Tensor, z_uncond: torch.Tensor | None) -> torch.Tensor:
        """log prod_k p(x_{k-1} | x_k) (N,) of given runs (N, K+1, C), all K steps in one head call
        (the path is known; the x_K factor excluded)."""
        N, K1, C = states.shape
        K = K1 - 1
        step = (K - 1 - torch.arange(K, device=states.device)).repeat(N)
        scale = self.scale.repeat_interleave(K, 0) if torch.is_tensor(self.scale) else self.scale
        zu = None if z_uncond is None else z_uncond.repeat_interleave(K, 0)
        mean, logvar = self.head.predict(states[:, :K].reshape(N * K, C), step, z.repeat_interleave(K, 0), zu, scale)
        return transition_log_density(states[:, 1:], mean.reshape(N, K, C), logvar.reshape(N, K, C),
                                      self.temperature).sum(-1)


@dataclass(frozen=True)
class ContinuousLaw:
    """The law of continuous tokens at some positions: z (..., D) (and z_uncond) through ``head``."""

    z: torch.Tensor
    z_uncond: torch.Tensor | None
    head: GuidedHead

    @property
    def temperature(self) -> float:
        return self.head.temperature

    def __getitem__(self, index) -> ContinuousLaw:
        return ContinuousLaw(self.z[index], None if self.z_uncond is None else self.z_uncond[index], self.head)

    def flat(self) -> ContinuousLaw:
        """Positions (B, n, D) as rows (B * n, D), sample-major."""
        D = self.z.shape[-1]
        return ContinuousLaw(self.z.reshape(-1, D), None if self.z_uncond is None else self.z_uncond.reshape(-1, D),
                             self.head)

    def run(self, generator: torch.Generator | None, x_T: torch.Tensor | None = None,
            noise: torch.Tensor | None = None) -> Trajectory:
        """One reverse run per row (z of shape (N, D)); ``x_T``/``noise`` given: aligned with them (Eq. 3)."""
        return self.head.sample(self.z, self.z_uncond, generator, x_T, noise)

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        """Tokens x_0 (N, C)."""
        return self.run(generator).x0

    def path_log_density(self, states: torch.Tensor) -> torch.Tensor:
        return self.head.path_log_density(states, self.z, self.z_uncond)


def cat_runs(runs: list[Trajectory], B: int) -> Trajectory:
    """Runs of B * n_i rows (sample-major) -> one Trajectory of B * sum(n_i) rows, sample-major."""
    def cat(name: str) -> torch.Tensor:
        parts = [t.reshape(B, -1, *t.shape[1:]) for t in (getattr(r, name) for r in runs)]
        t = torch.cat(parts, 1)
        return t.reshape(-1, *t.shape[2:])
    return Trajectory(cat("states"), cat("means"), cat("logvars"), cat("noise"))


def trajectory_log_ratio(p: ContinuousLaw, q_runs: Trajectory) -> torch.Tensor:
    """log p_traj - log q_traj along the draft's runs (N,): an exact density ratio on trajectory space
    (x_K cancels, Eq. 1/12); ``p`` the target's law of the same N positions."""
    log_p = p.path_log_density(q_runs.states)
    log_q = q_runs.step_log_densities(p.temperature).sum(-1)
    return log_p - log_q


def paper_log_ratio(p: ContinuousLaw, q_runs: Trajectory, generator: torch.Generator | None, align: bool,
                    coupled: bool) -> tuple[torch.Tensor, dict]:
    """Eq. 5: log Sigma + log p(x_0 | x_1^p) - log q(x_0 | x_1^q) (N,), and what Eq. 11 needs (``aux``);
    ``coupled`` sets log Sigma = 0. ``align`` (Eq. 3): the target denoises the draft's x_K with the
    draft's noise at every step; otherwise it runs on its own noise."""
    tau = p.temperature
    p_runs = p.run(generator, x_T=q_runs.states[:, 0], noise=q_runs.noise) if align else p.run(generator)
    dens_p, dens_q = p_runs.step_log_densities(tau), q_runs.step_log_densities(tau)
    # Eq. 1 without the last step, each factor on its model's own path; aligned, the exponentials
    # cancel and this is log Sigma of Eq. 4.
    log_sigma = (dens_p[:, :-1] - dens_q[:, :-1]).sum(-1)
    if coupled:
        log_sigma = torch.zeros_like(log_sigma)
    elif not align:
        zero = torch.zeros_like(q_runs.states[:, 0])
        log_sigma = log_sigma + gaussian_log_density(p_runs.states[:, 0], zero, zero) \
            - gaussian_log_density(q_runs.states[:, 0], zero, zero)
    mean_p, logvar_p = p_runs.means[:, -1], p_runs.logvars[:, -1]
    log_p_last = transition_log_density(q_runs.x0, mean_p, logvar_p, tau)
    aux = {"log_sigma": log_sigma, "mean_p": mean_p, "logvar_p": logvar_p,
           "mean_q": q_runs.means[:, -1], "logvar_q": q_runs.logvars[:, -1]}
    return log_sigma + log_p_last - dens_q[:, -1], aux


def paper_residual(tau: float, at: dict, pending: torch.Tensor, max_tries: int,
                   gen: torch.Generator | None) -> ResidualDraw:
    """Eq. 11 per row: proposals x ~ p(. | x_1^p) (the target's last step, ``at["mean_p"]``,
    ``at["logvar_p"]``), accepted with max(0, 1 - q(x | x_1^q) / (Sigma p(x | x_1^p))); ``at`` holds
    (N, ...) rows of ``paper_log_ratio``'s aux. Rows with ``pending`` False keep their first proposal."""
    def propose() -> tuple[torch.Tensor, torch.Tensor]:
        x = at["mean_p"] + torch.exp(0.5 * at["logvar_p"]) * tau * torch.randn(
            at["mean_p"].shape, device=at["mean_p"].device, generator=gen)
        return x, at["log_sigma"] + transition_log_density(x, at["mean_p"], at["logvar_p"], tau)

    def log_q(x: torch.Tensor) -> torch.Tensor:
        return transition_log_density(x, at["mean_q"], at["logvar_q"], tau)

    return residual_sample(propose, log_q, pending, max_tries, gen)


def trajectory_residual(p: ContinuousLaw, q: ContinuousLaw, pending: torch.Tensor, max_tries: int,
                        gen: torch.Generator | None) -> ResidualDraw:
    """The residual on trajectory space per row: whole target runs accepted with max(0, 1 - q_traj /
    p_traj), the draft's law ``q`` scored along them; returns the runs' states (N, K+1, C)."""
    def propose() -> tuple[torch.Tensor, torch.Tensor]:
        run = p.run(gen)
        return run.states, run.step_log_densities(p.temperature).sum(-1)

    def log_q(states: torch.Tensor) -> torch.Tensor:
        return q.path_log_density(states)

    return residual_sample(propose, log_q, pending, max_tries, gen)


def matches(drafts: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Temperature 0: which continuous drafts (..., C) equal the target's own outputs (``GREEDY_ATOL``)."""
    return ((drafts - own).abs() <= GREEDY_ATOL * (1 + own.abs())).all(-1)
