"""PPO learner with Structured Representation Regularization (paper §4.3, docs/training.md).

Adds ``ramp(it) · (λ1 · L_dec(z) + λ2 · L_KL(z))`` to RLlib's PPO loss, where ``z`` is the attention
feature the module returns from ``_forward_train`` (``Columns.EMBEDDINGS``) on the loss-masked rows
of each minibatch, and ``it`` counts completed training iterations (one per ``update()`` call). The
counter is part of the learner state, so a restored run continues the ramp where it stopped.

Coefficients come from ``learner_config_dict["srr"]`` (the fields of :class:`policies.srr.SrrConfig`).
Logged every iteration under ``result["learners"][module_id]``: the SRR terms, the ramp, and the
feature statistics (mean |off-diagonal covariance|, mean KL).
"""

from __future__ import annotations

from typing import Any

import torch

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override

from envs.config import build

from .srr import SrrConfig, srr_losses

# Metric keys (result["learners"][module_id][KEY]).
SRR_DEC = "srr/decorrelation"
SRR_KL = "srr/kl"
SRR_RAMP = "srr/ramp"
SRR_LOSS = "srr/weighted_loss"
Z_OFFDIAG = "features/mean_abs_offdiag_cov"
Z_KL = "features/mean_kl"
ITERATION = "srr/iteration"
_STATE_KEY = "srr_iteration"


class SrrPPOLearner(PPOTorchLearner):
    """PPOTorchLearner + SRR on z (only its own terms; the PPO loss is RLlib's)."""

    @override(PPOTorchLearner)
    def build(self) -> None:
        super().build()
        self.srr = build(SrrConfig, dict(self.config.learner_config_dict.get("srr") or {}), "srr")
        self.srr_iteration = 0  # completed updates; the ramp reads it

    @override(PPOTorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self.srr_iteration += 1

    @override(PPOTorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        total = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch,
                                                fwd_out=fwd_out)
        z = fwd_out.get(Columns.EMBEDDINGS)
        if z is None:
            return total
        if Columns.LOSS_MASK in batch:
            z = z[batch[Columns.LOSS_MASK]]
        if z.shape[0] < 2:
            return total
        dec, kl = srr_losses(z)
        ramp = self.srr.ramp(self.srr_iteration) if self.srr.enabled else 0.0
        weighted = ramp * (self.srr.lambda_dec * dec + self.srr.lambda_kl * kl)
        with torch.no_grad():
            zc = z - z.mean(0)
            c = zc.T @ zc / (z.shape[0] - 1)
            d = c.shape[0]
            offdiag = (c - torch.diag_embed(torch.diagonal(c))).abs().sum() / max(d * (d - 1), 1)
        self.metrics.log_dict({SRR_DEC: dec.detach(), SRR_KL: kl.detach(),
                               SRR_LOSS: weighted.detach(),
                               Z_OFFDIAG: offdiag, Z_KL: kl.detach()},
                              key=module_id, window=1)
        self.metrics.log_value((module_id, SRR_RAMP), ramp, window=1)
        self.metrics.log_value((module_id, ITERATION), self.srr_iteration, window=1)
        return total + weighted if ramp > 0 else total

    @override(PPOTorchLearner)
    def get_state(self, *args, **kwargs):
        state = super().get_state(*args, **kwargs)
        state[_STATE_KEY] = self.srr_iteration
        return state

    @override(PPOTorchLearner)
    def set_state(self, state) -> None:
        super().set_state(state)
        if _STATE_KEY in state:
            self.srr_iteration = int(state[_STATE_KEY])
