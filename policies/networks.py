"""Pure-torch networks of the learned schedulers (no RLlib here; ``policies.rl_modules`` wraps them).

* :class:`CrossAttentionPointerNet` — SCALE's policy (paper §4.2, docs/training.md): the task embedding
  queries the server embeddings through ``layers`` blocks of multi-head cross-attention (padded
  or masked servers never attend), each followed by a GELU feed-forward sublayer, both with a
  residual and layer norm. The resulting attention feature ``z`` feeds the actor (pointer scores
  ``(Wq z)·(Wk e_i) / sqrt(d)``) and the critic (an MLP on ``z`` only). Nothing depends on the
  number of servers N and there is no positional encoding, so the same weights run at any N and
  permuting the servers permutes the scores.
* :class:`StructuredMLPNet` — the paper's PPO baseline: task and server features embedded
  separately, concatenated, then an MLP to N scores (fixed N).

Both take ``task`` (B, 5), ``servers`` (B, N, 5) and ``action_mask`` (B, N) (1 = valid) and return
a :class:`NetOutput`. Masked scores are ``MASKED_SCORE`` (a large finite negative number, so a row
whose servers are all masked — a terminal observation — still gives finite, uniform logits).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from envs.config import ConfigError, build, rng
from envs.encoding import SERVER_DIM, TASK_DIM

# Logit of a masked server. Finite (cf. RLlib's FLOAT_MIN) so softmax/log_softmax of an
# all-masked row stays finite; exp(MASKED_SCORE - max) underflows to exactly 0 next to a valid one.
MASKED_SCORE = -3.0e38
ATTN_MASKED = -1.0e9  # attention logit of a padded/masked key (finite: all-masked rows -> uniform)


class NetOutput(NamedTuple):
    """Forward result: masked scores (B, N), value (B,), attention feature z (B, d)."""
    scores: torch.Tensor
    value: torch.Tensor
    z: torch.Tensor


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of both networks (docs/training.md defaults)."""
    d_model: int = field(default=16, metadata=rng(ge=1, le=4096, doc="embedding/feature width d"))
    heads: int = field(default=4, metadata=rng(ge=1, le=64, doc="attention heads (divide d_model)"))
    layers: int = field(default=2, metadata=rng(ge=1, le=32, doc="cross-attention blocks L"))
    ffn_hidden: int = field(default=64, metadata=rng(ge=1, le=16384, doc="GELU FFN width"))
    embed_hidden: int = field(default=64, metadata=rng(
        ge=1, le=16384, doc="hidden width of the 2-layer ReLU task/server embedding MLPs"))
    critic_hidden: int = field(default=64, metadata=rng(ge=1, le=16384, doc="critic MLP width"))
    critic_layers: int = field(default=3, metadata=rng(ge=1, le=16, doc="critic MLP depth (linear layers)"))
    mlp_hidden: int = field(default=256, metadata=rng(
        ge=1, le=16384, doc="structured MLP: width of the trunk after concatenation"))
    n_servers: int | None = field(default=None, metadata=rng(
        ge=1, le=100_000, doc="structured MLP: its fixed N (set from the env)"))
    task_features: int = field(default=TASK_DIM, metadata=rng(
        ge=1, le=64, doc="width of the task feature vector (set from the env: 5, or 7 with "
                         "features.backlog)"))
    server_features: int = field(default=SERVER_DIM, metadata=rng(
        ge=1, le=64, doc="width of a server's feature vector (set from the env: 5 for the "
                         "paper encoder, envs.encoding.NODE_DIM for the nodes encoder)"))

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ConfigError(f"model.heads: {self.heads} must divide model.d_model ({self.d_model})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_config(data: Mapping[str, Any] | ModelConfig | None, path: str = "model") -> ModelConfig:
    """Validated :class:`ModelConfig` from a mapping (unknown keys and bad ranges are errors)."""
    if isinstance(data, ModelConfig):
        return data
    return build(ModelConfig, dict(data or {}), path)


def mlp(sizes: list[int], act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers of ``sizes`` with ``act`` between them (none after the last)."""
    mods: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        mods.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            mods.append(act())
    return nn.Sequential(*mods)


def _critic(cfg: ModelConfig, d_in: int) -> nn.Sequential:
    return mlp([d_in] + [cfg.critic_hidden] * (cfg.critic_layers - 1) + [1])


class CrossAttentionBlock(nn.Module):
    """Query-side cross-attention (task -> servers) + GELU FFN, each residual + post-layer-norm.

    Written out instead of ``nn.MultiheadAttention``: with a single query per row this is a few
    small matmuls, cheaper per call, and it lets masked keys use a finite logit (no NaN rows).
    """

    def __init__(self, d: int, heads: int, ffn_hidden: int):
        super().__init__()
        self.heads, self.d_head = heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, ffn_hidden), nn.GELU(), nn.Linear(ffn_hidden, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, query: torch.Tensor, servers: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """query (B, d), servers (B, N, d), key_bias (B, 1, N) with 0 or ATTN_MASKED -> (B, d)."""
        b, n, d = servers.shape
        h, dh = self.heads, self.d_head
        q = self.q(query).view(b, h, 1, dh)
        k, v = self.kv(servers).view(b, n, 2, h, dh).permute(2, 0, 3, 1, 4)  # each (B, h, N, dh)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh)) + key_bias[:, None]  # (B, h, 1, N)
        ctx = (att.softmax(-1) @ v).reshape(b, d)
        x = self.norm1(query + self.out(ctx))
        return self.norm2(x + self.ffn(x))


def _valid(action_mask: torch.Tensor) -> torch.Tensor:
    return action_mask > 0.5


class CrossAttentionPointerNet(nn.Module):
    """SCALE's cross-attention pointer network (see the module docstring)."""

    kind = "crossattn"

    def __init__(self, cfg: ModelConfig | Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg = model_config(cfg)
        d = cfg.d_model
        self.task_mlp = mlp([cfg.task_features, cfg.embed_hidden, d])
        self.server_mlp = mlp([cfg.server_features, cfg.embed_hidden, d])
        self.blocks = nn.ModuleList(CrossAttentionBlock(d, cfg.heads, cfg.ffn_hidden)
                                    for _ in range(cfg.layers))
        self.w_q = nn.Linear(d, d, bias=False)
        self.w_k = nn.Linear(d, d, bias=False)
        self.critic = _critic(cfg, d)
        self.attn_scale = 1.0 / math.sqrt(d)

    def encode(self, task: torch.Tensor, servers: torch.Tensor, action_mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(z (B, d), server embeddings e (B, N, d), valid (B, N) bool)."""
        valid = _valid(action_mask)
        e = self.server_mlp(servers)
        # A row with no valid server (terminal observation) attends to all keys instead: its
        # output is finite and irrelevant (its scores are all masked).
        any_valid = valid.any(-1, keepdim=True)
        attend = valid | ~any_valid
        key_bias = torch.zeros_like(action_mask, dtype=e.dtype).masked_fill(~attend, ATTN_MASKED)
        key_bias = key_bias[:, None, :]
        z = self.task_mlp(task)
        for block in self.blocks:
            z = block(z, e, key_bias)
        return z, e, valid

    def pointer_scores(self, z: torch.Tensor, e: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Masked pointer logits (Wq z)·(Wk e_i)/sqrt(d), (B, N)."""
        s = (self.w_k(e) @ self.w_q(z).unsqueeze(-1)).squeeze(-1) * self.attn_scale
        return s.masked_fill(~valid, MASKED_SCORE)

    def value(self, z: torch.Tensor) -> torch.Tensor:
        return self.critic(z).squeeze(-1)

    def forward(self, task: torch.Tensor, servers: torch.Tensor, action_mask: torch.Tensor) -> NetOutput:
        z, e, valid = self.encode(task, servers, action_mask)
        return NetOutput(self.pointer_scores(z, e, valid), self.value(z), z)

    def scores(self, task: torch.Tensor, servers: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        """Masked scores only (inference; skips the critic)."""
        z, e, valid = self.encode(task, servers, action_mask)
        return self.pointer_scores(z, e, valid)


class StructuredMLPNet(nn.Module):
    """The paper's structured-MLP baseline: embed task and each server (shared server MLP),
    concatenate [task, server_1, ..., server_N], MLP trunk -> z (d), then N logits and a value.
    Fixed N (``cfg.n_servers``); z is the trunk output, the feature SRR regularises."""

    kind = "mlp"

    def __init__(self, cfg: ModelConfig | Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = cfg = model_config(cfg)
        if cfg.n_servers is None:
            raise ValueError("model.n_servers: the structured MLP needs its fixed number of servers")
        d, n = cfg.d_model, cfg.n_servers
        self.n_servers = n
        self.task_mlp = mlp([cfg.task_features, cfg.embed_hidden, d])
        self.server_mlp = mlp([cfg.server_features, cfg.embed_hidden, d])
        self.trunk = nn.Sequential(nn.Linear(d * (n + 1), cfg.mlp_hidden), nn.ReLU(),
                                   nn.Linear(cfg.mlp_hidden, d), nn.ReLU())
        self.actor = nn.Linear(d, n)
        self.critic = _critic(cfg, d)

    def _check(self, servers: torch.Tensor) -> None:
        if servers.shape[-2] != self.n_servers:
            raise ValueError(f"servers: the structured MLP was built for N={self.n_servers} "
                             f"servers, got N={servers.shape[-2]} (use the cross-attention module "
                             f"for other sizes)")

    def encode(self, task: torch.Tensor, servers: torch.Tensor) -> torch.Tensor:
        self._check(servers)
        b = task.shape[0]
        x = torch.cat([self.task_mlp(task), self.server_mlp(servers).reshape(b, -1)], dim=-1)
        return self.trunk(x)

    def forward(self, task: torch.Tensor, servers: torch.Tensor, action_mask: torch.Tensor) -> NetOutput:
        z = self.encode(task, servers)
        s = self.actor(z).masked_fill(~_valid(action_mask), MASKED_SCORE)
        return NetOutput(s, self.critic(z).squeeze(-1), z)

    def value(self, z: torch.Tensor) -> torch.Tensor:
        return self.critic(z).squeeze(-1)

    def scores(self, task: torch.Tensor, servers: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        z = self.encode(task, servers)
        return self.actor(z).masked_fill(~_valid(action_mask), MASKED_SCORE)


NETWORKS: dict[str, type[nn.Module]] = {
    CrossAttentionPointerNet.kind: CrossAttentionPointerNet,
    StructuredMLPNet.kind: StructuredMLPNet,
}


def build_network(kind: str, cfg: ModelConfig | Mapping[str, Any] | None = None) -> nn.Module:
    """Network ``kind`` ("crossattn" | "mlp") from a model config."""
    if kind not in NETWORKS:
        raise ValueError(f"module: unknown network {kind!r}; choose one of {sorted(NETWORKS)}")
    return NETWORKS[kind](cfg)
