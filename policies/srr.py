"""Structured Representation Regularization (SRR, paper §4.3, docs/training.md) — pure torch.

On a mini-batch of attention features ``z`` (B × d): centre ``Z̄ = z − μ``, covariance
``C = Z̄ᵀZ̄ / (B−1)``;

* decorrelation ``L_dec = Σ_{i≠j} C_ij² / d``
* KL to N(0, 1) per dimension ``L_KL = (1/d) Σ_k ½(μ_k² + σ_k² − 1 − log σ_k²)`` with ``σ_k² = C_kk``

The learner adds ``ramp(it) · (λ1 L_dec + λ2 L_KL)`` to the PPO loss, the ramp going linearly from
0 at iteration ``ramp_start`` to 1 at ``ramp_end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from envs.config import ConfigError, rng

# Floor of σ² inside the log: a collapsed dimension gives a large, finite penalty, not inf.
VAR_EPS = 1e-8


@dataclass(frozen=True)
class SrrConfig:
    """SRR coefficients and warm-up ramp (paper defaults)."""
    enabled: bool = field(default=True, metadata=rng(
        doc="add SRR's regularisers (SCALE); false: none"))
    lambda_dec: float = field(default=0.01, metadata=rng(ge=0, doc="λ1, decorrelation weight"))
    lambda_kl: float = field(default=0.001, metadata=rng(ge=0, doc="λ2, KL weight"))
    ramp_start: int = field(default=10, metadata=rng(ge=0, doc="iteration where the ramp leaves 0"))
    ramp_end: int = field(default=60, metadata=rng(ge=0, doc="iteration where the ramp reaches 1"))

    def __post_init__(self) -> None:
        if self.ramp_end < self.ramp_start:
            raise ConfigError(f"srr.ramp_end ({self.ramp_end}) must be >= srr.ramp_start "
                              f"({self.ramp_start})")

    def ramp(self, iteration: int) -> float:
        """Ramp factor at training ``iteration`` (0-based count of completed updates)."""
        return ramp(iteration, self.ramp_start, self.ramp_end)


def ramp(iteration: float, start: float, end: float) -> float:
    """0 before ``start``, 1 from ``end`` on, linear between (a step at ``start`` if equal)."""
    if iteration < start:
        return 0.0
    if iteration >= end:
        return 1.0
    return float(iteration - start) / float(end - start)


def covariance(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ (d,), C (d, d)) of a batch z (B, d), unbiased (B−1)."""
    if z.dim() != 2 or z.shape[0] < 2:
        raise ValueError(f"z: expected a (B, d) batch with B >= 2, got shape {tuple(z.shape)}")
    mu = z.mean(0)
    zc = z - mu
    return mu, zc.T @ zc / (z.shape[0] - 1)


def srr_losses(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(decorrelation, kl) of a batch of features z (B, d); differentiable scalars."""
    z = z.float()
    d = z.shape[-1]
    mu, c = covariance(z)
    var = torch.diagonal(c)
    off = c - torch.diag_embed(var)
    decorrelation = (off ** 2).sum() / d
    kl = 0.5 * (mu ** 2 + var - 1.0 - torch.log(var.clamp_min(VAR_EPS))).sum() / d
    return decorrelation, kl


@torch.no_grad()
def feature_stats(z: torch.Tensor) -> dict[str, float]:
    """Diagnostics of z: mean |off-diagonal covariance| and mean per-dimension KL to N(0, 1)
    (paper Table 5), plus the SRR terms themselves."""
    z = z.float()
    d = z.shape[-1]
    _, c = covariance(z)
    off = c - torch.diag_embed(torch.diagonal(c))
    dec, kl = srr_losses(z)
    n_off = d * (d - 1)
    return {"mean_abs_offdiag_cov": float(off.abs().sum() / n_off) if n_off else 0.0,
            "mean_kl": float(kl), "decorrelation": float(dec),
            "mean_var": float(torch.diagonal(c).mean()), "mean_abs_mu": float(z.mean(0).abs().mean())}
