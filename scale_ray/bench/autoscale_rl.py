"""``scale-ray bench autoscale-rl`` (issue 72, item 5): a learned sizer trained with RLlib PPO in
the simulator, evaluated on held-out seeds against our model-based sizer. Shipped only if it wins
(results/autoscale/README.md, "A learned sizer").

**What is learned** (``policies.sizing.learned``): the head-room of our sizer, one of
``HEADROOM`` (0.7 ... 1.5 x the model's need), chosen every ``--every`` sizer turns (60 s at the
10-s interval) from features of the sizing view. The node mix, launches and drains stay the
model's.

**The env** (:class:`SizingEnv`, gymnasium): one episode of ``configs/env/autoscale.yaml`` with
EFT placement; a step is one choice of head-room. The choice applies from the sizer's next turn
(one interval, 10 s, after the features it was chosen from: the simulator runs to the next
placement decision before the env gets control back). Reward per step: - (cost billed during
the step) / (the initial cluster's price for a step) - ``slo_penalty`` x max(0, share of the
workflows finished during the step whose response exceeded the SLO's p95 bound - 0.01).

**Seeds.** Training draws episode seeds from 10,000 up, each episode ``--train-horizon-s``
(an hour) of arrivals from a random phase of the daily curve (its ``peak_s`` drawn), so that
short episodes cover the whole day's shape; evaluation uses ``--eval-seeds``
(default 0 1 2, the seeds of ``bench autoscale``'s table), never seen in training. Both arms of
the evaluation run through the same env: ours is the constant choice 1.0 (it equals
``bench autoscale``'s ``model/eft`` episode by episode: tests/test_autoscale_rl.py).

    scale-ray bench autoscale-rl --runners 2 --json results/autoscale/learned.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np

from envs.config_base import replace
from policies.sizing.learned import HEADROOM, N_FEATURES, HeadroomSizer
from scale_ray.config import load_env
from scale_ray.evaluation import start_episode
from scale_ray.bench import write_report
from scale_ray.relative import rel

TRAIN_SEEDS_FROM = 10_000
SLACK = 0.01  # the share of slow workflows a step may have before the penalty starts
SAMPLE_TIMEOUT_S = 1800.0  # per sample() call of a runner; beyond it RLlib drops the samples
KEEP = ("cost", "slo_attainment", "slo_windows_met", "slo_windows", "mean_workflow_response_s",
        "p95_workflow_response_s", "p99_workflow_response_s", "completed_workflows_ratio",
        "nodes_launched", "nodes_drained")


class SizingEnv(gym.Env):
    """One autoscale episode, a step per head-room choice (module docstring). ``config``:
    ``env_config`` (path), ``overrides`` (``KEY=VALUE``), ``horizon_s``, ``every``,
    ``slo_penalty``, ``seed`` (the stream of training episode seeds)."""

    def __init__(self, config: dict | None = None) -> None:
        worker = getattr(config, "worker_index", 0) * 1000 + getattr(config, "vector_index", 0)
        config = dict(config or {})
        env = load_env(config.get("env_config", "configs/env/autoscale.yaml"),
                       list(config.get("overrides", [])))
        if config.get("horizon_s"):
            env = replace(env, workload={"horizon_s": float(config["horizon_s"])})
        self.cfg = replace(env, sizing={"policy": "model"})
        self.every = int(config.get("every", 6))
        self.train_horizon_s = config.get("train_horizon_s")
        self.penalty = float(config.get("slo_penalty", 40.0))
        step_s = self.every * self.cfg.sizing.model.interval_s
        price = sum(t.count * t.price_per_hour for t in self.cfg.cluster.tiers)
        self.cost_ref = price * step_s / 3600.0
        self.observation_space = gym.spaces.Box(0.0, 10.0, (N_FEATURES,), np.float32)
        self.action_space = gym.spaces.Discrete(len(HEADROOM))
        self._rng = np.random.default_rng([int(config.get("seed", 0)), worker])
        self.sim = None

    def _record(self, features: np.ndarray) -> int:
        self._obs = features
        return self.sizer.choice  # the env sets the choice after it sees these features

    def _advance(self) -> np.ndarray | None:
        """Run to the sizer's next turn that asks (None: the episode ended)."""
        self._obs = None
        sim = self.sim
        while sim.current is not None and self._obs is None:
            sim.step(self.policy.decide(sim))
        return self._obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        episode = (options or {}).get("episode")
        cfg = self.cfg
        if episode is None:  # training: a fresh seed, and a random hour of the day's shape
            episode = int(self._rng.integers(TRAIN_SEEDS_FROM, 2**31 - 1))
            if self.train_horizon_s:
                curve = cfg.workload.curve
                cfg = replace(cfg, workload={"horizon_s": self.train_horizon_s, "curve": {
                    "peak_s": float(self._rng.uniform(0.0, curve.period_s))}})
        self.sizer = HeadroomSizer(cfg, act=self._record, every=self.every)
        self.policy, self.sim = start_episode(cfg, "eft", int(episode), sizer=self.sizer)
        self._seen, self._open = 0, []
        self._last = self._advance()
        return self._features(), {"episode": int(episode)}

    def _features(self) -> np.ndarray:
        return np.zeros(N_FEATURES, np.float32) if self._last is None else self._last

    def _slow_share(self) -> float:
        """The share of the workflows finished since the last call that missed the bound."""
        wfs, bound = self.sim.workflows, self.cfg.sizing.slo.p95_s
        self._open += range(self._seen, len(wfs))
        self._seen = len(wfs)
        done = slow = 0
        still = []
        for i in self._open:
            w = wfs[i]
            if w.done == w.n:
                done += 1
                slow += (w.finish - w.arrival) > bound
            else:
                still.append(i)
        self._open = still
        return slow / done if done else 0.0

    def step(self, action: int):
        sim = self.sim
        cost0 = sim.cluster.billing.totals(sim.t)["cost"]
        self.sizer.choice = int(action)
        self._last = self._advance()
        cost = sim.cluster.billing.totals(sim.t)["cost"] - cost0
        reward = -cost / self.cost_ref - self.penalty * max(0.0, self._slow_share() - SLACK)
        return self._features(), float(reward), self._last is None, False, {}

    def metrics(self) -> dict[str, Any]:
        """The finished episode's metrics (``Simulator.metrics``) and the head-rooms chosen."""
        m = self.sim.metrics()
        turns = max(1, sum(self.sizer.chosen))
        return {k: m.get(k) for k in KEEP} | {
            "headroom_share": {str(h): c / turns for h, c in zip(HEADROOM, self.sizer.chosen)}}


