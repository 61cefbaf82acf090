"""Statistics of the attention feature z of a trained policy on fixed-seed episodes (paper
Table 5): mean |off-diagonal covariance| and mean per-dimension KL to N(0, 1), at each cluster size.

The policy acts greedily; z is recorded at every decision (all decisions of ``episodes`` episodes,
the same seeds as ``scale-ray eval``), then the statistics are taken over that batch. Used by
`scale-ray features` and `scale-ray reproduce` (Table 5).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from envs.config import EnvConfig
from envs.simulator import Simulator
from policies import get_policy
from policies.srr import feature_stats
from scale_ray.evaluation import env_for_policy, episode_seed


def collect_z(policy, env: EnvConfig, episodes: int, seed: int) -> np.ndarray:
    """z (decisions × d) of a greedy policy over fixed-seed episodes."""
    net = policy.net
    env = env_for_policy(env, policy)
    zs: list[np.ndarray] = []
    for ep in range(episodes):
        sim = Simulator(env)
        sim.reset(episode_seed(seed, ep))
        while sim.current is not None:
            obs = sim.observe()
            t, s, m = (torch.as_tensor(obs[k])[None] for k in ("task", "servers", "action_mask"))
            with torch.inference_mode():
                out = net(t, s, m)
            scores = out.scores[0].numpy().astype(np.float64)
            scores[obs["action_mask"] <= 0.5] = -np.inf
            zs.append(out.z[0].numpy().copy())
            sim.step(int(np.argmax(scores)))
    d = int(getattr(net.cfg, "d_model", 0))
    return np.stack(zs) if zs else np.zeros((0, d), dtype=np.float32)


def feature_table(policy_spec: str, env: EnvConfig, servers: list[int], episodes: int,
                  seed: int) -> list[dict[str, Any]]:
    """Per size N: the statistics of z (``policies.srr.feature_stats``) over the decisions of a
    greedy ``policy_spec`` on ``episodes`` fixed-seed episodes, and their number."""
    policy = get_policy(policy_spec)
    if not hasattr(policy, "net"):
        raise ValueError(f"--policy {policy_spec!r}: a trained policy artifact is needed (z comes "
                         f"from its network)")
    rows = []
    for n in servers:
        z = collect_z(policy, env.with_servers(n), episodes, seed)
        if z.shape[0] < 2:  # no statistics without at least two decisions
            nan = float("nan")
            stats = {"mean_abs_offdiag_cov": nan, "mean_kl": nan, "decorrelation": nan,
                     "mean_var": nan, "mean_abs_mu": nan}
        else:
            stats = feature_stats(torch.as_tensor(z, dtype=torch.float64))
        rows.append({"servers": n, "decisions": int(z.shape[0]), **stats})
    return rows
