"""`scale-ray bench lookahead`: the cost of one decision of the lookahead planner.

For each cluster size the simulator (configs/env/realistic.yaml by default) runs EFT to
``--warmup-s`` simulated seconds (a loaded, steady state), then the planner makes ``--decisions``
decisions of the same episode; each ``decide`` call is timed (the simulator's own step is not).
Printed per size: mean, median and p95 ms per decision, the mean over decisions that ran rollouts
("planned"; the others answer a reservation or had a single candidate), and rollouts per planned
decision; and the same for the fast EFT alone (one call of ``policies.heuristics.eft_pick``).

``--forked``: also time each decision of the same planner with its rollouts on forks of the
simulator (``Lookahead.fast = False``: how every rollout ran before issue 26; the rollouts of
``policies.fast_rollout`` give the same costs, so the decisions must be the same, and are checked).

``snapshot ms``: the same decisions as the placement service and the live scheduler make them —
the state described as a snapshot (``envs.snapshot.describe``), a simulator built from it and
the planner run on it (``Lookahead.plan``), all timed; such a planner remembers nothing
between decisions, so it plans every one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from envs.simulator import Simulator
from policies import get_policy
from envs.snapshot import describe
from policies.heuristics import eft_pick
from scale_ray.config import load_env
from scale_ray.evaluation import episode_seed

SIZES = (16, 48, 256, 1024)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", nargs="+", type=int, default=list(SIZES))
    p.add_argument("--env-config", default="configs/env/realistic.yaml")
    p.add_argument("--policy", default="lookahead", help="lookahead[:key=value,...]")
    p.add_argument("--decisions", type=int, default=200, help="timed decisions per size")
    p.add_argument("--warmup-s", type=float, default=60.0, help="simulated seconds of EFT first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--snapshot", action="store_true",
                   help="also time each decision as Serve and the live scheduler make it (from "
                        "a snapshot of the state)")
    p.add_argument("--forked", action="store_true",
                   help="also time the planner with its rollouts on simulator forks (as before "
                        "issue 26; the same decisions, checked)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


def measure_one(env, spec: str, decisions: int, warmup_s: float, seed: int,
                snapshot: bool = False, forked: bool = False) -> dict:
    """Timings of ``decisions`` planner decisions after ``warmup_s`` s of EFT on ``env``."""
    sim = Simulator(env)
    sim.reset(episode_seed(seed, 0))
    eft_s = []
    while sim.current is not None and sim.t < warmup_s:
        t0 = time.perf_counter()
        a = eft_pick(sim)
        eft_s.append(time.perf_counter() - t0)
        sim.step(a)
    pol = get_policy(spec, env, seed=seed)
    pol.reset(seed)
    times, planned_t, snap_t, fork_t = [], [], [], []
    clock = time.perf_counter
    fresh = pol.fresh() if snapshot else None
    slow = None
    if forked:
        slow = get_policy(spec, env, seed=seed)
        slow.reset(seed)
        slow.fast = False
    while sim.current is not None and len(times) < decisions:
        if fresh is not None:
            t0 = clock()
            servers, workflows, ids = describe(sim)
            focus = next((w, j) for w, tids in enumerate(ids) for j, tid in enumerate(tids)
                         if tid == sim.current.id)
            fresh.plan(servers, workflows, focus, env=env)
            snap_t.append(clock() - t0)
        if slow is not None:
            t0 = clock()
            b = slow.decide(sim)
            fork_t.append(clock() - t0)
        before = pol.stats["planned"]
        t0 = clock()
        a = pol.decide(sim)
        dt = clock() - t0
        if slow is not None and a != b:
            raise AssertionError(f"N={env.cluster.servers}, t={sim.t}: fast rollouts chose "
                                 f"{a}, forked ones {b}")
        times.append(dt)
        if pol.stats["planned"] > before:
            planned_t.append(dt)
        sim.step(a)
    ms = np.array(times) * 1e3
    return {"servers": env.cluster.servers, "decisions": len(times),
            "mean_ms": float(ms.mean()) if len(ms) else float("nan"),
            "median_ms": float(np.median(ms)) if len(ms) else float("nan"),
            "p95_ms": float(np.percentile(ms, 95)) if len(ms) else float("nan"),
            "planned": len(planned_t),
            "mean_planned_ms": float(np.mean(planned_t) * 1e3) if planned_t else float("nan"),
            "rollouts_per_planned": pol.stats["rollouts"] / max(1, pol.stats["planned"]),
            "fast_eft_us": float(np.mean(eft_s) * 1e6) if eft_s else float("nan"),
            "snapshot_mean_ms": float(np.mean(snap_t) * 1e3) if snap_t else float("nan"),
            "snapshot_p95_ms": float(np.percentile(snap_t, 95) * 1e3) if snap_t else float("nan"),
            "forked_mean_ms": float(np.mean(fork_t) * 1e3) if fork_t else float("nan"),
            "sim_t_s": sim.t}


def run(args: argparse.Namespace) -> int:
    out = []
    print(f"{args.policy} on {args.env_config}: ms per decision after {args.warmup_s:g} s of EFT "
          f"(seed {args.seed})")
    print(f"{'N':>6}{'decisions':>11}{'mean ms':>10}{'median':>9}{'p95':>9}{'planned':>9}"
          f"{'ms/planned':>12}{'rollouts':>10}{'fast EFT us':>13}"
          + (f"{'snapshot ms':>13}{'p95':>9}" if args.snapshot else "")
          + (f"{'forked ms':>11}" if args.forked else ""))
    for n in args.servers:
        r = measure_one(load_env(args.env_config, servers=n), args.policy, args.decisions,
                        args.warmup_s, args.seed, args.snapshot, args.forked)
        out.append(r)
        print(f"{n:>6}{r['decisions']:>11}{r['mean_ms']:>10.2f}{r['median_ms']:>9.2f}"
              f"{r['p95_ms']:>9.2f}{r['planned']:>9}{r['mean_planned_ms']:>12.2f}"
              f"{r['rollouts_per_planned']:>10.2f}{r['fast_eft_us']:>13.1f}"
              + (f"{r['snapshot_mean_ms']:>13.2f}{r['snapshot_p95_ms']:>9.2f}" if args.snapshot
                 else "")
              + (f"{r['forked_mean_ms']:>11.2f}" if args.forked else ""), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"policy": args.policy, "env": args.env_config,
                                               "results": out}, indent=2))
    return 0
