"""The overhead part of ``scale-ray bench live --setting agents``: a burst of agent requests
submitted at once on the live nodes, the scheduler against Ray default (:func:`live_overhead`), and
the scheduler's decision path without Ray at any number of nodes (:func:`decision_overhead`)."""

from __future__ import annotations

import heapq
import time
from typing import Any

import numpy as np

from envs.agents import sample_request
from envs.config import EnvConfig, replace
from envs.decision import RUNNING
from envs.nodes import NodeSpec
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler
from scale_ray.live.cluster import NodeInfo, run_speed, server_caps
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.ray_default import RayDefaultRunner

from .agents_cluster import CONFIG, REFERENCE, collected, live_settings

OVERHEAD_TS = 0.001  # the burst's time scale: 1 model s of emulated run = 1 ms wall


def live_overhead(env: EnvConfig, nodes: list[NodeSpec], n_requests: int, repeats: int,
                  rule: str, seed: int, timeout_s: float) -> dict[str, Any]:
    """``n_requests`` agent requests submitted at once (emulated run times at
    :data:`OVERHEAD_TS`), placed by the scheduler (policy ``rule``) and by Ray default on the
    running cluster, alternated ``repeats`` times; medians. The scheduler's cost is its thread's
    CPU per task, split into the Ray client calls it makes (submissions, ``ray.wait``,
    ``ray.get``, ``ray.nodes()``: :mod:`scale_ray.live.ray_cpu`) and its own work (the rest);
    Ray default's is the CPU of the driver's Ray client calls: its submission (one
    ``.options().remote()`` per task, in the submitting thread) and its runner thread's
    ``ray.wait`` and ``ray.get`` of every run, what any run pays."""
    rng = np.random.default_rng(seed)
    reqs = [sample_request(env.workload.agents, rng) for _ in range(n_requests)]
    tasks = sum(len(r.tasks) for r in reqs)
    env, live_cfg = live_settings(env, nodes, OVERHEAD_TS)
    rows: dict[str, list[float]] = {"ray_tp": [], "ray_cpu": [], "ray_wait_cpu": [],
                                    "sched_tp": [], "sched_cpu": [], "sched_ray_cpu": []}
    for r in range(repeats):
        for name in (REFERENCE, rule) if r % 2 == 0 else (rule, REFERENCE):
            runner = RayDefaultRunner(env, dict(live_cfg)) if name == REFERENCE else \
                LiveScheduler(get_policy(rule, env), env, dict(live_cfg))
            wfs = [collected(t, f"burst{k}") for k, t in enumerate(reqs)]
            with runner:
                c0, t0 = time.thread_time(), time.perf_counter()
                for w in wfs:
                    runner.submit(w)
                submit_cpu = time.thread_time() - c0
                if not runner.drain(timeout=timeout_s):
                    raise RuntimeError(f"overhead burst: {name} still running after "
                                       f"{timeout_s:.0f} s")
                wall = time.perf_counter() - t0
                s = runner.summary()
            if name == REFERENCE:
                rows["ray_tp"].append(tasks / wall)
                rows["ray_cpu"].append(1e3 * submit_cpu / tasks)
                rows["ray_wait_cpu"].append(1e3 * s["thread_cpu_s"] / tasks)
            else:
                rows["sched_tp"].append(tasks / wall)
                per_task = 1e3 / max(1, s["tasks_started"])
                rows["sched_cpu"].append(per_task * s["thread_cpu_s"])
                rows["sched_ray_cpu"].append(per_task * s["ray_client_cpu_s"])
        print(f"  overhead round {r + 1}: Ray default {rows['ray_tp'][-1]:.0f} tasks/s (driver CPU "
              f"{rows['ray_cpu'][-1] + rows['ray_wait_cpu'][-1]:.2f} ms a task), "
              f"{rule} {rows['sched_tp'][-1]:.0f} tasks/s, scheduler CPU "
              f"{rows['sched_cpu'][-1]:.2f} ms a task (Ray client calls "
              f"{rows['sched_ray_cpu'][-1]:.2f}, its own work "
              f"{rows['sched_cpu'][-1] - rows['sched_ray_cpu'][-1]:.2f})", flush=True)
    med = {k: float(np.median(v)) for k, v in rows.items()}
    return {"requests": n_requests, "tasks": tasks, "repeats": repeats, "rule": rule,
            "time_scale": OVERHEAD_TS, "ray_default_tasks_per_s": med["ray_tp"],
            "scheduler_tasks_per_s": med["sched_tp"],
            "throughput_ratio": med["sched_tp"] / med["ray_tp"],
            "scheduler_cpu_ms_per_task": med["sched_cpu"],
            "scheduler_ray_client_cpu_ms_per_task": med["sched_ray_cpu"],
            "scheduler_own_cpu_ms_per_task": float(np.median(
                np.subtract(rows["sched_cpu"], rows["sched_ray_cpu"]))),
            "ray_default_submit_cpu_ms_per_task": med["ray_cpu"],
            "ray_default_wait_cpu_ms_per_task": med["ray_wait_cpu"],
            "ray_default_client_cpu_ms_per_task": float(np.median(
                np.add(rows["ray_cpu"], rows["ray_wait_cpu"]))), "raw": rows}


