"""`scale-ray bench service`: the scheduler service shared by several agent processes, against
Ray's own placement.

On one local heterogeneous multi-node cluster (``--nodes`` servers N, tiers 2:5:1):

1. the scheduler service (``serve_apps.scheduler``, ``--policy``) is deployed with a trace;
2. ``--clients`` separate driver processes (:mod:`scale_ray.bench.service_client`) submit their
   share of one Poisson stream of ``--clients x --workflows`` emulated workflows (offered load
   ``--load``) with ``scale_ray.client.submit``; at ``--kill-at`` of the arrival span the bench
   kills a node that is running a primitive (never the service's own node);
3. the same workload runs under Ray's own placement (``ray-default``) from this process, with
   the same kill: a node of the killed node's tier is added back, and killed at the same model
   time.

``double_booked`` counts server-time overlaps in the service's trace (a start on a server whose
previous run has not finished or been lost). Response times are wall seconds from acceptance to
the last task's completion; ``improvement_vs_ray_default = 1 - service / ray-default`` (mean).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from policies import default_policy
from scale_ray import client
from scale_ray.config import load_env
from scale_ray.live.cluster import LocalHeteroCluster
from scale_ray.live.config import LiveConfig
from scale_ray.live.runner import (arrival_times, make_target, rate_for_load, stream, warm_up,
                                   workload_specs)
from scale_ray.live.workflow import dag_record
from scale_ray.ports import free_port

from .twin import (SETTINGS, add_setting_arguments, compare, format_rows, live_model, predict,
                   resolve_setting, setting_env)

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=16, help="servers N (tiers 2:5:1)")
    p.add_argument("--servers-per-node", type=int, default=4,
                   help="pack up to K same-tier servers into one raylet")
    p.add_argument("--clients", type=int, default=2, help="agent driver processes")
    p.add_argument("--workflows", type=int, default=50, help="workflows per client")
    add_setting_arguments(p, "and (without a kill) the service's policy next to its "
                             "simulator twin")
    p.add_argument("--policy", default=default_policy(), help="the service's policy")
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="kill a busy node at this fraction of the arrival span (< 0: never)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-config", default=None, help="environment YAML (default: paper.yaml)")
    p.add_argument("--timeout", type=float, default=900.0, help="wall s per run")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


# ------------------------------------------------------------------------------- trace checks
def double_booked(events: Iterable[dict]) -> int:
    """Server-time overlaps in a live trace: starts on a server that is still running."""
    running: dict[int, int] = {}  # server -> task
    overlaps = 0
    for ev in events:
        kind = ev.get("event")
        if kind == "start":
            if ev["server"] in running:
                overlaps += 1
            running[ev["server"]] = ev["task"]
        elif kind in ("finish", "lost") and running.get(ev.get("server")) == ev.get("task"):
            del running[ev["server"]]
    return overlaps


def read_trace(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------- the service
class LocalService:
    """A local multi-node cluster with the scheduler service deployed on it (bench and tests).

    ``args``: :class:`serve_apps.scheduler.SchedulerArgs` as a mapping (a ``trace`` file is
    added). ``url`` is the HTTP base; this process is a connected driver."""

    def __init__(self, cluster: LocalHeteroCluster, args: dict[str, Any]):
        self.cluster = cluster
        self.trace_path = str(Path(cluster.temp_dir) / "service-trace.jsonl")
        self.args = {"trace": self.trace_path, **args}
        self.port = 0

    def start(self) -> "LocalService":
        from ray import serve

        self.port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port},
                    proxy_location="HeadOnly")
        self.deploy()
        return self

    def deploy(self, **deployment_options: Any) -> None:
        from ray import serve

        from serve_apps.scheduler import application

        serve.run(application(self.args, logging_config={"enable_access_log": False},
                              **deployment_options), name="scheduler", route_prefix="/")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        from ray import serve

        serve.shutdown()

    def kill_busy_node(self) -> str | None:
        """Kill a node running a primitive now (not the service's node); its id, or None."""
        snap = client.cluster()
        own = {n.node_id for n in self.cluster.nodes}
        busy = [s["node"] for s in snap["servers"]
                if s["busy"] and s["node"] != snap["scheduler_node"] and s["node"] in own]
        if not busy:
            return None
        return self.cluster.kill_node(busy[0])


def client_jobs(specs: list, times: np.ndarray, clients: int, start_epoch: float,
                time_scale: float, workdir: Path) -> list[tuple[Path, Path]]:
    """Round-robin shares of one stream, as the clients' input files; (input, output) paths."""
    out = []
    for c in range(clients):
        job = {"start_epoch": start_epoch, "time_scale": time_scale,
               "workflows": [{"t": float(times[i]), "dag": dag_record(specs[i])}
                             for i in range(c, len(specs), clients)]}
        inp, res = workdir / f"client{c}.json", workdir / f"client{c}.out.json"
        inp.write_text(json.dumps(job))
        out.append((inp, res))
    return out


def spawn_clients(address: str, jobs: list[tuple[Path, Path]], timeout_s: float
                  ) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "scale_ray.bench.service_client",
                              "--address", address, "--input", str(i), "--output", str(o),
                              "--timeout", str(timeout_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, env=dict(os.environ))
            for i, o in jobs]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_service(svc: LocalService, specs: list, times: np.ndarray, args: argparse.Namespace,
                workdir: Path) -> dict[str, Any]:
    ts = args.time_scale
    start = time.time() + 5.0  # the clients connect first
    jobs = client_jobs(specs, times, args.clients, start, ts, workdir)
    procs = spawn_clients(svc.cluster.address, jobs, args.timeout)
    killed = None
    if args.kill_at >= 0:
        kill_wall = start + args.kill_at * float(times[-1]) * (ts or 1.0)
        while killed is None and time.time() < kill_wall + 30 and all(
                p.poll() is None for p in procs):
            if time.time() >= kill_wall:
                killed = svc.kill_busy_node()
                if killed is not None:
                    kill_wall = time.time()  # when it happened
            time.sleep(0.05)
        log.info("killed node %s", killed)
    for p in procs:
        out, _ = p.communicate(timeout=args.timeout + 60)
        if p.returncode != 0:
            raise RuntimeError(f"client exited {p.returncode}:\n{out.decode()[-3000:]}")
    recs = [r for _, o in jobs for r in json.loads(o.read_text())]
    done = [r["response_s"] for r in recs if r["state"] == "completed"]
    lat = [1000 * r["submit_latency_s"] for r in recs]
    events = read_trace(svc.trace_path)
    return {
        "clients": args.clients, "workflows_submitted": len(recs),
        "workflows_completed": len(done), "workflows_failed": len(recs) - len(done),
        "double_booked": double_booked(events),
        "tasks_lost_and_replaced": sum(1 for e in events if e.get("event") == "lost"),
        "mean_workflow_response_s": float(np.mean(done)) if done else float("nan"),
        "p95_workflow_response_s": _pct(done, 95),
        "p99_workflow_response_s": _pct(done, 99),
        "submit_latency_ms": {"p50": _pct(lat, 50), "p99": _pct(lat, 99)},
        "killed_node": killed, "killed_tier": svc.cluster.node_tier.get(killed) if killed else None,
        "kill_model_s": (kill_wall - start) / (ts or 1.0) if killed else None,
    }


