"""`scale-ray bench env`: environment steps per second against gymnasium's CartPole.

Both envs are built with ``gymnasium.make`` (same wrapper stack) and only ``env.step`` is timed;
the action choice (random feasible for ours: an idle server whose memory fits; a random action for
CartPole) happens outside the timed region. Resets are outside it too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from envs.gym_env import ENV_ID
from scale_ray.config import load_env

SIZES = (16, 48, 256, 1024)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", nargs="+", type=int, default=list(SIZES))
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    p.add_argument("--repeats", type=int, default=3, help="best of this many measurements")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


def _random_feasible(obs: dict, rng: np.random.Generator, mem_scale: float) -> int:
    mask = obs["action_mask"] > 0.5
    srv = obs["servers"]
    ok = mask & (srv[:, 2] == 0) & (srv[:, 1] * mem_scale >= obs["task"][1] * 64.0 * (1 - 1e-5))
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        idx = np.flatnonzero(mask)
    return int(idx[rng.integers(0, idx.size)])


def _time_env(env: gym.Env, choose, seconds: float, seed: int) -> float:
    """Steps per second of env.step alone, over about ``seconds`` of timed stepping."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    timed, steps = 0.0, 0
    clock = time.perf_counter
    while timed < seconds:
        for _ in range(200):
            a = choose(obs, rng)
            t0 = clock()
            obs, _, term, trunc, _ = env.step(a)
            timed += clock() - t0
            steps += 1
            if term or trunc:
                obs, _ = env.reset()
    return steps / timed


def measure(servers=SIZES, seconds: float = 3.0, repeats: int = 3) -> dict:
    cart = gym.make("CartPole-v1")
    cart_choose = lambda obs, rng: int(rng.integers(0, 2))  # noqa: E731
    out: dict = {"steps_per_s": {}, "cost_ratio_vs_cartpole": {}}
    cart_rates = []
    for n in servers:
        env_cfg = load_env(None, servers=n)
        env = gym.make(ENV_ID, config=env_cfg)
        mem = env_cfg.features.server_memory_gb
        choose = lambda obs, rng: _random_feasible(obs, rng, mem)  # noqa: E731
        # Interleave CartPole measurements so both see the same machine state.
        best = 0.0
        for r in range(repeats):
            cart_rates.append(_time_env(cart, cart_choose, seconds / 2, r))
            best = max(best, _time_env(env, choose, seconds, r))
        out["steps_per_s"][str(n)] = best
        env.close()
    cart_best = max(cart_rates)
    out["cartpole_steps_per_s"] = cart_best
    for n in servers:
        out["cost_ratio_vs_cartpole"][str(n)] = cart_best / out["steps_per_s"][str(n)]
    base_n = servers[0]
    out["cost_growth_vs_linear"] = {
        str(n): (out["steps_per_s"][str(base_n)] / out["steps_per_s"][str(n)]) / (n / base_n)
        for n in servers}
    return out


def run(args: argparse.Namespace) -> int:
    res = measure(args.servers, args.seconds, args.repeats)
    print(f"{'N':>6}{'steps/s':>12}{'us/step':>10}{'x CartPole step':>17}{'cost growth / linear':>22}")
    for n in args.servers:
        sps = res["steps_per_s"][str(n)]
        print(f"{n:>6}{sps:>12.0f}{1e6 / sps:>10.1f}{res['cost_ratio_vs_cartpole'][str(n)]:>17.2f}"
              f"{res['cost_growth_vs_linear'][str(n)]:>22.3f}")
    cp = res["cartpole_steps_per_s"]
    print(f"CartPole-v1 (gymnasium.make): {cp:.0f} steps/s, {1e6 / cp:.1f} us/step")
    print("target: N=48 step <= 4x a CartPole step (aim 2x); cost growth / linear <= 1")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0
