"""`scale-ray features`: statistics of the attention feature z on fixed-seed episodes (paper
Table 5): mean |off-diagonal covariance| and mean per-dimension KL to N(0, 1), at each cluster size.

The policy acts greedily; z is recorded at every decision (all decisions of ``--episodes``
episodes, the same seeds as ``scale-ray eval``), then the statistics are taken over that batch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.config import EnvConfig
from envs.simulator import Simulator
from scale_ray.config import load_env
from scale_ray.evaluation import env_for_policy, episode_seed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help="policy artifact directory or shipped name")
    p.add_argument("--servers", nargs="+", type=int, default=[16, 32, 48], help="cluster sizes N")
    p.add_argument("--episodes", type=int, default=3, help="episodes per size")
    p.add_argument("--seed", type=int, default=0, help="base seed of the fixed episode set")
    p.add_argument("--env-config", default=None, help="environment YAML (default: paper.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an env key (repeatable)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


def collect_z(policy, env: EnvConfig, episodes: int, seed: int) -> np.ndarray:
    """z (decisions × d) of a greedy policy over fixed-seed episodes."""
    net = policy.net
    env = env_for_policy(env, policy.first_level)
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
    from policies import get_policy
    from policies.srr import feature_stats

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


def run(args: argparse.Namespace) -> int:
    for n in args.servers:
        if n < 1:
            raise ValueError(f"--servers: {n} must be >= 1")
    if args.episodes < 1:
        raise ValueError(f"--episodes: {args.episodes} must be >= 1")
    env = load_env(args.env_config, args.set)
    rows = feature_table(args.policy, env, args.servers, args.episodes, args.seed)
    print(f"{'N':>6} {'decisions':>10} {'mean|offdiag cov|':>18} {'mean KL':>10} {'mean var':>9}")
    for r in rows:
        print(f"{r['servers']:>6} {r['decisions']:>10} {r['mean_abs_offdiag_cov']:>18.4f} "
              f"{r['mean_kl']:>10.4f} {r['mean_var']:>9.4f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"policy": args.policy, "episodes": args.episodes,
                                               "seed": args.seed, "results": rows}, indent=2))
    return 0