def run(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.workflows < 1 or args.nodes < 1:
        raise ValueError("--clients, --workflows and --nodes must be >= 1")
    if args.setting == "realistic":
        if args.env_config is not None:
            raise ValueError("--setting realistic names its env config; drop --env-config")
        args.env_config = SETTINGS["realistic"][0]
        env = setting_env("realistic", args.nodes)
    else:
        env = load_env(args.env_config, [], servers=args.nodes)
    resolve_setting(args)
    live = LiveConfig(time_scale=args.time_scale)
    specs = workload_specs(env, args.clients * args.workflows, args.seed)
    rate = (rate_for_load(env, args.load, specs) if args.load is not None
            else env.workload.arrival_rate_16 * env.cluster.servers / 16.0)
    times = arrival_times(rate, len(specs), args.seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scale-bench-service-") as tmp, \
            LocalHeteroCluster(env.cluster, args.servers_per_node) as cluster:
        log.info("cluster up: %d servers on %d raylets", env.cluster.servers, len(cluster.plan()))
        warm_up(env, live)
        svc = LocalService(cluster, {"policy": args.policy, "env_config": args.env_config,
                                     "live": {"time_scale": args.time_scale}}).start()
        try:
            out = run_service(svc, specs, times, args, Path(tmp))
        finally:
            svc.stop()
        print(f"service ({args.policy}, {args.clients} clients): {out['workflows_completed']}/"
              f"{out['workflows_submitted']} completed, mean {out['mean_workflow_response_s']:.3f}"
              f" s, p95 {out['p95_workflow_response_s']:.3f} s, p99 "
              f"{out['p99_workflow_response_s']:.3f} s, double-booked "
              f"{out['double_booked']}, submit p50 {out['submit_latency_ms']['p50']:.1f} ms "
              f"p99 {out['submit_latency_ms']['p99']:.1f} ms", flush=True)
        # The same scenario: a node of the killed node's tier comes back, and that node is
        # killed at the same model time of the run (a random node would remove other capacity).
        again = (cluster.add_node(cluster.node_tier[out["killed_node"]], args.servers_per_node)
                 if out["killed_node"] else None)
        warm_up(env, live)
        target = make_target("ray-default", env, live, args.seed)
        timer = (threading.Timer(out["kill_model_s"] * (args.time_scale or 1.0),
                                 cluster.kill_node, (again,)) if again else None)
        try:
            if timer is not None:
                timer.start()
            base = stream(target, specs, times, args.time_scale, cluster, (), args.seed,
                          timeout_s=args.timeout)
        finally:
            if timer is not None:
                timer.cancel()
            target.shutdown()
    out.update(policy=args.policy, servers=env.cluster.servers, time_scale=args.time_scale,
               load=args.load, ray_default_mean_workflow_response_s=base["mean_workflow_response_s"],
               ray_default_p95_workflow_response_s=base["p95_workflow_response_s"],
               ray_default_workflows_completed=base["workflows_completed"],
               wall_s=time.perf_counter() - t0)
    out["improvement_vs_ray_default"] = 1.0 - out["mean_workflow_response_s"] / base[
        "mean_workflow_response_s"]
    out["setting"] = args.setting
    if not out["killed_node"]:  # the twin models no kill: only a run without one has a twin
        twin = predict(setting_env(args.setting, args.nodes) if args.setting == "realistic"
                       else env, args.policy, specs, times, args.seed)
        out["twin"] = compare(
            {args.policy: live_model(out, args.time_scale),
             "ray-default": live_model(base, args.time_scale)}, {args.policy: twin},
            reference=args.policy)
        out["twin_error"] = out["twin"][0]["twin_error"]
        print(format_rows(out["twin"], args.policy))
    print(f"ray-default: {base['workflows_completed']}/{base['workflows_submitted']} completed, "
          f"mean {base['mean_workflow_response_s']:.3f} s, p95 "
          f"{base['p95_workflow_response_s']:.3f} s\nservice vs ray-default: "
          f"{100 * out['improvement_vs_ray_default']:+.1f}% (mean workflow response)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = out["workflows_failed"] == 0 and out["double_booked"] == 0
    return 0 if ok else 1
