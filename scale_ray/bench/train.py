"""`scale-ray bench train`: RLlib sampling throughput and training-iteration time of our PPO setup
(paper settings from configs/train/scale.yaml: 1024 steps, minibatch 256, 8 epochs, 1 runner × 4
envs) against RLlib's CartPole-v1 with its default module under the same runner/batch settings,
both in this run.

* ``steps_per_s``: env steps per second of ``synchronous_parallel_sample`` (what PPO's
  ``training_step`` calls) for one batch of ``steps_per_iteration`` steps, median of ``--repeats``.
* ``iteration_s``: median ``time_this_iter_s`` of ``--iterations`` full PPO iterations after one
  warm-up iteration (sampling + GAE + 8 epochs of minibatch SGD + weight sync).

Both algorithms live side by side (one env runner each) and are measured alternately; the ratios
are medians of per-pair ratios, so load from other processes affects both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scale_ray.rllib_config import build_algo_config
from scale_ray.train_config import load_train_config
from scale_ray.training import apply_learner_threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/train/scale.yaml", help="our train config")
    p.add_argument("--iterations", type=int, default=5, help="timed iterations (after 1 warm-up)")
    p.add_argument("--repeats", type=int, default=5, help="sampling measurements (median kept)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


def _sample_rate(algo, steps: int) -> float:
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    t0 = time.perf_counter()
    eps, _ = synchronous_parallel_sample(worker_set=algo.env_runner_group, max_env_steps=steps,
                                         sample_timeout_s=600, _uses_new_env_runners=True,
                                         _return_metrics=True)
    return sum(e.env_steps() for e in eps) / (time.perf_counter() - t0)


def _interleaved(ours, cartpole, steps: int, iterations: int, repeats: int) -> dict[str, list[float]]:
    """Alternate the two algorithms measurement by measurement, so that a change in machine load
    (shared CI boxes) hits both alike; ratios are taken per pair."""
    out: dict[str, list[float]] = {"ours_rate": [], "cp_rate": [], "ours_iter": [], "cp_iter": []}
    ours.train()  # warm-up: actors, connectors, first-call paths
    cartpole.train()
    for _ in range(repeats):
        out["ours_rate"].append(_sample_rate(ours, steps))
        out["cp_rate"].append(_sample_rate(cartpole, steps))
    for _ in range(iterations):
        out["ours_iter"].append(ours.train()["time_this_iter_s"])
        out["cp_iter"].append(cartpole.train()["time_this_iter_s"])
    return out


def measure(config: str, iterations: int, repeats: int, echo=None) -> dict[str, Any]:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    cfg, env = load_train_config(config)
    p, ro = cfg.ppo, cfg.rollout
    apply_learner_threads(cfg)  # both runs share the driver's setting
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                 log_to_driver=False)
    try:
        echo(f"ours: {cfg.name} ({p.steps_per_iteration} steps, minibatch {p.minibatch_size}, "
             f"{p.num_epochs} epochs, {ro.num_env_runners} runner(s) x {ro.num_envs_per_env_runner} envs)")
        ours_algo = build_algo_config(cfg, env).build_algo()
        n_envs = max(1, ro.num_env_runners) * ro.num_envs_per_env_runner
        cp_cfg = (PPOConfig().environment("CartPole-v1")
                  .env_runners(num_env_runners=ro.num_env_runners,
                               num_envs_per_env_runner=ro.num_envs_per_env_runner,
                               num_cpus_per_env_runner=ro.num_cpus_per_env_runner,
                               rollout_fragment_length=max(1, p.steps_per_iteration // n_envs))
                  .training(lr=p.lr, gamma=p.gamma, lambda_=p.lambda_, clip_param=p.clip_param,
                            entropy_coeff=p.entropy_coeff, grad_clip=p.grad_clip,
                            use_kl_loss=False, train_batch_size_per_learner=p.steps_per_iteration,
                            minibatch_size=p.minibatch_size, num_epochs=p.num_epochs)
                  .learners(num_learners=0)
                  .debugging(seed=cfg.run.seed, log_level="WARN"))
        echo("CartPole-v1, RLlib default module, same runner/batch settings")
        cp_algo = cp_cfg.build_algo()
        echo(f"measuring, interleaved: {repeats} sampling batches and {iterations} iterations each")
        m = _interleaved(ours_algo, cp_algo, p.steps_per_iteration, iterations, repeats)
        ours_algo.stop()
        cp_algo.stop()
    finally:
        if started:
            ray.shutdown()
    res = {"config": config, "steps_per_iteration": p.steps_per_iteration,
           "minibatch_size": p.minibatch_size, "num_epochs": p.num_epochs,
           "num_env_runners": ro.num_env_runners, "num_envs_per_env_runner": ro.num_envs_per_env_runner,
           "steps_per_s": statistics.median(m["ours_rate"]),
           "cartpole_steps_per_s": statistics.median(m["cp_rate"]),
           "sampling_ratio": statistics.median(a / b for a, b in zip(m["ours_rate"], m["cp_rate"])),
           "iteration_s": statistics.median(m["ours_iter"]),
           "cartpole_iteration_s": statistics.median(m["cp_iter"]),
           "iteration_ratio": statistics.median(a / b for a, b in zip(m["ours_iter"], m["cp_iter"])),
           "iteration_s_min": min(m["ours_iter"]),
           "estimated_full_schedule_min": statistics.median(m["ours_iter"]) * cfg.run.iterations / 60.0,
           "schedule_iterations": cfg.run.iterations, "raw": m,
           "iterations_timed": iterations, "sampling_repeats": repeats}
    return res


def run(args: argparse.Namespace) -> int:
    if args.iterations < 1 or args.repeats < 1:
        raise ValueError("--iterations and --repeats must be >= 1")
    res = measure(args.config, args.iterations, args.repeats)
    print(f"{'':>10} {'steps/s':>10} {'s/iteration':>12}")
    print(f"{'ours':>10} {res['steps_per_s']:>10.0f} {res['iteration_s']:>12.2f}")
    print(f"{'CartPole':>10} {res['cartpole_steps_per_s']:>10.0f} {res['cartpole_iteration_s']:>12.2f}")
    print(f"sampling ratio (ours/CartPole) {res['sampling_ratio']:.2f}; iteration time ratio "
          f"{res['iteration_ratio']:.2f}; {res['estimated_full_schedule_min']:.1f} min "
          f"for the {res['schedule_iterations']}-iteration schedule at the median iteration time")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0
