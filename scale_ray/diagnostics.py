"""Where a truncated evaluation episode got stuck (results/paper/README.md, "The greedy livelock").

A greedy policy in the paper's unmasked action space can answer the same ready task with the
same server forever: a server whose memory can never hold the task, so every step is an invalid
"wait" of dt, the state does not change, and the episode runs into its time cap. This replays
one fixed evaluation episode (the seeds of ``scale-ray eval``) and reports, for the decisions
after ``after_s``, which task was asked, which server the policy chose, and how many idle
servers that fit the task were on offer::

    python -m scale_ray.diagnostics results/paper/runs/crossattn_s42/policy --servers 16 --episode 6
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any


from envs.config import EnvConfig
from scale_ray.config import load_env
from scale_ray.evaluation import start_episode


def stuck_tail(env: EnvConfig, policy_spec: str, episode: int, base_seed: int,
               after_s: float) -> dict[str, Any]:
    """Replay one evaluation episode; summarise the decisions made after ``after_s``."""
    policy, sim = start_episode(env, policy_spec, episode, base_seed)
    asked: Counter = Counter()
    last: dict[str, Any] = {}
    while sim.current is not None:
        a = policy.act(sim.observe())
        if sim.t >= after_s:
            task = sim.current
            asked[(task.id, a)] += 1
            table = sim.table
            fits_idle = sum(1 for i in range(table.n) if table.accept_l[i] and not table.busy[i]
                            and table.memory_l[i] >= task.memory_gb)
            last[(task.id, a)] = {
                "task": task.id, "task_memory_gb": task.memory_gb, "slot": a,
                "server_id": int(table.ids[a]), "server_tier": table.specs[a].name,
                "server_memory_gb": float(table.memory_l[a]),
                "parents_server_ids": [p.sid for p in task.parents],
                "idle_servers_that_fit": fits_idle}
        sim.step(a)
    m = sim.metrics()
    tail = [dict(last[k], decisions=n) for k, n in asked.most_common(3)]
    return {"truncated": m["truncated"], "completed_tasks": m["completed_tasks"],
            "arrived_tasks": m["arrived_tasks"], "invalid_rate": m["invalid_rate"],
            "after_s": after_s, "tail": tail}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scale_ray.diagnostics", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", help="heuristic name, shipped policy name or artifact path")
    ap.add_argument("--servers", type=int, default=16, help="cluster size N (default 16)")
    ap.add_argument("--episode", type=int, required=True, help="evaluation episode index")
    ap.add_argument("--seed", type=int, default=20260605,
                    help="base seed of the evaluation set (default: reproduce's, 20260605)")
    ap.add_argument("--env-config", default="configs/env/paper.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="env override, e.g. --set mdp.mask_infeasible=true (repeatable)")
    ap.add_argument("--after-s", type=float, default=None,
                    help="summarise decisions from this simulated time on "
                         "(default: the last 5%% before the env's time cap)")
    args = ap.parse_args(argv)
    if args.servers < 1:
        ap.error(f"--servers must be >= 1, got {args.servers}")
    if args.episode < 0:
        ap.error(f"--episode must be >= 0, got {args.episode}")
    env = load_env(args.env_config, args.overrides, servers=args.servers)
    cap = env.workload.horizon_s * env.mdp.max_time_factor
    after = args.after_s if args.after_s is not None else 0.95 * cap
    r = stuck_tail(env, args.policy, args.episode, args.seed, after)
    print(f"episode {args.episode} (seed {args.seed}), N = {args.servers}: "
          f"truncated={r['truncated']} completed={r['completed_tasks']}/{r['arrived_tasks']} "
          f"invalid_rate={r['invalid_rate']:.3f}")
    if not r["tail"]:
        print(f"no decision after t = {after:g} s: the episode did not get stuck")
    for d in r["tail"]:
        print(f"after t = {after:g} s: task {d['task']} ({d['task_memory_gb']:.1f} GB) answered "
              f"{d['decisions']}x with slot {d['slot']} (server {d['server_id']}, "
              f"{d['server_tier']}, {d['server_memory_gb']:.0f} GB); its parents ran on servers "
              f"{d['parents_server_ids']}; idle servers that fit it: {d['idle_servers_that_fit']}")


if __name__ == "__main__":
    main()
