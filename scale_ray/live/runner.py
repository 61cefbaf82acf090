"""Streaming experiments on a live cluster: workloads, Poisson arrivals, scenarios, statistics.

Shared by ``scale-ray run-workflows`` and ``scale-ray bench live``. Arrival times and failure /
scaling times are in *model* seconds; with ``time_scale`` S they happen S times faster in wall
time (a primitive of c GFLOP on a node of C GFLOP/s sleeps c / C * S wall seconds).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from envs.config import EnvConfig, replace
from envs.order import split_spec
from envs.run_model import compute_range
from envs.runtime import compute_bucket, factors, kind_of_name
from envs.workload import ListSource, WorkflowSpec, make_source
from policies import get_policy

from .cluster import LocalHeteroCluster, live_nodes
from .config import LiveConfig
from .ray_default import RayDefaultRunner
from .scheduler import LiveScheduler
from .workflow import CollectedWorkflow, from_spec

log = logging.getLogger(__name__)


def workload_specs(env: EnvConfig, count: int, seed: int,
                   dag_specs: Sequence[WorkflowSpec] | None = None) -> list[WorkflowSpec]:
    """``count`` workflows from the env's workload source (or replayed from ``dag_specs``)."""
    rng = np.random.default_rng(seed)
    source = ListSource(list(dag_specs), "replay") if dag_specs else make_source(env.workload)
    return [source.next_workflow(rng) for _ in range(count)]


def emulated_runtime(env: EnvConfig, specs: Sequence[WorkflowSpec], hints: str, noise: float,
                     seed: int) -> list[CollectedWorkflow]:
    """``specs`` as emulated workflows whose runs are noisy (``noise``: sigma of the LogNormal
    factor with mean 1, envs.runtime) and whose declared compute follows ``hints``: ``exact``
    the spec's, ``none`` ``runtime.default_gflop`` for every task (the scheduler then has only
    its estimator). Kinds: the task's name, else its compute bucket (as the simulator's)."""
    rt = replace(env.runtime, noise_sigma=noise, hints=hints)
    rng = np.random.default_rng([seed, 3])
    out = []
    for spec in specs:
        n = len(spec.tasks)
        f = factors(rng, rt, 2 * n)  # [n:]: hedged copies' own draws
        shown = None if hints == "exact" else [rt.default_gflop] * n
        out.append(from_spec(spec, shown, f, task_kinds(env, spec)))
    return out


def task_kinds(env: EnvConfig, spec: WorkflowSpec) -> list[str]:
    """Each task's kind, as the simulator's run-time model names it (envs.run_model): its
    ``kind``, else its name without the instance number, else its compute bucket."""
    lo_hi = compute_range(env.workload.compute_gflop)
    return [t.kind or kind_of_name(t.name) or compute_bucket(t.compute_gflop, *lo_hi,
                                                             env.runtime.kinds)
            for t in spec.tasks]


def with_kinds(env: EnvConfig, specs: Sequence[WorkflowSpec]) -> list[WorkflowSpec]:
    """``specs`` with every task's kind written out (:func:`task_kinds`), e.g. for DAG documents
    whose tasks are named ``t0``, ``t1``... (a name says nothing of the primitive)."""
    return [WorkflowSpec(tuple(t._replace(kind=k) for t, k in zip(s.tasks, task_kinds(env, s))),
                         s.name) for s in specs]


def estimator_accuracy(sched: LiveScheduler) -> dict[str, dict[str, float]]:
    """Per kind (with a completed run): the true median compute of its completed emulated runs
    (``run_gflop``) and the scheduler estimator's median (over all tiers), and their relative
    error. The estimator learned from wall times, so dispatch overhead is in its numbers."""
    est = sched.estimator
    runs: dict[str, list[float]] = {}
    declared: dict[str, float] = {}
    for h in sched.handles():
        for i, c in enumerate(h.workflow.calls):
            if h.task_finish_wall[i] is not None:
                runs.setdefault(c.primitive.kind, []).append(c.primitive.run_gflop)
                declared[c.primitive.kind] = c.primitive.compute_gflop
    out = {}
    for kind in sorted(runs):
        true = float(np.median(runs[kind]))
        guess = est.median(kind, None, 1.0) * declared[kind]
        out[kind] = {"n": len(runs[kind]), "true_median_gflop": true,
                     "estimated_median_gflop": guess, "rel_err": guess / true - 1.0}
    return out


def capacity_gflop_s(env: EnvConfig) -> float:
    """Total compute of the configured cluster (sum over servers)."""
    c = env.cluster
    return sum(c.tier(name).compute * n for name, n in c.tier_counts().items())


def rate_for_load(env: EnvConfig, load: float, specs: Sequence[WorkflowSpec]) -> float:
    """Workflows per model second that keep the cluster's compute ``load`` busy on average
    (offered work / total capacity; the policy's placement changes the realised utilisation)."""
    work = float(np.mean([sum(t.compute_gflop for t in s.tasks) for s in specs]))
    return load * capacity_gflop_s(env) / work


def arrival_times(rate: float, count: int, seed: int) -> np.ndarray:
    """Poisson arrival times (model s) of ``count`` workflows at ``rate`` per model second."""
    rng = np.random.default_rng([seed, 1])
    return np.cumsum(rng.exponential(1.0 / rate, size=count))


@dataclass(frozen=True)
class ClusterEvent:
    """A scripted change of the local cluster at model time ``t``: ``kill`` or ``add`` (tier)."""
    t: float
    kind: str
    tier: str = "medium"


