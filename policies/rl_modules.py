"""RLlib (new API stack) modules wrapping the pure-torch networks of ``policies.networks``.

* :class:`PointerPPOModule` — PPO / PPO+SRR: masked pointer logits as action-distribution inputs,
  the critic on ``z``, and ``z`` returned from ``_forward_train`` under ``Columns.EMBEDDINGS`` (the
  SRR learner regularises it; the value function reuses it).
* :class:`PointerDQNModule` — dueling DQN: ``Q = V(z) + A_i − mean_valid(A)`` with the pointer
  scores as advantages; masked actions are ``-inf`` (RLlib's DQN draws ε-random actions only where
  ``nan_to_num(Q, neginf=0) != 0`` and ``nan_to_num``s the gathered Q).
* :class:`PointerSACModule` — discrete SAC: a pointer actor and two pointer Q-networks; masked
  actions get probability 0 and log-probability 0 (``log_softmax``, never ``softmax().log()``,
  which gives 0·(−inf) = NaN).

Every module's ``model_config`` is a plain dict: ``{"network": "crossattn" | "mlp", **ModelConfig}``
(``n_servers`` is filled from the observation space for the fixed-N MLP). :func:`export_network`
returns the actor network whose ``state_dict`` a policy artifact stores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

import torch
from torch import nn

from ray.rllib.algorithms.dqn.default_dqn_rl_module import QF_PREDS
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.sac.sac_learner import (ACTION_LOG_PROBS, ACTION_LOG_PROBS_NEXT,
                                                  ACTION_PROBS, ACTION_PROBS_NEXT, QF_TARGET_NEXT,
                                                  QF_TWIN_PREDS)
from ray.rllib.algorithms.sac.sac_learner import QF_PREDS as SAC_QF_PREDS
from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.schedules.scheduler import Scheduler

from .networks import ModelConfig, build_network

_MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
Z_KEY = Columns.EMBEDDINGS  # the attention feature z in _forward_train's output


def _net_from_config(module: RLModule) -> nn.Module:
    raw = dict(module.model_config or {})
    kind = raw.get("network", "crossattn")
    # RLlib merges its own defaults (vf_share_layers, epsilon, ...) into model_config: keep ours.
    mc = {k: v for k, v in raw.items() if k in _MODEL_KEYS}
    if kind == "mlp" and mc.get("n_servers") is None:
        mc["n_servers"] = int(module.observation_space["servers"].shape[0])
    if mc.get("task_features") is None:
        mc["task_features"] = int(module.observation_space["task"].shape[0])
    if mc.get("server_features") is None:
        mc["server_features"] = int(module.observation_space["servers"].shape[-1])
    return build_network(kind, mc)


def _obs(batch: Dict[str, Any], key: str = Columns.OBS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    o = batch[key]
    return o["task"], o["servers"], o["action_mask"]


def _valid_or_all(mask: torch.Tensor) -> torch.Tensor:
    """Valid actions; a row with none (a terminal observation, which RLlib's env runner still
    runs through the module and whose action is discarded) counts every action as valid, so no
    sampler sees an all-zero distribution and no loss term becomes NaN."""
    valid = mask > 0.5
    return valid | ~valid.any(-1, keepdim=True)


class PointerPPOModule(TorchRLModule, ValueFunctionAPI):
    """PPO module over a pointer network (cross-attention or structured MLP)."""

    @override(TorchRLModule)
    def setup(self):
        self.net = _net_from_config(self)
        mode_dependent = (nn.Dropout, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
        assert not any(isinstance(m, mode_dependent) for m in self.net.modules()), \
            "PointerPPOModule.train() assumes no mode-dependent layers"

    def train(self, mode: bool = True):
        # RLlib switches eval/train around every exploration forward pass; the recursive walk over
        # ~40 submodules cost ~13% of sampling time. The networks have no mode-dependent layer
        # (no dropout or batch norm; checked in setup), so only the flag is set.
        self.training = mode
        return self

    @override(TorchRLModule)
    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        # inference/exploration: scores only (the critic is not needed to act)
        return {Columns.ACTION_DIST_INPUTS: self.net.scores(*_obs(batch))}

    @override(TorchRLModule)
    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        out = self.net(*_obs(batch))
        return {Columns.ACTION_DIST_INPUTS: out.scores, Z_KEY: out.z}

    @override(ValueFunctionAPI)
    def compute_values(self, batch: Dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            return self.net(*_obs(batch)).value
        return self.net.value(embeddings)


class PointerDQNModule(DefaultDQNTorchRLModule):
    """Dueling (double) DQN over the pointer network. ``encoder`` is the network; the heads are
    inside it, so ``af``/``vf`` are empty placeholders RLlib's target-network code copies."""

    @override(DefaultDQNTorchRLModule)
    def setup(self):
        mc = self.model_config
        self.uses_dueling = bool(mc.get("dueling", True))
        self.uses_double_q = bool(mc.get("double_q", True))
        self.num_atoms = 1
        self.epsilon_schedule = Scheduler(fixed_value_or_schedule=mc.get("epsilon", [[0, 1.0], [10000, 0.05]]),
                                          framework="torch")
        self.encoder = _net_from_config(self)
        self.af = nn.Identity()
        self.vf = nn.Identity()

    @override(DefaultDQNTorchRLModule)
    def get_initial_state(self) -> dict:
        return {}

    @override(DefaultDQNTorchRLModule)
    def _qf_forward_helper(self, batch, encoder, head) -> Dict[str, Any]:
        task, servers, mask = _obs(batch)
        net = encoder
        valid = _valid_or_all(mask)
        if net.kind == "crossattn":
            z, e, _ = net.encode(task, servers, mask)
            adv = (net.w_k(e) @ net.w_q(z).unsqueeze(-1)).squeeze(-1) * net.attn_scale
        else:
            z = net.encode(task, servers)
            adv = net.actor(z)
        n_valid = valid.sum(-1, keepdim=True).clamp_min(1)
        adv_mean = (adv * valid).sum(-1, keepdim=True) / n_valid
        q = net.value(z).unsqueeze(-1) + adv - adv_mean if self.uses_dueling else adv
        return {QF_PREDS: q.masked_fill(~valid, float("-inf"))}