def run_policy(env: SizingEnv, act, episode: int) -> dict[str, Any]:
    """One held-out ``episode`` with ``act(features) -> choice``; its metrics."""
    obs, _ = env.reset(options={"episode": episode})
    done = False
    while not done:
        obs, _, done, _, _ = env.step(act(obs))
    return env.metrics() | {"seed": episode}


def greedy(module):
    """``act`` of a trained RLlib module: the most likely choice."""
    import torch

    def act(obs: np.ndarray) -> int:
        with torch.no_grad():
            out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
        return int(out["action_dist_inputs"][0].argmax())
    return act


def train(env_config: dict, iterations: int, batch: int, runners: int, seed: int,
          echo=print):
    """PPO on :class:`SizingEnv` (RLlib's default MLP module); the algorithm and a log per
    iteration."""
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    cfg = (PPOConfig().environment(SizingEnv, env_config=env_config)
           .env_runners(num_env_runners=runners, rollout_fragment_length="auto",
                        # an hour of simulated sizing takes seconds: RLlib's 60-s default
                        # discards whole fragments on a loaded machine (no samples, no update)
                        sample_timeout_s=SAMPLE_TIMEOUT_S)
           .training(lr=3e-4, gamma=0.99, lambda_=0.95, entropy_coeff=0.01,
                     train_batch_size_per_learner=batch, minibatch_size=min(128, batch),
                     num_epochs=6)
           .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64]))
           .learners(num_learners=0)
           .debugging(seed=seed, log_level="WARN"))
    algo = cfg.build_algo()
    log = []
    t0 = time.perf_counter()
    for i in range(iterations):
        r = algo.train()
        ret = r.get("env_runners", {}).get("episode_return_mean")
        steps = r.get("num_env_steps_sampled_lifetime") or \
            r.get("env_runners", {}).get("num_env_steps_sampled_lifetime")
        log.append({"iteration": i + 1, "episode_return_mean": ret, "env_steps": steps,
                    "seconds": time.perf_counter() - t0})
        if not steps or (len(log) > 1 and steps == log[-2]["env_steps"]):
            echo(f"warning: iteration {i + 1} sampled no env steps (runners slower than "
                 f"sample_timeout_s {SAMPLE_TIMEOUT_S:.0f} s?): no update")
        echo(f"iteration {i + 1}/{iterations}: episode return "
             f"{'-' if ret is None else f'{ret:.1f}'}, {steps} steps, "
             f"{time.perf_counter() - t0:.0f} s")
    return algo, log


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/env/autoscale.yaml", help="the env config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="env override (repeatable)")
    p.add_argument("--horizon-s", type=float, default=None,
                   help="arrivals stop here, training and evaluation (default: the config's)")
    p.add_argument("--train-horizon-s", type=float, default=3600.0,
                   help="training episodes: this long, each from a random phase of the daily "
                        "curve (shorter than the config's horizon: more episodes; 0: as "
                        "evaluated)")
    p.add_argument("--iterations", type=int, default=25, help="PPO iterations")
    p.add_argument("--batch", type=int, default=960, help="env steps per PPO iteration")
    p.add_argument("--runners", type=int, default=1, help="RLlib env runners")
    p.add_argument("--every", type=int, default=6, help="sizer turns per head-room choice")
    p.add_argument("--slo-penalty", type=float, default=40.0,
                   help="reward weight of the share of slow workflows above 1 %%")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--eval-seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="held-out episodes (training draws from 10000 up)")
    p.add_argument("--constants", nargs="+", type=float, default=[], metavar="H",
                   help=f"also evaluate these constant head-rooms (of {HEADROOM}) on the held-out "
                        "seeds: is the learned choice more than a constant? (--iterations 0: "
                        "only these and ours)")
    p.add_argument("--json", default=None, help="write the training log and the evaluation here")


