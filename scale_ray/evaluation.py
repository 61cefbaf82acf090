"""Fixed-seed evaluation of any Policy on the simulator, in parallel as Ray tasks.

Episode ``k`` of a run with base seed ``s`` uses ``SeedSequence([s, k])`` at every cluster size and
for every policy (common random numbers: all policies see the same workloads). Seeds are fixed
before any result is seen; ``--seed`` only picks another fixed set.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from envs import order as orders
from envs.objective import CENSORED, DEFAULT_METRIC, metric_key
from envs.programs import split_submission
from envs.config import EnvConfig, replace
from envs.simulator import Simulator
from envs.trace import JsonlTraceWriter
from policies import SAMPLE_PREFIX, get_policy, is_planner
from policies.guard import Guard, GuardConfig, guard_summary, make_guard
from policies.sizing import make_sizer

from .live.raylocal import prepare_local_ray
from .relative import rel

log = logging.getLogger(__name__)

# Keys of one result row (the --json schema of `scale-ray eval`).
ROW_KEYS = ("policy", "servers", "episodes", "mean_workflow_response_s",
            "p95_workflow_response_s", "p99_workflow_response_s", "censored_workflow_response_s",
            "mean_task_response_s", "std_task_response_s", "censored_task_response_s",
            "p95_task_response_s",
            "completed_tasks", "slowdown", "utilization", "invalid_rate", "guard_overrides",
            "guard_override_rate")


def episode_seed(base_seed: int, episode: int) -> np.random.SeedSequence:
    """The fixed seed of evaluation episode ``episode``."""
    return np.random.SeedSequence([base_seed, episode])


def env_for_policy(env: EnvConfig, policy: Any) -> EnvConfig:
    """The env with the ready-task order resolved (``envs.order.resolve``): the config's
    ``mdp.order``, else the one ``policy`` needs (HEFT: upward_rank), else hop; and a trained
    policy's encoder (``env.encoder``: the observation it was trained on). A config that sets an
    order the policy cannot run under raises ``OrderConflict`` naming both."""
    order = orders.resolve(env.mdp.order, getattr(policy, "order", None),
                           getattr(policy, "name", str(policy)))
    if env.mdp.order != order:
        env = replace(env, mdp={"order": order})
    encoder = getattr(policy, "encoder", None)
    if encoder is not None and env.encoder != encoder:
        env = replace(env, encoder=encoder)
    return env


def split_order(spec: str, env: EnvConfig) -> tuple[str, EnvConfig]:
    """``POLICY@ORDER`` (``eft@fifo``): the policy spec and the env with ``mdp.order`` set to
    ORDER (``envs.order.ORDERS``), so one evaluation compares orders on the same episodes; a
    spec without a known order suffix is returned as it is. A ``+MODE`` suffix
    (``eft@fifo+per_call``) sets ``mdp.submission`` the same way (``envs.programs``)."""
    base, mode = split_submission(spec)
    if mode is not None and env.mdp.submission != mode:
        env = replace(env, mdp={"submission": mode})
    base, order = orders.split_spec(base)
    if order is None or env.mdp.order == order:
        return base, env
    return base, replace(env, mdp={"order": order})


def run_identity(spec: str, env: EnvConfig) -> tuple[str, str, str]:
    """What ``spec`` (``POLICY[@ORDER][+MODE]``) runs in ``env``: the policy without its
    suffixes, the ready-task order and the submission mode, resolved. Two specs with one
    identity make the same decisions on every episode (``eft`` and ``eft@hop`` under
    paper.yaml's hop order): pairing them measures nothing."""
    base = split_order(spec, env)[0]
    env = _policy(spec, env)[1]
    return base, env.mdp.order, env.mdp.submission


def _policy(spec: str, env: EnvConfig, seed: int | None = None,
            guard: GuardConfig | None = None) -> tuple[Any, EnvConfig]:
    """The policy of ``spec`` (``POLICY[@ORDER]``, a trained one guarded by ``guard``) and the
    env it runs in (order and encoder resolved)."""
    base, env = split_order(spec, env)
    policy = get_policy(base, env, seed=seed, guard=guard)
    return policy, env_for_policy(env, policy)


def start_episode(env: EnvConfig, policy_spec: str, episode: int, base_seed: int = 0,
                  trace: JsonlTraceWriter | None = None, arrivals: Sequence | None = None,
                  guard: GuardConfig | None = None, sizer: Any = None
                  ) -> tuple[Any, Simulator]:
    """The policy and the reset simulator of fixed evaluation episode ``episode``: the same
    workload, policy seed and first-level order every evaluation of it uses. ``sizer``: who
    sizes the cluster (default: ``env.sizing``'s)."""
    policy_seed = base_seed * 1_000_003 + episode
    policy, env = _policy(policy_spec, env, policy_seed, guard)
    sim = Simulator(env, trace=trace, sizer=make_sizer(env) if sizer is None else sizer)
    sim.reset(episode_seed(base_seed, episode), arrivals=arrivals)
    policy.reset(policy_seed)
    return policy, sim


def simulate(env: EnvConfig, policy: Any, seed: int | np.random.SeedSequence,
             arrivals: Sequence | None = None, policy_seed: int | None = None) -> dict[str, Any]:
    """One episode of ``policy`` (a policy object; a trained one through its guard) on
    ``env``: the workload of ``seed`` or the replayed ``arrivals`` (``[(model s,
    WorkflowSpec)]``); its metrics."""
    sim = Simulator(env, sizer=make_sizer(env))
    sim.reset(seed, arrivals=arrivals)
    policy.reset(policy_seed)
    while sim.current is not None:
        sim.step(policy.decide(sim))
    return sim.metrics()


def guarded_action(guard: Guard | None, sim: Simulator, action: int,
                   trace: Callable[[dict[str, Any]], None] | None = None) -> int:
    """``action``, or the guard's replacement (``policies.guard``) given the current task's
    waits so far; a replacement is written to ``trace`` as a ``guard`` event."""
    if guard is None:
        return action
    chosen, why = guard.check(sim, action)
    if why is not None and trace is not None:
        ids = sim.server_ids
        proposed = ids[action] if 0 <= action < sim.n_slots else None
        trace({"t": sim.t, "event": "guard", "task": sim.current.id, "proposed": proposed,
               "chosen": ids[chosen], "reason": why})
    return chosen


def guard_metrics(guard: Guard | None, decisions: int) -> dict[str, Any]:
    """Per-episode guard counters (zeros without a guard) and overrides / decisions."""
    counts: dict[str, Any] = guard_summary(guard)
    counts["guard_override_rate"] = counts["guard_overrides"] / decisions if decisions else 0.0
    return counts


def run_episode(env: EnvConfig, policy_spec: str, episode: int, base_seed: int = 0,
                trace_path: str | Path | None = None,
                guard: GuardConfig | None = None, arrivals: Sequence | None = None
                ) -> dict[str, Any]:
    """One episode of ``policy_spec`` (heuristic name, shipped name or artifact path); a learned
    policy acts through ``policies.guard`` unless ``guard.enabled`` is false. ``arrivals``:
    ``[(model s, WorkflowSpec)]`` replayed instead of the episode's Poisson workload (the twin
    of a live run, ``scale_ray.bench.twin``)."""
    writer = JsonlTraceWriter(trace_path) if trace_path else None
    try:
        policy, sim = start_episode(env, policy_spec, episode, base_seed, writer, arrivals, guard)
        g = getattr(policy, "guard", None)
        ret = 0.0
        t0 = time.perf_counter()
        if g is not None:  # a trained policy: its own pick, then the guard's (traced)
            while sim.current is not None:
                a = guarded_action(g, sim, policy.act(sim.observe()), writer)
                ret += sim.step(a).reward
        else:
            while sim.current is not None:
                ret += sim.step(policy.decide(sim)).reward
        m = sim.metrics()
    finally:
        if writer is not None:
            writer.close()
    m.update(episode=episode, episode_return=ret, wall_s=time.perf_counter() - t0,
             **guard_metrics(g, m["decisions"]))
    if is_planner(policy):  # what the planner did (policies.lookahead's counters)
        m.update({f"planner_{k}": policy.stats.get(k, 0)
                  for k in ("planned", "rollouts", "changed", "skipped")})
    return m


def run_episodes_lockstep(env: EnvConfig, policy_spec: str, episodes: Sequence[int],
                          base_seed: int = 0, guard: GuardConfig | None = None
                          ) -> list[dict[str, Any]]:
    """Several episodes stepped in lockstep with one batched policy call per step.

    For stateless policies (trained networks: ``policy.batched``), where a batch of B decisions
    costs about as much as one. Each episode's result equals its sequential run (``run_episode``)
    exactly: a ``batched`` policy's ``act_batch`` is batch-invariant (each row scored bit for bit
    as alone, see :class:`policies.artifact.TorchPolicy`), so neither ``--workers`` nor how the
    episodes are sliced into jobs changes a decision.
    """
    policy, env = _policy(policy_spec, env, base_seed, guard)
    if not getattr(policy, "batched", False):  # a planner or heuristic: one by one
        return [run_episode(env, policy_spec, k, base_seed, None, guard) for k in episodes]
    sims = []
    for k in episodes:
        sim = Simulator(env)
        sim.reset(episode_seed(base_seed, k))
        sims.append(sim)
    guards = [make_guard(policy, guard) for _ in sims]
    returns = [0.0] * len(sims)
    t0 = time.perf_counter()
    active = [i for i, s in enumerate(sims) if s.current is not None]
    while active:
        obs = [sims[i].observe() for i in active]
        batch = {key: np.stack([o[key] for o in obs]) for key in obs[0]}
        actions = policy.act_batch(batch)
        for i, a in zip(active, actions):
            a = guarded_action(guards[i], sims[i], int(a))
            returns[i] += sims[i].step(a).reward
        active = [i for i in active if sims[i].current is not None]
    wall = time.perf_counter() - t0
    out = []
    for i, (k, sim) in enumerate(zip(episodes, sims)):
        m = sim.metrics()
        m.update(episode=k, episode_return=returns[i], wall_s=wall / len(sims),
                 **guard_metrics(guards[i], m["decisions"]))
        out.append(m)
    return out


@dataclass(frozen=True)
class Job:
    policy: str
    servers: int
    episodes: tuple[int, ...]


def _run_jobs(env: EnvConfig, jobs: Sequence[Job], base_seed: int, trace_dir: str | None,
              guard: GuardConfig | None = None) -> list[dict[str, Any]]:
    out = []
    for job in jobs:
        cfg = env.with_servers(job.servers)
        batched = getattr(_policy(job.policy, cfg)[0], "batched", False)
        if batched and not trace_dir and len(job.episodes) > 1:
            results = run_episodes_lockstep(cfg, job.policy, job.episodes, base_seed, guard)
        else:
            results = []
            for k in job.episodes:
                trace = None
                if trace_dir:
                    safe = Path(job.policy).name.replace("/", "_")
                    trace = Path(trace_dir) / f"{safe}_n{job.servers}_ep{k:03d}.jsonl"
                results.append(run_episode(cfg, job.policy, k, base_seed, trace, guard))
        for m in results:
            m.update(policy=job.policy, servers=job.servers)
        out.extend(results)
    return out


def aggregate(episodes: Iterable[dict[str, Any]], policy: str, servers: int) -> dict[str, Any]:
    """One result row from per-episode metrics (means over episodes; std of episode means)."""
    eps = list(episodes)

    def mean(key: str) -> float:
        vals = [e[key] for e in eps if e[key] is not None and not math.isnan(e[key])]
        return float(np.mean(vals)) if vals else math.nan

    resp = [e["mean_task_response_s"] for e in eps if not math.isnan(e["mean_task_response_s"])]
    return {
        "policy": policy, "servers": servers, "episodes": len(eps),
        "mean_task_response_s": mean("mean_task_response_s"),
        "std_task_response_s": float(np.std(resp, ddof=1)) if len(resp) > 1 else 0.0,
        "censored_task_response_s": mean("censored_task_response_s"),
        "mean_workflow_response_s": mean("mean_workflow_response_s"),
        "p95_workflow_response_s": mean("p95_workflow_response_s"),
        "p99_workflow_response_s": mean("p99_workflow_response_s"),
        "censored_workflow_response_s": mean("censored_workflow_response_s"),
        "censored_p95_workflow_response_s": mean("censored_p95_workflow_response_s"),
        "censored_p99_workflow_response_s": mean("censored_p99_workflow_response_s"),
        "completed_workflows": mean("completed_workflows"),
        "p95_task_response_s": mean("p95_task_response_s"),
        "completed_tasks": mean("completed_tasks"),
        "slowdown": mean("slowdown"),
        "utilization": mean("utilization"),
        "invalid_rate": mean("invalid_rate"),
        "guard_overrides": mean("guard_overrides"),
        "guard_override_rate": mean("guard_override_rate"),
        "truncated_episodes": sum(bool(e["truncated"]) for e in eps),
    } | (_hedge_row(eps) if eps and "hedge_copies" in eps[0] else {}) | (
        {"busy_server_s": mean("busy_server_s")} if eps and "busy_server_s" in eps[0] else {}) | (
        {"cost": mean("cost"), "slo_attainment": mean("slo_attainment"),
         "min_slo_attainment": min(e["slo_attainment"] for e in eps)}
        if eps and "cost" in eps[0] else {})  # priced tiers or a sizer (docs/autoscale.md)


def _hedge_row(eps: list[dict[str, Any]]) -> dict[str, Any]:
    """runtime.hedge (envs.hedging): copies per episode, and the server time of copies and of
    cancelled runs as a share of the rest (the extra work hedging cost)."""
    copy_s = sum(e["hedge_copy_server_s"] for e in eps)
    waste_s = sum(e["hedge_waste_server_s"] for e in eps)
    busy = sum(e["busy_server_s"] for e in eps)
    return {"hedge_copies": float(np.mean([e["hedge_copies"] for e in eps])),
            "hedge_wins": float(np.mean([e["hedge_wins"] for e in eps])),
            "hedge_copy_frac": copy_s / max(busy - copy_s, 1e-12),
            "hedge_waste_frac": waste_s / max(busy - waste_s, 1e-12)}


def ci95_half_width(values: Sequence[float] | np.ndarray) -> float:
    """Half-width of the 95 % t-interval of the mean of ``values``: ``t_{0.975, n-1} · s / sqrt(n)``
    (s: sample standard deviation); nan for fewer than 2 values."""
    from scipy.stats import t

    d = np.asarray(values, dtype=float)
    n = len(d)
    if n < 2:
        return math.nan
    return float(t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))