def format_overhead(o: dict[str, Any], nodes: int) -> list[str]:
    """The overhead part's lines (``live_overhead``'s answer with its ``decision_only`` rows)."""
    lines = ["", f"overhead, a burst of {o['requests']} requests ({o['tasks']} tasks) at once on "
             f"{nodes} nodes, medians of {o['repeats']}: scheduler ({o['rule']}) "
             f"{o['scheduler_tasks_per_s']:.0f} tasks/s, Ray default "
             f"{o['ray_default_tasks_per_s']:.0f} (ratio {o['throughput_ratio']:.2f})",
             f"  scheduler thread CPU {o['scheduler_cpu_ms_per_task']:.2f} ms a task: its own "
             f"work {o['scheduler_own_cpu_ms_per_task']:.2f}, Ray client calls "
             f"{o['scheduler_ray_client_cpu_ms_per_task']:.2f}",
             f"  Ray default's driver CPU {o['ray_default_client_cpu_ms_per_task']:.2f} ms a task: "
             f"submission {o['ray_default_submit_cpu_ms_per_task']:.2f}, ray.wait and ray.get "
             f"{o['ray_default_wait_cpu_ms_per_task']:.2f} (the Ray client calls every run pays)"]
    for d in o.get("decision_only", []):
        lines.append(f"  decision path without Ray at {d['nodes']} nodes ({d['requests']} "
                     f"requests, {d['tasks']} tasks, ready backlog up to "
                     f"{d['max_ready_backlog']}): {d['cpu_ms_per_task']:.3f} ms CPU a task")
    return lines


def _server(i: int, spec: Any) -> LiveServer:
    """A node of ``spec`` as discovery would see it (whole: Ray's resource model)."""
    res = spec.all_resources()  # with the accelerator marker Ray adds
    info = NodeInfo(f"n{i}", 1, spec.cpu_speed, res.get("memory", 0.0), spec.name, 0.0, 0.0,
                    server_caps(res, 1), spec.gpu_speed if res.get("GPU") else 0.0,
                    tuple(sorted(spec.labels.items())))
    return LiveServer(i, info, 0)


def decision_overhead(n_nodes: int, n_requests: int, seed: int = 0, rule: str = "eft_spread",
                      config: str = CONFIG) -> dict[str, Any]:
    """The scheduler's own CPU per task without Ray, at any number of nodes: a
    :class:`LiveScheduler` in node mode over ``n_nodes`` nodes of the config's shapes admits a
    burst of ``n_requests`` requests; its rounds (``LivePlacement.round``: the decision core,
    the ``NodeTable``, the policy ``rule``) run as live, a start holds the node's resources
    as a run does, and runs end in order of their emulated run time through the scheduler's own
    completion path (``_finish``). Left out: only Ray's part of a run (``.remote()``,
    ``ray.wait``, ``ray.get``), which :func:`live_overhead` measures."""
    cfg = load_env(config).with_servers(n_nodes)
    specs = cfg.cluster.nodes()
    rng = np.random.default_rng(seed)
    reqs = [sample_request(cfg.workload.agents, rng) for _ in range(n_requests)]
    env = replace(cfg, mdp={"transfer_delays_start": False})
    sched = LiveScheduler(get_policy(rule, env), env,
                          LiveConfig(model="nodes", time_scale=1.0, hedge="off"))
    sched.nodes.slotted = False  # as the first refresh finds plain Ray nodes
    servers = [_server(i, s) for i, s in enumerate(specs)]
    sched.set_alive(servers)
    sched.clock_origin = sched.placement.origin = 0.0  # model s = the emulated clock (a planner
    # reads both; the requests' arrivals, 0 here, are on it too)
    clock = [0.0]
    ends: list[tuple[float, int, Any]] = []

    def start(t: Any, srv: LiveServer, _wall: float) -> None:  # what _submit records, no Ray
        until = clock[0] + t.prim.compute_gflop / run_speed(srv.node, t.demands)
        srv.take(t, until)
        t.server, t.state, t.started = srv, RUNNING, clock[0]
        heapq.heappush(ends, (until, t.gid, t))

    handles = [WorkflowHandle(k, collected(tasks, f"request{k}"), 0.0)
               for k, tasks in enumerate(reqs)]
    t0 = time.thread_time()  # from admission on: the user's DAG building is not counted
    for h in handles:
        sched.admission.admit(h)
    started = backlog_max = 0
    now = lambda: clock[0]  # noqa: E731
    while True:
        sched.placement.round(now, sched.ask, lambda t, srv: start(t, srv, 0.0))
        backlog_max = max(backlog_max, len(sched.placement.queue.heap))
        if not ends:
            break
        clock[0], _, t = heapq.heappop(ends)
        started += 1
        sched.completions.finish(t, t.server.node.node_id, 0.0)
    cpu = time.thread_time() - t0
    done = sum(1 for h in handles if h.done())
    if done != n_requests:
        raise RuntimeError(f"decision overhead: {done} of {n_requests} requests finished")
    return {"nodes": n_nodes, "requests": n_requests, "tasks": started, "rule": rule,
            "cpu_s": cpu, "cpu_ms_per_task": 1e3 * cpu / max(1, started),
            "max_ready_backlog": backlog_max}