class PointerSACModule(DefaultSACTorchRLModule):
    """Discrete SAC: pointer actor ``pi_encoder`` and pointer Q-networks (Q_i = V(z) + score_i)."""

    @override(DefaultSACTorchRLModule)
    def setup(self):
        self.twin_q = bool(self.model_config.get("twin_q", True))
        self.pi_encoder = _net_from_config(self)
        self.pi = nn.Identity()
        if not self.inference_only:
            self.qf_encoder = _net_from_config(self)
            self.qf = nn.Identity()
            if self.twin_q:
                self.qf_twin_encoder = _net_from_config(self)
                self.qf_twin = nn.Identity()

    def _logits(self, batch: Dict[str, Any]) -> torch.Tensor:
        return self.pi_encoder.scores(*_obs(batch))

    @override(DefaultSACTorchRLModule)
    def _forward_inference(self, batch: Dict, **kwargs) -> Dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self._logits(batch)}

    @override(DefaultSACTorchRLModule)
    def _forward_exploration(self, batch: Dict, **kwargs) -> Dict[str, Any]:
        return self._forward_inference(batch)

    @staticmethod
    def _probs(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        valid = _valid_or_all(mask)
        logp = torch.log_softmax(logits, dim=-1).masked_fill(~valid, 0.0)
        return logp.exp() * valid, logp

    @override(DefaultSACTorchRLModule)
    def _forward_train_discrete(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        cur = {Columns.OBS: batch[Columns.OBS]}
        nxt = {Columns.OBS: batch[Columns.NEXT_OBS]}
        out: Dict[str, Any] = {}
        out[ACTION_PROBS_NEXT], out[ACTION_LOG_PROBS_NEXT] = self._probs(
            self._logits(nxt), batch[Columns.NEXT_OBS]["action_mask"])
        out[QF_TARGET_NEXT] = self.forward_target(nxt, squeeze=False)
        out[SAC_QF_PREDS] = self._qf_forward_train_helper(cur, self.qf_encoder, self.qf, squeeze=False)
        if self.twin_q:
            out[QF_TWIN_PREDS] = self._qf_forward_train_helper(cur, self.qf_twin_encoder,
                                                               self.qf_twin, squeeze=False)
        out[ACTION_PROBS], out[ACTION_LOG_PROBS] = self._probs(
            self._logits(cur), batch[Columns.OBS]["action_mask"])
        return out

    @override(DefaultSACTorchRLModule)
    def _qf_forward_train_helper(self, batch, encoder, head, squeeze: bool = True):
        task, servers, mask = _obs(batch)
        out = encoder(task, servers, mask)
        valid = mask > 0.5
        # Masked entries stay finite (they are weighted by probability 0 in every SAC term).
        q = out.value.unsqueeze(-1) + torch.where(valid, out.scores, torch.zeros_like(out.scores))
        return q.squeeze(-1) if squeeze and q.shape[-1] == 1 else q


MODULES: dict[str, type[RLModule]] = {"ppo": PointerPPOModule, "dqn": PointerDQNModule,
                                      "sac": PointerSACModule}


def export_network(module: RLModule) -> nn.Module:
    """The network holding the policy's weights (for ``policies.artifact.save_policy``)."""
    if isinstance(module, PointerPPOModule):
        return module.net
    if isinstance(module, PointerDQNModule):
        return module.encoder
    if isinstance(module, PointerSACModule):
        return module.pi_encoder
    raise TypeError(f"cannot export {type(module).__name__}: not a policies.rl_modules module")