def paired_differences(episodes: Iterable[dict[str, Any]], reference: str,
                       metric: str = DEFAULT_METRIC) -> list[dict[str, Any]]:
    """Per (policy, size): the mean over episodes of ``metric``'s episode value
    (``envs.objective.METRICS``: mean workflow response by default) / the reference's - 1 on the same
    episode (same seed, same workload), the half-width of its 95 % t-interval
    (``t_{0.975, n-1} · s / sqrt(n)`` over the n paired episodes; nan for n < 2), and how many
    episodes were better / worse. Paired, so workload noise cancels.
    ``completed_rel_diff``: the same for completed tasks; when it is not 0 the response means
    are over different task sets (a policy that leaves tasks unfinished drops its slowest)."""
    def per_episode(k: str) -> dict[tuple[str, int], dict[int, float]]:
        by: dict[tuple[str, int], dict[int, float]] = {}
        for e in episodes:
            by.setdefault((e["policy"], e["servers"]), {})[e["episode"]] = e.get(k, math.nan)
        return by

    episodes = list(episodes)
    key = metric_key(metric)
    by = per_episode(key)
    done = per_episode("completed_tasks" if metric == "task" else "completed_workflows")
    cens = per_episode(CENSORED[metric])

    def rel(vals: dict[int, float], ref: dict[int, float]) -> tuple[np.ndarray, list[int]]:
        """Per-episode relative differences over the episodes both have, and those episodes."""
        common = [k for k in sorted(vals) if k in ref and ref[k] and not math.isnan(vals[k])
                  and not math.isnan(ref[k])]
        return np.array([vals[k] / ref[k] - 1.0 for k in common]), common

    out = []
    for (policy, n), vals in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ref = by.get((reference, n))
        if policy == reference or ref is None:
            continue
        d, common = rel(vals, ref)
        dn, rn = done[(policy, n)], done[(reference, n)]
        c = [dn[k] / rn[k] - 1.0 for k in common if rn.get(k)]
        dc, _ = rel(cens[(policy, n)], cens[(reference, n)])
        out.append({"policy": policy, "servers": n, "reference": reference, "metric": metric,
                    "episodes": len(d),
                    "mean_rel_diff": float(d.mean()) if len(d) else math.nan,
                    "ci95_half_width": ci95_half_width(d), "better": int((d < 0).sum()),
                    "worse": int((d > 0).sum()),
                    "completed_rel_diff": float(np.mean(c)) if c else math.nan,
                    # on every arrived task (censored mean): comparable when completed tasks differ
                    "censored_rel_diff": float(dc.mean()) if len(dc) else math.nan,
                    "censored_ci95_half_width": ci95_half_width(dc)})
    return out


