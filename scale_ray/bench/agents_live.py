"""``scale-ray bench live --setting agents`` (issue 46, item 6): agent requests of
``configs/env/agents.yaml`` on a local Ray cluster of nodes with CPUs, memory and logical GPUs of
two accelerator types (emulated run times), placed live by the node rules (``live.model:
nodes``) and by Ray's default scheduler, each next to its twin: the node simulator
(``envs.node_sim``) on the same requests and arrival times, Ray default's twin being Ray's hybrid
policy as ``policies.node_rules.RayHybrid`` emulates it.

Prints per policy the live and the twin's workflow response (model s: mean, p95, p99), the gain
over Ray default live and in the twin (value / Ray default's − 1), and the gap between them in
points; ``--json`` writes ``rel_diff_vs_ray_default`` and ``max_twin_gap_points`` with every
number.

The overhead part (not with ``--skip-overhead``): a burst of requests submitted at once on the
same nodes, the first rule against Ray default (:func:`live_overhead`: throughput, the scheduler
thread's CPU per task, Ray default's submission CPU per task), and the scheduler's decision path
without Ray at ``--overhead-nodes`` nodes (:func:`decision_overhead`: this machine holds only 8
raylets), in ``overhead``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from envs.agents import AgentTask, load_agents, node_specs, sample_request
from envs.config import EnvConfig, replace
from envs.config_files import read_yaml, resolve_config_path
from envs.decision import RUNNING
from envs.node_sim import NodeSimulator, arrival_rate
from envs.nodes import NodeSpec
from envs.workflow import TaskSpec, WorkflowSpec
from policies import get_policy
from policies.node_learned import node_decider
from scale_ray.live import LiveConfig, LiveScheduler
from scale_ray.live.cluster import (COMPUTE_LABEL, GPU_COMPUTE_LABEL, TIER_LABEL, NodeInfo,
                                   run_speed, server_caps)
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.ray_default import RayDefaultRunner
from scale_ray.live.raylocal import prepare_local_ray
from scale_ray.live.workflow import (Call, CollectedWorkflow, Primitive, emulated_body,
                                     expected_emulated_values)
from scale_ray.relative import rel

CONFIG = "configs/env/agents.yaml"
REFERENCE = "ray-default"


HEDGE = "+hedge"  # RULE+hedge: live.hedge all, its twin hedge_quantile (envs.node_hedging)


def add_agents_arguments(p: argparse.ArgumentParser) -> None:
    """``scale-ray bench live``'s options for ``--setting agents``."""
    g = p.add_argument_group("--setting agents (Ray's resource model; scale_ray/bench/agents_live.py)")
    g.add_argument("--nodes", type=int, default=8, help="nodes of agents.yaml's shapes")
    g.add_argument("--gpu-load", type=float, default=None, help="offered GPU load (default: "
                   "the config's gpu_load)")
    g.add_argument("--rules", nargs="+", default=["eft_spread", "eft"], help="node rules "
                   "placed live (policies/node_rules.py, or learned:PATH: a node artifact); "
                   "RULE+hedge: with hedged stragglers (live.hedge all)")
    g.add_argument("--run-noise", type=float, default=0.0, help="each call's runs take its "
                   "compute x a LogNormal factor of mean 1 and this log-spread, drawn per "
                   "request (live and twin alike; envs/node_hedging.py)")
    g.add_argument("--runs", type=int, default=2, help="runs (seeds from --seed)")
    g.add_argument("--ray-draws", type=int, default=20, help="the twin's Ray default: the mean "
                   "of this many draws of its random choice (live Ray is one; 1: one draw)")
    g.add_argument("--agents-config", default="configs/env/agents.yaml")
    g.add_argument("--timeout-s", type=float, default=900.0, help="per run and policy")
    g.add_argument("--overhead-requests", type=int, default=150, help="the overhead part's "
                   "burst of requests on the live nodes (--skip-overhead: none); the decision "
                   "path without Ray gets as many per node")
    g.add_argument("--speeds", choices=("known", "learned"), default="known", help="known: "
                   "live.gpu_speeds set; learned: none, live and twin learn them (estimator)")
    g.add_argument("--overhead-nodes", type=int, nargs="*", default=[64, 256],
                   help="node counts of the decision path measured without Ray")