def parse_events(kill_at: Sequence[float], add_at: Sequence[str]) -> list[ClusterEvent]:
    """``--kill-node-at 5 --add-node-at 3:large`` -> sorted events."""
    out = [ClusterEvent(float(t), "kill") for t in kill_at]
    for item in add_at:
        t, _, tier = str(item).partition(":")
        out.append(ClusterEvent(float(t), "add", tier or "medium"))
    for ev in out:
        if ev.t < 0:
            raise ValueError(f"--{ev.kind}-node-at: time {ev.t} must be >= 0")
    return sorted(out, key=lambda e: e.t)


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """A one-line progress meter on stderr (only on a terminal, else every 10%)."""
    last = [-1]
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        if total == 0:
            return
        pct = int(100 * done / total)
        if tty:
            sys.stderr.write(f"\r{label}: {done}/{total} workflows done")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif pct // 10 != last[0] // 10 or done == total and last[0] != 100:
            sys.stderr.write(f"{label}: {done}/{total} workflows done\n")
        last[0] = pct

    return show


def stream(target: LiveScheduler | RayDefaultRunner, specs: Sequence[Any], times_model: np.ndarray,
           time_scale: float, cluster: LocalHeteroCluster | None = None,
           events: Sequence[ClusterEvent] = (), seed: int = 0,
           progress: Callable[[int, int], None] | None = None,
           timeout_s: float | None = None) -> dict[str, Any]:
    """Submit ``specs`` at ``times_model`` (scaled to wall time), apply ``events`` on the way,
    wait for every workflow; return the target's summary plus the run's wall time."""
    ts = time_scale if time_scale > 0 else 1.0
    rng = np.random.default_rng([seed, 2])
    pending = list(events)
    t0 = time.perf_counter()
    applied = []
    for spec, tm in zip(specs, times_model):
        while pending and pending[0].t <= tm:
            applied.append(_apply(pending.pop(0), cluster, rng, t0, ts))
        delay = t0 + tm * ts - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        target.submit(spec)
        if progress:
            hs = target.handles()
            progress(sum(1 for h in hs if h.done()), len(specs))
    while pending:  # events after the last arrival
        ev = pending.pop(0)
        delay = t0 + ev.t * ts - time.perf_counter()
        if delay > 0 and target.drain(timeout=delay):
            break  # everything finished first: the event would change nothing
        applied.append(_apply(ev, cluster, rng, t0, ts))
    if not target.drain(timeout=timeout_s, progress=progress):
        log.warning("gave up waiting after %s s: %d workflows unfinished", timeout_s,
                    sum(1 for h in target.handles() if not h.done()))
    out = target.summary()
    out["wall_s"] = time.perf_counter() - t0
    out["cluster_events"] = applied
    # how late each workflow was submitted against its arrival time (responses count from the
    # submission): a driver that falls behind would lower the load the scheduler sees
    lag = [max(h.submitted_wall - (t0 + tm * ts), 0.0) / ts
           for h, tm in zip(target.handles(), times_model)]
    out["submit_lag_model_s"] = {"mean": float(np.mean(lag)) if lag else 0.0,
                                 "max": float(np.max(lag)) if lag else 0.0}
    return out


def _apply(ev: ClusterEvent, cluster: LocalHeteroCluster | None, rng: np.random.Generator,
           t0: float, ts: float) -> dict[str, Any]:
    if cluster is None:
        raise ValueError("--kill-node-at/--add-node-at need a local cluster (--cluster local-hetero)")
    delay = t0 + ev.t * ts - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    if ev.kind == "kill":
        victim = cluster.nodes[int(rng.integers(0, len(cluster.nodes)))].node_id
        cluster.kill_node(victim)
        log.info("t=%.1f: killed node %s", ev.t, victim[:12])
        return {"t": ev.t, "kind": "kill", "node": victim}
    node = cluster.add_node(ev.tier, 1)
    log.info("t=%.1f: added a %s node %s", ev.t, ev.tier, node[:12])
    return {"t": ev.t, "kind": "add", "tier": ev.tier, "node": node}


def make_target(policy_spec: str, env: EnvConfig, live: LiveConfig, seed: int = 0,
                trace: Any = None) -> LiveScheduler | RayDefaultRunner:
    """A started LiveScheduler for ``policy_spec`` (``POLICY[@ORDER]``: ``eft@hop`` runs EFT
    under another ``mdp.order``), or the Ray-default runner."""
    if policy_spec == "ray-default":
        return RayDefaultRunner(env, live).start()
    policy_spec, order = split_spec(policy_spec)
    if order is not None:
        env = replace(env, mdp={"order": order})
    policy = get_policy(policy_spec, env, seed)
    return LiveScheduler(policy, env, live, trace=trace).start()


def wait_cpus_free(timeout_s: float = 60.0) -> None:
    """Until every CPU of the cluster is available again (a killed actor releases its CPU
    asynchronously), so that the next run does not start on a partly held cluster."""
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.perf_counter() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < total and time.perf_counter() < deadline:
        time.sleep(0.02)


def _nap(seconds: float) -> None:
    time.sleep(seconds)


def warm_up(env: EnvConfig, live: LiveConfig, nap_s: float = 0.3) -> float:
    """Give every server node about one idle worker per server: one short task per server
    slot, all at once, hard-pinned to its node. Run before each measured run: a fresh node has
    none (its first task takes 1-2 s), and killing server actors (executor=actor: shutdown and
    the idle reaper) also kills their worker processes. Returns the wall seconds it took."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    t0 = time.perf_counter()
    wait_cpus_free()
    f = ray.remote(num_cpus=live.task_num_cpus, max_retries=0)(_nap)
    refs = [f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote(nap_s)
            for n in live_nodes(env.cluster.tiers) for _ in range(live.slots_per_node or n.slots)]
    ray.get(refs, timeout=300)
    return time.perf_counter() - t0