#: what each ``--metric`` measures, as printouts name it
METRIC_NAMES = {"workflow": "mean workflow response", "task": "mean task response",
                "workflow_p95": "p95 workflow response", "workflow_p99": "p99 workflow response"}


def format_paired(rows: Sequence[dict[str, Any]]) -> str:
    """The paired table: per policy and size the mean over episodes of (policy / reference - 1),
    lower is better, its 95 % CI and on how many episodes it was better, worse or equal."""
    label = policy_labels(r["policy"] for r in rows)
    w = max([12] + [len(v) + 2 for v in label.values()])
    lines = [f"paired vs {rows[0]['reference']} "
             f"({METRIC_NAMES[rows[0].get('metric', 'task')]}, "
             f"policy / {rows[0]['reference']} - 1 on each episode; lower is better):"
             if rows else ""]
    for r in rows:
        equal = r["episodes"] - r["better"] - r["worse"]
        lines.append(f"  {label[r['policy']]:<{w}} N={r['servers']:<5} {rel(r['mean_rel_diff'], 2)} "
                     f"± {100 * r['ci95_half_width']:.2f}% (95% CI, {r['episodes']} episodes; "
                     f"better in {r['better']}, worse in {r['worse']}, equal in {equal})"
                     + (f"; completed {'tasks' if r.get('metric') == 'task' else 'workflows'} "
                        f"{rel(r['completed_rel_diff'])}: not comparable"
                        + (f"; on everything that arrived (censored) {rel(r['censored_rel_diff'], 2)} "
                           f"± {100 * r['censored_ci95_half_width']:.2f}%"
                           if not math.isnan(r.get("censored_rel_diff", math.nan)) else "")
                        if abs(r.get("completed_rel_diff", 0.0)) > 1e-9 else ""))
    return "\n".join(lines)