def requests(cfg, nodes: list[NodeSpec], n: int, seed: int, noise: float = 0.0
             ) -> list[tuple[float, list[AgentTask]]]:
    """``n`` requests and their arrival times (model s) at the rate of ``cfg.gpu_load``; with
    ``noise``, each call's two run factors (a run, a hedged copy) from a stream of their own
    (the requests stay those without noise)."""
    rate = arrival_rate(cfg, nodes)
    rng = np.random.default_rng(seed)
    noisy = np.random.default_rng([seed, 1])
    t, out = 0.0, []
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        tasks = sample_request(cfg, rng)
        for task in tasks if noise > 0 else ():
            task.factors = tuple(float(f) for f in noisy.lognormal(-noise * noise / 2, noise, 2))
        out.append((t, tasks))
    return out


def collected(tasks: list[AgentTask], name: str) -> Any:
    """A request as the live scheduler's workflow: emulated bodies with the calls' Ray demands
    (num_cpus, num_gpus, memory) and computes (seconds at speed 1)."""
    spec = WorkflowSpec(tuple(TaskSpec(t.compute, dict(t.demands).get("memory", 0.0), 0.0,
                                       t.parents, t.name) for t in tasks), name)
    calls: list[Any] = []
    for i, t in enumerate(tasks):
        d = dict(t.demands)
        opts = {"num_cpus": d.get("CPU", 0.0)} | ({"num_gpus": d["GPU"]} if "GPU" in d else {})
        prim = Primitive(emulated_body, t.compute, d.get("memory", 0.0), 0.0, t.name,
                         ray_options=opts, emulate=True)
        if t.factors is not None:  # what its run and a copy of it take (--run-noise)
            prim.run_gflop, prim.copy_gflop = (t.compute * f for f in t.factors)
        calls.append(Call(prim, (i, *(calls[p] for p in t.parents)), {}))
    kids = spec.children()
    return CollectedWorkflow(spec, tuple(calls), tuple(i for i, k in enumerate(kids) if not k),
                             tuple(expected_emulated_values(spec)))