def _mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def _evaluate(env: SizingEnv, arm: str, act, seed: int) -> dict[str, Any]:
    r = run_policy(env, act, seed)
    print(f"seed {seed}: {arm} ${r['cost']:.2f} attainment {r['slo_attainment']:.3f} "
          f"(p95 {r['p95_workflow_response_s']:.1f} s; head-rooms {r['headroom_share']})",
          flush=True)
    return r


def _versus(rows: list[dict], ours: list[dict], target: float) -> dict[str, Any]:
    """An arm against ours on the same seeds: mean cost relative to ours, its worst attainment,
    and whether it wins (cheaper, the SLO target met on every seed)."""
    rel_cost = _mean(rows, "cost") / _mean(ours, "cost") - 1.0
    worst = min(r["slo_attainment"] for r in rows)
    return {"rel_cost_vs_model": rel_cost, "slo_attainment": worst,
            "wins": rel_cost < 0 and worst >= target}


def run(args: argparse.Namespace) -> int:
    if args.iterations < 0 or args.batch < 1 or args.every < 1 or args.runners < 0:
        raise ValueError("--iterations must be >= 0, --batch and --every >= 1, --runners >= 0")
    if min(args.eval_seeds) >= TRAIN_SEEDS_FROM:
        raise ValueError(f"--eval-seeds: must be below {TRAIN_SEEDS_FROM} (training's seeds)")
    if [h for h in args.constants if h not in HEADROOM]:
        raise ValueError(f"--constants: each one of {HEADROOM}, got {args.constants}")
    if args.iterations == 0 and not args.constants:
        raise ValueError("--iterations 0 trains nothing: give --constants to evaluate")
    env_config = {"env_config": args.config, "overrides": args.overrides,
                  "horizon_s": args.horizon_s, "every": args.every,
                  "train_horizon_s": args.train_horizon_s,
                  "slo_penalty": args.slo_penalty, "seed": args.seed}
    env = SizingEnv(env_config)
    algo, log, act = None, [], None
    if args.iterations:
        print(f"training: PPO, {args.iterations} iterations x {args.batch} steps "
              f"(a step: {args.every} sizer turns), {args.runners} runner(s)", flush=True)
        import ray

        from scale_ray.training import ensure_ray

        started = ensure_ray(None)  # embedded, or the job's cluster under `ray job submit`
        try:
            algo, log = train(env_config, args.iterations, args.batch, args.runners, args.seed,
                              echo=lambda s: print(s, flush=True))
            act = greedy(algo.get_module())
            algo.stop()
        finally:
            if started:
                ray.shutdown()
    ours, learned = [], []
    constants: dict[str, list] = {str(h): [] for h in args.constants}
    for s in args.eval_seeds:
        ours.append(_evaluate(env, "ours", lambda _obs: HEADROOM.index(1.0), s))
        if act is not None:
            learned.append(_evaluate(env, "learned", act, s))
        for h in args.constants:
            constants[str(h)].append(
                _evaluate(env, f"head-room {h:g}", lambda _obs, i=HEADROOM.index(h): i, s))
    target = load_env(args.config, args.overrides).sizing.slo.target
    out: dict[str, Any] = {
        "eval_seeds": args.eval_seeds, "model_slo_attainment": min(
            r["slo_attainment"] for r in ours),
        "settings": {k: v for k, v in vars(args).items() if k != "run_command"},
        "training": log, "model": ours,
        "constants": {h: _versus(rows, ours, target) | {"runs": rows}
                      for h, rows in constants.items()}}
    for h, c in out["constants"].items():
        print(f"constant head-room {h} vs ours: cost {rel(c['rel_cost_vs_model'])}, worst "
              f"attainment {c['slo_attainment']:.3f}", flush=True)
    if learned:
        v = _versus(learned, ours, target)
        out |= {"rel_cost_vs_model": v["rel_cost_vs_model"],
                "learned_slo_attainment": v["slo_attainment"], "ships": v["wins"],
                "learned": learned}
        print(f"learned vs ours: cost {rel(v['rel_cost_vs_model'])}, worst attainment "
              f"{v['slo_attainment']:.3f} vs {out['model_slo_attainment']:.3f}: "
              f"{'ships' if v['wins'] else 'does not ship (not cheaper at the SLO)'}",
              flush=True)
    write_report(args.json, out, str)
    return 0
