"""Statistics of the attention feature z of a trained policy on fixed-seed episodes (paper
Table 5): mean |off-diagonal covariance| and mean per-dimension KL to N(0, 1), at each cluster size;
also the mean |off-diagonal correlation| of z and the pointer's calibration (issue 48): the mean
probability of its pick and the mean entropy of its distribution over the valid servers divided
by the log of their number (0: certain, 1: uniform), the flattening the paper attributes to a
larger N.

The policy acts greedily; z is recorded at every decision (all decisions of ``episodes`` episodes,
the same seeds as ``scale-ray eval``), then the statistics are taken over that batch. Used by
`scale-ray features` and `scale-ray reproduce` (Table 5).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.config import EnvConfig
from envs.simulator import Simulator
from policies import get_policy
from policies.srr import feature_stats
from scale_ray.evaluation import env_for_policy, episode_seed


def collect_z(policy, env: EnvConfig, episodes: int, seed: int,
              pointer: list[tuple[float, float, int]] | None = None) -> np.ndarray:
    """z (decisions × d) of a greedy policy over fixed-seed episodes; ``pointer`` gets, per
    decision, (probability of the pick, normalised entropy, valid servers)."""
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
            if pointer is not None:
                pointer.append(calibration(scores))
            sim.step(int(np.argmax(scores)))
    d = int(getattr(net.cfg, "d_model", 0))
    return np.stack(zs) if zs else np.zeros((0, d), dtype=np.float32)


def calibration(scores: np.ndarray) -> tuple[float, float, int]:
    """(the softmax probability of the best valid score, the distribution's entropy / log of
    the valid count (0 when one is valid), the valid count) of masked pointer ``scores``."""
    s = scores[np.isfinite(scores)]
    if s.size == 0:
        return float("nan"), float("nan"), 0
    p = np.exp(s - s.max())
    p /= p.sum()
    h = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(p.max()), h / np.log(s.size) if s.size > 1 else 0.0, int(s.size)


def mean_abs_corr(z: np.ndarray) -> float:
    """Mean |off-diagonal correlation| of the columns of z (constant columns count 0)."""
    c = np.cov(z.astype(np.float64), rowvar=False)
    sd = np.sqrt(np.clip(np.diag(c), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(np.outer(sd, sd) > 0, c / np.outer(sd, sd), 0.0)
    d = r.shape[0]
    return float((np.abs(r).sum() - np.abs(np.diag(r)).sum()) / (d * (d - 1))) if d > 1 else 0.0


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
        ptr: list[tuple[float, float, int]] = []
        z = collect_z(policy, env.with_servers(n), episodes, seed, ptr)
        nan = float("nan")
        if z.shape[0] < 2:  # no statistics without at least two decisions
            stats = {"mean_abs_offdiag_cov": nan, "mean_kl": nan, "decorrelation": nan,
                     "mean_var": nan, "mean_abs_mu": nan, "mean_abs_corr": nan}
        else:
            stats = feature_stats(torch.as_tensor(z, dtype=torch.float64))
            stats["mean_abs_corr"] = mean_abs_corr(z)
        p = np.array([x for x in ptr if x[2] > 0], dtype=float).reshape(-1, 3)
        stats.update({k: float(p[:, j].mean()) if len(p) else nan for j, k in enumerate(
            ("mean_pick_prob", "mean_entropy_norm", "mean_valid_servers"))})
        rows.append({"servers": n, "decisions": int(z.shape[0]), **stats})
    return rows


#: what :func:`plot_shift` draws, per N: (row key, panel title)
PLOTTED = (("mean_var", "variance of z (mean over dimensions)"),
           ("mean_kl", "KL of z to N(0, 1) (mean over dimensions)"),
           ("mean_pick_prob", "pointer: probability of its pick"),
           ("mean_entropy_norm", "pointer: entropy / log(valid servers)"))


def plot_shift(files: list[str], out: str) -> dict[str, list[dict[str, Any]]]:
    """Plot ``scale-ray features --json`` files against N, one line per label (a file's name
    without its ``_s<seed>`` part; files of one label averaged); returns the averaged rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for f in files:
        label = re.sub(r"_s\d+", "", Path(f).stem)
        for r in json.loads(Path(f).read_text())["results"]:
            groups.setdefault(label, {}).setdefault(int(r["servers"]), []).append(r)
    avg = {label: [{"servers": n, **{k: float(np.mean([r[k] for r in rs])) for k, _ in PLOTTED}}
                   for n, rs in sorted(by_n.items())] for label, by_n in sorted(groups.items())}
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4.2 * len(PLOTTED), 3.6))
    for ax, (key, title) in zip(axes, PLOTTED):
        for label, rows in avg.items():
            ax.plot([r["servers"] for r in rows], [r[key] for r in rows], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("servers N")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return avg