class AgentsCluster:
    """A local Ray cluster of ``nodes`` (logical CPUs, GPUs, memory, an accelerator marker; the
    labels the emulated bodies read their speed from), its own temp dir and ports."""

    def __init__(self, nodes: list[NodeSpec]):
        self.nodes = nodes
        self._cluster: Any = None
        self.temp_dir = ""

    def __enter__(self) -> "AgentsCluster":
        import ray
        from ray.cluster_utils import Cluster

        prepare_local_ray()
        self.temp_dir = tempfile.mkdtemp(prefix="sca_", dir="/tmp")
        self._cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "temp_dir": self.temp_dir})
        for nd in self.nodes:
            r = dict(nd.resources)
            labels = {TIER_LABEL: nd.name, COMPUTE_LABEL: f"{nd.cpu_speed:g}"}
            if r.get("GPU"):
                labels[GPU_COMPUTE_LABEL] = f"{nd.gpu_speed:g}"
            self._cluster.add_node(
                wait=False, num_cpus=r.get("CPU", 0), num_gpus=r.get("GPU", 0),
                memory=int(r.get("memory", 0) * 1e9), object_store_memory=100 * 10 ** 6,
                resources={f"accelerator_type:{nd.accelerator}": 1} if nd.accelerator else {},
                labels=labels)
        self._cluster.wait_for_nodes()
        ray.init(address=self._cluster.address, include_dashboard=False, log_to_driver=False)
        self.warm()
        return self

    def warm(self, per_node: int = 6) -> float:
        """Start workers before any run is timed: on every node ``per_node`` CPU tasks at once
        and, on a GPU node, four quarter-GPU tasks (Ray keeps GPU workers apart). A cold start
        here took 42 s for a request that takes 5.6 s warm; whoever ran first paid it. More
        warm workers did not help: with 16 a node, Ray default's run took 132.9 model s against
        14.8 with 6 (results/resource_model/README.md)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        @ray.remote(num_cpus=1)
        def hold(s: float) -> None:
            time.sleep(s)

        t0 = time.perf_counter()
        refs = []
        for n in ray.nodes():
            res = n.get("Resources") or {}
            if not n.get("Alive") or not res.get("CPU"):
                continue
            pin = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            refs += [hold.options(scheduling_strategy=pin).remote(1.0)
                     for _ in range(min(per_node, int(res["CPU"])))]
            if res.get("GPU"):
                refs += [hold.options(scheduling_strategy=pin, num_gpus=0.25).remote(1.0)
                         for _ in range(4)]
        ray.get(refs)
        return time.perf_counter() - t0

    def __exit__(self, *exc: Any) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def live_settings(nodes: list[NodeSpec], ts: float, speeds: str = "known"
                  ) -> tuple[EnvConfig, dict[str, Any]]:
    """The env and the live config of every run: Ray's resource model, emulated run times at
    time scale ``ts``, no hedging; ``speeds`` ``known``: the nodes' GPU speeds relative to their
    CPU speed are configured (``gpu_speeds``), ``learned``: none is (every node speed 1) and the
    run-time estimator learns them per kind and node shape from completions."""
    env = replace(EnvConfig(), mdp={"transfer_delays_start": False})
    cfg: dict[str, Any] = {"model": "nodes", "time_scale": ts, "server_compute": 1.0,
                           "hedge": "off"}
    if speeds == "known":
        cfg["gpu_speeds"] = {nd.accelerator: nd.gpu_speed / nd.cpu_speed
                             for nd in nodes if nd.accelerator}
    else:
        cfg["estimator"] = "online"
    return env, cfg


def live_run(runner: Any, reqs: list[tuple[float, list[AgentTask]]], ts: float,
             timeout_s: float) -> dict[str, Any]:
    """Submit every request at its arrival time (wall = model x ``ts``), wait for all."""
    with runner:
        t0 = time.perf_counter()
        for k, (t, tasks) in enumerate(reqs):
            delay = t0 + t * ts - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            runner.submit(collected(tasks, f"request{k}"))
        if not runner.drain(timeout=timeout_s):
            raise RuntimeError(f"{runner.summary().get('policy')}: requests still running after "
                               f"{timeout_s:.0f} s")
        return runner.summary()


def _run_rule(name: str, r: int, seed: int, reqs, args: Any, cfg, nodes, env,
              live_cfg: dict) -> tuple[dict, dict]:
    """One rule (or Ray's default) on one run's requests, live and in its twin: their rows."""
    if name == REFERENCE:
        runner = RayDefaultRunner(env, {**live_cfg})
    else:
        hedge = {"hedge": "all"} if name.endswith(HEDGE) else {}
        runner = LiveScheduler(get_policy("eft"), env, {
            **live_cfg, **hedge, "node_rule": name.removesuffix(HEDGE)})
    t0 = time.perf_counter()
    s = live_run(runner, reqs, args.time_scale, args.timeout_s)
    live = {k: s[k] for k in (
        "mean_workflow_response_model_s", "p95_workflow_response_model_s",
        "p99_workflow_response_model_s", "workflows_completed")} | {
        "wall_s": time.perf_counter() - t0, "thread_cpu_s": s.get("thread_cpu_s"),
        "run_lag_model_s": s.get("run_lag_model_s"), "run_lag_by_node": s.get("run_lag_by_node"),
        "tasks_per_node": s.get("tasks_per_node")}
    twin_cfg = replace(cfg, run_noise=args.run_noise, hedge_quantile=(
        live_cfg.get("hedge_quantile", 0.9) if name.endswith(HEDGE) else 0.0))
    twin = twin_prediction(name, seed, reqs, twin_cfg, nodes,  # learned speeds: as live
                           args.speeds == "learned" and name != REFERENCE, args.ray_draws)
    lag = s.get("run_lag_model_s")
    print(f"  run {r + 1} {name:12s} live mean {s['mean_workflow_response_model_s']:.2f} "
          f"twin {twin['mean_workflow_response_s']:.2f} model s "
          f"({time.perf_counter() - t0:.0f} s wall)"
          + (f"; a run's lag outside its worker {lag:.2f} model s" if lag is not None else ""),
          flush=True)
    return live, {(k[:-2] + "_model_s" if k.endswith("response_s") else k): v
                  for k, v in twin.items()}


def twin_prediction(name: str, seed: int, reqs: list, cfg: Any, nodes: list[NodeSpec],
                    learn_speeds: bool, ray_draws: int) -> dict[str, Any]:
    """``name``'s twin on the run's requests. Ray default (``REFERENCE``) draws its top-k
    choice at random, and live Ray is one draw: its twin is the mean over ``ray_draws`` draws
    (seeds ``seed + 10,000 j``; 1: the run's seed alone), with the draws' standard deviation of
    the mean response (``sd_mean_workflow_response_s``) and ``draws``."""
    draws = ray_draws if name == REFERENCE else 1
    if draws < 1:
        raise ValueError(f"--ray-draws: {ray_draws} must be >= 1")
    decide = "ray" if name == REFERENCE else name.removesuffix(HEDGE)
    runs = [NodeSimulator(cfg, nodes, learn_speeds=learn_speeds).run(
        node_decider(decide), seed + 10_000 * j, arrivals=reqs) for j in range(draws)]
    out = {k: (float(np.mean([r[k] for r in runs])) if isinstance(v, (int, float)) else v)
           for k, v in runs[0].items()}
    means = [r["mean_workflow_response_s"] for r in runs]
    return out | {"draws": draws, "sd_mean_workflow_response_s":
                  float(np.std(means, ddof=1)) if draws > 1 else 0.0}


def run_agents(args: Any) -> int:
    raw = read_yaml(resolve_config_path(args.agents_config))
    cfg = load_agents(raw | {"gpu_load": args.gpu_load} if args.gpu_load else raw)
    nodes = node_specs(cfg, args.nodes)
    ts = args.time_scale
    rules = list(dict.fromkeys(args.rules))
    for name in rules:  # a wrong rule or artifact fails now, not after the first live run
        node_decider(name.removesuffix(HEDGE))
        if name.endswith(HEDGE) and args.run_noise <= 0:
            raise ValueError(f"--rules {name}: hedging needs --run-noise > 0 (no run is late)")
    env, live_cfg = live_settings(nodes, ts, args.speeds)
    out: dict[str, Any] = {"setting": "agents", "nodes": args.nodes, "gpu_load": cfg.gpu_load,
                           "speeds": args.speeds, "run_noise": args.run_noise,
                           "workflows": args.workflows, "time_scale": ts, "runs": []}
    shapes = {nd.name: sum(1 for m in nodes if m.name == nd.name) for nd in nodes}
    print(f"agents live: {args.nodes} nodes {shapes}, GPU load {cfg.gpu_load:g}, "
          f"{args.workflows} requests per run, time_scale {ts:g}, {args.runs} run(s), "
          f"rules {rules} vs {REFERENCE}, node speeds {args.speeds}", flush=True)
    with AgentsCluster(nodes):
        for r in range(args.runs):
            seed = args.seed + r
            reqs = requests(cfg, nodes, args.workflows, seed, args.run_noise)
            row: dict[str, Any] = {"seed": seed, "live": {}, "twin": {}}
            names = [REFERENCE] + rules
            for name in (names if r % 2 == 0 else names[::-1]):  # alternate who runs first
                row["live"][name], row["twin"][name] = _run_rule(
                    name, r, seed, reqs, args, cfg, nodes, env, live_cfg)
            out["runs"].append(row)
        if not args.skip_overhead:
            out["overhead"] = live_overhead(cfg, nodes, args.overhead_requests, args.repeats,
                                            rules[0], args.seed, args.timeout_s)
    if not args.skip_overhead:
        out["overhead"]["decision_only"] = [
            decision_overhead(n, args.overhead_requests * n // args.nodes, args.seed, rules[0],
                              args.agents_config) for n in args.overhead_nodes]
    summarize(out, rules)
    print(format_agents(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


def summarize(out: dict[str, Any], rules: list[str]) -> None:
    """Per rule and run: ``rel_diff_vs_ray_default`` = its mean / Ray default's − 1, live and in
    the twin, the same for p95 live, and the gap between live and twin (points); the means over
    runs in ``rel_diff_vs_ray_default`` and the largest gap in ``max_twin_gap_points``."""
    key, p95 = "mean_workflow_response_model_s", "p95_workflow_response_model_s"
    table, gaps = {}, []
    for name in rules:
        live = [r["live"][name][key] / r["live"][REFERENCE][key] - 1 for r in out["runs"]]
        twin = [r["twin"][name][key] / r["twin"][REFERENCE][key] - 1 for r in out["runs"]]
        p95_live = [r["live"][name][p95] / r["live"][REFERENCE][p95] - 1 for r in out["runs"]]
        gap = max(abs(a - b) for a, b in zip(live, twin)) * 100
        gaps.append(gap)
        table[name] = {"rel_diff_live": live, "rel_diff_twin": twin,
                       "p95_rel_diff_live": p95_live, "twin_gap_points": gap}
    out["rel_diff_vs_ray_default"] = {n: float(np.mean(t["rel_diff_live"]))
                                      for n, t in table.items()}
    out["max_twin_gap_points"] = max(gaps) if gaps else math.nan
    out["table"] = table


def format_agents(out: dict[str, Any]) -> str:
    lines = ["", f"{'policy':12s} {'run':>3s} {'live mean':>9s} {'p95':>7s} {'p99':>7s} "
                 f"{'twin mean':>9s} {'p95':>7s} {'p99':>7s}   (workflow response, model s)"]
    for k, r in enumerate(out["runs"]):
        for name in r["live"]:
            lv, tw = r["live"][name], r["twin"][name]
            lines.append(f"{name:12s} {k + 1:3d} {lv['mean_workflow_response_model_s']:9.2f} "
                         f"{lv['p95_workflow_response_model_s']:7.2f} "
                         f"{lv['p99_workflow_response_model_s']:7.2f} "
                         f"{tw['mean_workflow_response_model_s']:9.2f} "
                         f"{tw['p95_workflow_response_model_s']:7.2f} "
                         f"{tw['p99_workflow_response_model_s']:7.2f}")
            if tw.get("draws", 1) > 1:  # Ray default's random choice (twin_prediction)
                lines.append(f"{'':16s}(twin: the mean of {tw['draws']} draws, sd "
                             f"{tw['sd_mean_workflow_response_model_s']:.2f} a draw)")
    o = out.get("overhead")
    if o:
        lines += ["", f"overhead, a burst of {o['requests']} requests ({o['tasks']} tasks) at once "
                  f"on {out['nodes']} nodes, medians of {o['repeats']}: scheduler "
                  f"({o['rule']}) {o['scheduler_tasks_per_s']:.0f} tasks/s, Ray default "
                  f"{o['ray_default_tasks_per_s']:.0f} (ratio {o['throughput_ratio']:.2f}); "
                  f"scheduler thread CPU {o['scheduler_cpu_ms_per_task']:.2f} ms a task; Ray "
                  f"default's submission CPU {o['ray_default_submit_cpu_ms_per_task']:.2f} ms a "
                  "task (the Ray client calls every run pays)"]
        for d in o.get("decision_only", []):
            lines.append(f"  decision path without Ray at {d['nodes']} nodes ({d['requests']} "
                         f"requests, {d['tasks']} tasks, ready backlog up to "
                         f"{d['max_ready_backlog']}): {d['cpu_ms_per_task']:.3f} ms CPU a task")
    lines.append("")
    for name, t in out["table"].items():
        lines.append(f"{name}: mean vs Ray default live " + " / ".join(
            rel(g) for g in t["rel_diff_live"]) + ", twin " + " / ".join(
            rel(g) for g in t["rel_diff_twin"]) + f"; gap {t['twin_gap_points']:.1f} points; "
            "p95 vs Ray default live " + " / ".join(rel(g) for g in t["p95_rel_diff_live"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------- overhead
OVERHEAD_TS = 0.001  # the burst's time scale: 1 model s of emulated run = 1 ms wall


def live_overhead(cfg: Any, nodes: list[NodeSpec], n_requests: int, repeats: int, rule: str,
                  seed: int, timeout_s: float) -> dict[str, Any]:
    """``n_requests`` agent requests submitted at once (emulated run times at
    :data:`OVERHEAD_TS`), placed by the scheduler (node rule ``rule``) and by Ray default on the
    running cluster, alternated ``repeats`` times; medians. The scheduler's cost is its thread's
    CPU (its own work and the Ray client calls it makes) per task; Ray default's is the CPU of
    the driver's submission (one ``.options().remote()`` per task), what any run pays."""
    rng = np.random.default_rng(seed)
    reqs = [sample_request(cfg, rng) for _ in range(n_requests)]
    tasks = sum(len(r) for r in reqs)
    env, live_cfg = live_settings(nodes, OVERHEAD_TS)
    rows: dict[str, list[float]] = {"ray_tp": [], "ray_cpu": [], "sched_tp": [], "sched_cpu": []}
    for r in range(repeats):
        for name in (REFERENCE, rule) if r % 2 == 0 else (rule, REFERENCE):
            runner = RayDefaultRunner(env, dict(live_cfg)) if name == REFERENCE else \
                LiveScheduler(get_policy("eft"), env, {**live_cfg, "node_rule": rule})
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
            else:
                rows["sched_tp"].append(tasks / wall)
                rows["sched_cpu"].append(1e3 * s["thread_cpu_s"] / max(1, s["tasks_started"]))
        print(f"  overhead round {r + 1}: Ray default {rows['ray_tp'][-1]:.0f} tasks/s, "
              f"{rule} {rows['sched_tp'][-1]:.0f} tasks/s, scheduler CPU "
              f"{rows['sched_cpu'][-1]:.2f} ms a task", flush=True)
    med = {k: float(np.median(v)) for k, v in rows.items()}
    return {"requests": n_requests, "tasks": tasks, "repeats": repeats, "rule": rule,
            "time_scale": OVERHEAD_TS, "ray_default_tasks_per_s": med["ray_tp"],
            "scheduler_tasks_per_s": med["sched_tp"],
            "throughput_ratio": med["sched_tp"] / med["ray_tp"],
            "scheduler_cpu_ms_per_task": med["sched_cpu"],
            "ray_default_submit_cpu_ms_per_task": med["ray_cpu"], "raw": rows}


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
    the ``NodeTable``, the node rule ``rule``) run as live, a start holds the node's resources
    as a run does, and runs end in order of their emulated run time through the scheduler's own
    completion path (``_finish``). Left out: only Ray's part of a run (``.remote()``,
    ``ray.wait``, ``ray.get``), which :func:`live_overhead` measures."""
    cfg = load_agents(read_yaml(resolve_config_path(config)))
    specs = node_specs(cfg, n_nodes)
    rng = np.random.default_rng(seed)
    reqs = [sample_request(cfg, rng) for _ in range(n_requests)]
    env = replace(EnvConfig(), mdp={"transfer_delays_start": False})
    sched = LiveScheduler(get_policy("eft", env), env,
                          LiveConfig(model="nodes", node_rule=rule, time_scale=1.0, hedge="off"))
    sched.nodes.pooled = True  # as the first refresh sets it on plain Ray nodes
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