def evaluate(env: EnvConfig, policies: Sequence[str], servers: Sequence[int], episodes: int,
             base_seed: int = 0, workers: int = 0, trace_dir: str | None = None,
             progress: Callable[[int, int], None] | None = None,
             guard: GuardConfig | None = None) -> tuple[list[dict], list[dict]]:
    """Evaluate every policy at every size; returns (rows, per-episode metrics).

    ``workers`` > 1 runs episodes as Ray tasks on an embedded local Ray (one CPU each); 0 picks the
    number of CPUs; 1 runs in this process. Learned policies act through ``policies.guard``
    (default :class:`GuardConfig`; ``GuardConfig(enabled=False)`` for the raw policy).
    """
    # Fail fast on a bad name or artifact, before any work starts.
    # (an order the policy cannot run under is an error here too: envs.order.OrderConflict)
    batched = {p: getattr(_policy(p, env)[0], "batched", False) for p in policies}
    if trace_dir:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    if workers == 0:
        workers = os.cpu_count() or 1
    # One job = a slice of episodes of one (policy, size): a batched policy steps them in lockstep.
    # Slices small enough to keep every worker busy; large clusters first (they take longest).
    def slices(p: str) -> int:
        if workers > 1:
            return max(1, math.ceil(episodes / (2 * workers)))
        return episodes if batched[p] else 1
    jobs = [Job(p, n, tuple(range(k, min(k + slices(p), episodes))))
            for p in policies for n in servers for k in range(0, episodes, slices(p))]
    jobs.sort(key=lambda j: -j.servers)
    total = len(policies) * len(servers) * episodes
    results: list[dict] = []
    if workers <= 1:
        for job in jobs:
            results.extend(_run_jobs(env, [job], base_seed, trace_dir, guard))
            if progress:
                progress(len(results), total)
    else:
        results = _run_on_ray(env, jobs, base_seed, trace_dir, workers, progress, total, guard)
    rows = []
    for p in policies:
        for n in servers:
            eps = sorted((r for r in results if r["policy"] == p and r["servers"] == n),
                         key=lambda r: r["episode"])
            rows.append(aggregate(eps, p, n))
    return rows, results


def _run_on_ray(env: EnvConfig, jobs: list[Job], base_seed: int, trace_dir: str | None,
                workers: int, progress: Callable[[int, int], None] | None,
                total: int, guard: GuardConfig | None = None) -> list[dict]:
    import ray

    started = False
    if not ray.is_initialized():
        prepare_local_ray()  # token auth asked for and no token: bring one, never write ~/.ray
        ray.init(address="local", num_cpus=workers, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run_jobs)
        env_ref = ray.put(env)
        pending = [remote.remote(env_ref, [job], base_seed, trace_dir, guard) for job in jobs]
        results: list[dict] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(done[0]))
            if progress:
                progress(len(results), total)
        return results
    finally:
        if started:
            ray.shutdown()


def policy_labels(specs: Iterable[str]) -> dict[str, str]:
    """Short display names: the last path component, or as many trailing components as it takes
    to tell the given specs apart (``runs/a/policy`` and ``runs/b/policy`` -> ``a/policy``...).
    A ``sample:`` prefix is kept (``sample:runs/a/policy`` -> ``sample:a/policy``)."""
    def split(sp: str) -> tuple[str, str]:
        return (SAMPLE_PREFIX, sp[len(SAMPLE_PREFIX):]) if sp.startswith(SAMPLE_PREFIX) else ("", sp)

    specs = list(dict.fromkeys(specs))
    depth = {sp: 1 for sp in specs}
    while True:
        label = {sp: split(sp)[0] + "/".join(Path(split(sp)[1]).parts[-depth[sp]:]) for sp in specs}
        clash = [sp for sp in specs if sum(label[o] == label[sp] for o in specs) > 1
                 and depth[sp] < len(Path(sp).parts)]
        if not clash:
            return label
        for sp in clash:
            depth[sp] += 1


#: the columns of :func:`format_table`: (header, row key, width, format); times in model s
TABLE_COLUMNS = (
    ("N", "servers", 6, "d"), ("eps", "episodes", 5, "d"),
    ("wf mean s", "mean_workflow_response_s", 10, ".3f"),
    ("wf p95 s", "p95_workflow_response_s", 10, ".2f"),
    ("wf p99 s", "p99_workflow_response_s", 10, ".2f"),
    ("task mean±std s", None, 18, ""), ("task p95 s", "p95_task_response_s", 11, ".3f"),
    ("tasks done", "completed_tasks", 11, ".1f"), ("slowdown", "slowdown", 9, ".3f"),
    ("util", "utilization", 6, ".3f"), ("waits/dec", "invalid_rate", 10, ".3f"),
    ("guard/ep", "guard_overrides", 9, ".1f"),
)
TABLE_LEGEND = (
    "response times in model s, lower is better (wf: a workflow's submission to its last "
    "task's end; task: the paper's per-task response);\nslowdown: workflow response / its "
    "critical path on the fastest servers (lower is better); util: busy share of server time; "
    "waits/dec: policy answers\nthat made a task wait, per decision; guard/ep: learned-policy "
    "picks the guard replaced, per episode (heuristics: 0)")


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table, one line per (policy, servers): workflow response (mean, p95, p99)
    first, then the paper's task response; a legend line says the units and which way is
    better. Means over completed workflows; a row whose episodes left workflows unfinished is
    flagged under the table with the mean over everything that arrived (censored)."""
    label = policy_labels(r["policy"] for r in rows)
    w = max([16] + [len(v) + 2 for v in label.values()])
    head = f"{'policy':<{w}}" + "".join(f"{h:>{width}}" for h, _, width, _ in TABLE_COLUMNS)
    lines = [TABLE_LEGEND, head, "-" * len(head)]
    unfinished = []
    for r in rows:
        cells = []
        for _, key, width, fmt in TABLE_COLUMNS:
            text = (f"{r['mean_task_response_s']:.3f}±{r['std_task_response_s']:.3f}"
                    if key is None else format(r.get(key, 0.0), fmt))
            cells.append(f"{text:>{width}}")
        lines.append(f"{label[r['policy']]:<{w}}" + "".join(cells))
        cens = r.get("censored_workflow_response_s", math.nan)
        mean = r["mean_workflow_response_s"]
        if not (math.isnan(cens) or math.isnan(mean)) and abs(cens - mean) > 1e-9 * max(1, mean):
            unfinished.append(f"{label[r['policy']]} N={r['servers']}: {cens:.3f} s")
    for r in rows:
        if "cost" in r:  # priced tiers or a sizer (env.sizing; docs/autoscale.md)
            lines.append(f"{label[r['policy']]} N={r['servers']}: cost {r['cost']:.2f} per "
                         f"episode (the tiers' price_per_hour), SLO attainment "
                         f"{r['slo_attainment']:.3f} (worst episode {r['min_slo_attainment']:.3f})")
    if unfinished:
        lines.append("unfinished workflows in some episodes: wf mean s counts completed ones; "
                     "over every workflow that arrived (censored at the episode's end): "
                     + "; ".join(unfinished))
    return "\n".join(lines)


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """A progress callback on stderr: on a terminal it rewrites one line; elsewhere (a CI log, a
    file) it writes one summary line when the last episode is done."""
    t0 = time.perf_counter()

    def report(done: int, total: int) -> None:
        el = time.perf_counter() - t0
        err = sys.stderr
        if getattr(err, "isatty", lambda: False)():
            eta = el / done * (total - done) if done else 0.0
            print(f"\r{label}: {done}/{total} episodes, {el:.0f}s elapsed, ~{eta:.0f}s left",
                  end="\n" if done == total else "", file=err, flush=True)
        elif done == total:
            print(f"{label}: {total} episodes in {el:.0f}s", file=err, flush=True)

    return report
