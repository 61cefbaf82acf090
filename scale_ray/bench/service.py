"""`scale-ray bench service`: the scheduler service shared by several agent processes, against
Ray's own placement.

On one local heterogeneous multi-node cluster (``--nodes`` servers N, tiers 2:5:1):

1. the scheduler service (``serve_apps.scheduler``, ``--policy``) is deployed with a trace;
2. ``--clients`` separate driver processes (:mod:`scale_ray.bench.service_client`) connect; once
   all have and the service offers every server, they submit their share of one Poisson stream of ``--clients x --workflows`` emulated workflows (offered load
   ``--load``) with ``scale_ray.client.submit``; at ``--kill-at`` of the arrival span the bench
   kills a node that is running a primitive (never the service's own node), and at each
   ``--kill-replica-at`` fraction it ``kill -9``s the service's scheduler actor, which Ray
   restarts and which resumes from its journal (``--storage``; default: a directory of the run);
3. the same workload runs under Ray's own placement (``ray-default``) from this process, with
   the same kill: a node of the killed node's tier is added back, and killed at the same model
   time (``--no-ray-default``: skipped, and with it the twin and every ``ray_default_*`` key).

``double_booked`` counts server-time overlaps in the service's trace (a start on a server whose
previous run has not finished or been lost). ``resume_s``: per replica kill, seconds to the
first placement by its successor; ``tasks_rerun``: tasks started more than once (lost with a
node or a replica); ``workflows_lost``: what a client saw as ``WorkflowLost``;
``--journal-overhead`` adds two calm runs (journal on / off) side by side; ``metrics_scraped``:
the service's metrics as Ray's Prometheus endpoints served them at the end of the run. Response times are wall seconds from acceptance to
the last task's completion; ``rel_diff_vs_ray_default = service / ray-default - 1`` (mean),
with its 95 % interval over workflows; printed only when the comparison is valid
(:mod:`scale_ray.bench.validity`: the service's live / twin ratio, the machine's load).
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
from scale_ray.live.runner import (arrival_times, emulated_runtime, make_target, rate_for_load,
                                   stream, warm_up, with_kinds, workload_specs)
from scale_ray.live.workflow import dag_record
from scale_ray.relative import rel

from . import doors, flood
from .localservice import LocalService, scrape_metrics, successor_steps
from .validity import MachineLoad, check, format_check, gain_line, ratio_interval, twin_ratio
from .twin import (SETTINGS, add_runtime_arguments, add_setting_arguments, compare, format_rows,
                   live_model, predict, resolve_setting, runtime_env, setting_env)

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
    p.add_argument("--kill-replica-at", type=float, nargs="*", default=[], metavar="F",
                   help="kill -9 the service's scheduler actor at these fractions of the "
                        "arrival span (each after the previous one resumed); Ray restarts it "
                        "and it resumes from its journal")
    p.add_argument("--storage", default="session",
                   help="the service's live.storage (its journal): session, off, or a URI")
    p.add_argument("--tenants", type=int, default=None,
                   help="2: the flood bench instead (scale_ray.bench.flood): tenant 'flood' "
                        "queues --flood tasks over HTTP, tenant 'victim' submits one-task "
                        "workflows; waits, cross-tenant refusals, 429s, RSS, decisions/s")
    p.add_argument("--http-doors", type=int, nargs="*", default=[], metavar="D",
                   help="the doors bench instead (scale_ray.bench.doors): HTTP POST/GET "
                        "throughput of the service with each count of doors, e.g. 1 2")
    p.add_argument("--http-requests", type=int, default=2000,
                   help="with --http-doors: requests of each kind per doors count")
    p.add_argument("--http-concurrency", type=int, default=32,
                   help="with --http-doors: requests in flight")
    p.add_argument("--flood", type=int, default=20_000, help="with --tenants: tasks flooded")
    p.add_argument("--flood-workflow-tasks", type=int, default=100,
                   help="with --tenants: tasks per flood workflow (10000: one big workflow)")
    p.add_argument("--victim-workflows", type=int, default=20,
                   help="with --tenants: the victim's one-task workflows (one every 0.5 s)")
    p.add_argument("--window-s", type=float, default=10.0,
                   help="with --tenants: decisions/s are counted over this window")
    p.add_argument("--no-ray-default", action="store_true",
                   help="skip the ray-default reference run (and the twin): the service's run "
                        "alone, e.g. to check replica kills")
    p.add_argument("--fair-share", choices=("on", "off", "both"), default="on",
                   help="the service's live.fair_share (on: as shipped); both: the stream "
                        "through the service twice, fair share off first, each against the "
                        "one ray-default run (fair_share_off in the JSON)")
    p.add_argument("--journal-overhead", action="store_true",
                   help="also run the stream twice without kills, with the journal and with "
                        "storage off, and report submit p50 and mean workflow response of both")
    add_runtime_arguments(p, "the service (emulation and live settings) and ray-default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-config", default=None, help="environment YAML (default: paper.yaml)")
    p.add_argument("--timeout", type=float, default=900.0, help="wall s per run")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


# ------------------------------------------------------------------------------- trace checks
def double_booked(events: Iterable[dict]) -> int:
    """Server-time overlaps in a live trace: starts on a server that is still running (a run
    ends with ``finish``, ``lost`` or ``cancel``: a hedged task's loser, once it returned)."""
    running: dict[tuple, int] = {}  # (scheduler incarnation, server) -> task
    overlaps = 0
    for ev in events:
        kind, srv = ev.get("event"), (ev.get("service"), ev.get("server"))
        if kind == "start":
            if srv in running:
                overlaps += 1
            running[srv] = ev["task"]
        elif kind in ("finish", "lost", "cancel") and running.get(srv) == ev.get("task"):
            del running[srv]
    return overlaps


def resume_times(events: list[dict], kills: list[float]) -> list[float | None]:
    """Per replica kill (wall time): seconds to the first placement by a later incarnation."""
    out = []
    for k in kills:
        before = [e for e in events if e.get("wall", 0) <= k]
        old = before[-1].get("service") if before else None
        first = next((e["wall"] for e in events if e.get("event") == "start"
                      and e.get("wall", 0) > k and e.get("service") != old), None)
        out.append(None if first is None else first - k)
    return out


def reruns(events: Iterable[dict]) -> int:
    """Distinct tasks started more than once (a lost node, a killed replica; a hedged copy is
    not a re-run)."""
    return len({(e.get("workflow_id"), e.get("index")) for e in events
                if e.get("event") == "start" and e.get("attempt", 0) > 0 and not e.get("hedge")})


def read_trace(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def client_jobs(specs: list, times: np.ndarray, clients: int, time_scale: float,
                workdir: Path) -> list[tuple[Path, Path]]:
    """Round-robin shares of one stream, as the clients' input files; (input, output) paths."""
    out = []
    for c in range(clients):
        job = {"time_scale": time_scale,
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


def start_together(svc: LocalService, jobs: list[tuple[Path, Path]], procs: list,
                   timeout_s: float) -> float:
    """The stream's wall-clock start, once every client is connected and the service offers
    every server (its actors answered); written to each client's ``.go`` file. Returns it."""
    t0 = time.monotonic()
    for _, out in jobs:
        ready = Path(str(out) + ".ready")
        while not ready.exists():
            bad = [p.returncode for p in procs if p.poll() is not None]
            if bad or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"a client did not connect (exit codes {bad}, "
                                   f"{time.monotonic() - t0:.0f} s)")
            time.sleep(0.05)
    clients_s = time.monotonic() - t0
    svc.wait_accepting(timeout_s)
    start = time.time() + 1.0
    for inp, _ in jobs:
        Path(str(inp) + ".go").write_text(repr(start))
    log.info("clients connected after %.1f s, every server offered after %.1f s; stream starts",
             clients_s, time.monotonic() - t0)
    return start


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_service(svc: LocalService, specs: list, times: np.ndarray, args: argparse.Namespace,
                workdir: Path) -> dict[str, Any]:
    ts = args.time_scale
    jobs = client_jobs(specs, times, args.clients, ts, workdir)
    procs = spawn_clients(svc.cluster.address, jobs, args.timeout)
    start = start_together(svc, jobs, procs, args.timeout)
    span = float(times[-1]) * (ts or 1.0)
    plan = sorted([(start + f * span, "replica") for f in args.kill_replica_at]
                  + ([(start + args.kill_at * span, "node")] if args.kill_at >= 0 else []))
    killed, kill_wall, replica_kills, steps = None, None, [], []
    for due, what in plan:
        while time.time() < due and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        if what == "replica":
            old = client.cluster()["incarnation"]  # the previous kill's successor answers
            replica_kills.append(svc.kill_replica())
            steps.append(successor_steps(old, replica_kills[-1]))
            log.info("killed the service replica (%d): %s", len(replica_kills), steps[-1])
            continue
        while killed is None and time.time() < due + 30 and all(p.poll() is None for p in procs):
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
    final = client.cluster()
    scraped = scrape_metrics(until=final["counters"]["decisions"],
                             worker=final["scheduler_worker_id"])  # the last replica's series
    events = read_trace(svc.trace_path)
    resume = resume_times(events, replica_kills)
    return {
        "clients": args.clients, "workflows_submitted": len(recs),
        "workflows_completed": len(done), "workflows_failed": len(recs) - len(done),
        "workflows_lost": sum(1 for r in recs if r["state"] == "lost"),
        "replica_kills": len(replica_kills), "resume_s": resume,
        "resume_s_max": max((r for r in resume if r is not None), default=None),
        "resume_steps_s": steps,
        "tasks_rerun": reruns(events), "journal": args.storage,
        "double_booked": double_booked(events),
        "tasks_lost_and_replaced": sum(1 for e in events if e.get("event") == "lost"),
        "mean_workflow_response_s": float(np.mean(done)) if done else float("nan"),
        "workflow_response_s": done,  # per completed workflow (the gain's interval)
        "p95_workflow_response_s": _pct(done, 95),
        "p99_workflow_response_s": _pct(done, 99),
        "submit_latency_ms": {"p50": _pct(lat, 50), "p99": _pct(lat, 99)},
        "killed_node": killed, "killed_tier": svc.cluster.node_tier.get(killed) if killed else None,
        "kill_model_s": (kill_wall - start) / (ts or 1.0) if killed else None,
        # what Ray's Prometheus endpoint served at the end (histogram buckets left out)
        "metrics_scraped": {k: v for k, v in scraped.items() if "_bucket" not in k},
        # hedged copies (live.hedge) and the run-time estimator (live.estimator) at the end
        "hedge": {k: v for k, v in final["counters"].items() if k.startswith("hedge_")
                  or k == "run_s"},
        "estimator": final.get("estimator"),
    }


def service_run(cluster: LocalHeteroCluster, policy: str, env_config: str | None, specs: list,
                times: np.ndarray, args: argparse.Namespace, workdir: Path,
                fair_share: bool | None = None) -> dict[str, Any]:
    """One run of the stream through a freshly deployed service (``args.storage``: its
    journal), with ``args``' kills; ``fair_share``: its live.fair_share (None: as
    ``--fair-share``, on for ``both``)."""
    if fair_share is None:
        fair_share = getattr(args, "fair_share", "on") != "off"
    workdir.mkdir(parents=True, exist_ok=True)
    # a journal of its own per run (a later run on this cluster must not resume this one's)
    storage = str(workdir / "journal") if args.storage == "session" else args.storage
    svc = LocalService(cluster, {
        "policy": policy, "env_config": env_config, "trace": str(workdir / "service-trace.jsonl"),
        # actor_idle_s: no actor is reaped while the clients connect (Ray default's workers
        # are warm too: warm_up); the reaper frees idle CPUs for an autoscaler, not measured here
        "live": {"time_scale": args.time_scale, "storage": storage, "actor_idle_s": 600.0,
                 "estimator": getattr(args, "estimator", "off"),
                 "hedge": getattr(args, "hedge", "off"), "fair_share": fair_share},
        # hint-free and noisy: the documents declare the nominal compute, which the service
        # hides from the scheduler and runs with noise (serve_apps.scheduler_config.Emulation)
        "emulation": {"hints": "none" if getattr(args, "hints", "exact") == "none"
                      else "declared", "noise_sigma": getattr(args, "noise", 0.0)}})
    svc.start()
    try:
        out = run_service(svc, specs, times, args, workdir)
    finally:
        svc.stop()
    out["fair_share"] = fair_share
    print(f"service ({policy}, {args.clients} clients, journal {args.storage}, fair share "
          f"{'on' if fair_share else 'off'}): "
          f"{out['workflows_completed']}/{out['workflows_submitted']} completed, "
          f"{out['workflows_lost']} lost, mean {out['mean_workflow_response_s']:.3f} s, p95 "
          f"{out['p95_workflow_response_s']:.3f} s, p99 {out['p99_workflow_response_s']:.3f} s, "
          f"double-booked {out['double_booked']}, submit p50 "
          f"{out['submit_latency_ms']['p50']:.1f} ms p99 {out['submit_latency_ms']['p99']:.1f} ms"
          + (f", replica kills {out['replica_kills']}, resume_s {out['resume_s']}, tasks rerun "
             f"{out['tasks_rerun']}" if out["replica_kills"] else ""), flush=True)
    return out


def _journal_overhead(cluster, env, live, specs, times, args: argparse.Namespace,
                      tmp: Path) -> dict:
    """The same stream without kills, journal on then off: submit p50 and responses of each."""
    calm = argparse.Namespace(**{**vars(args), "kill_at": -1.0, "kill_replica_at": []})
    side = {}
    for storage in (args.storage if args.storage != "off" else "session", "off"):
        calm.storage = storage
        r = service_run(cluster, args.policy, args.env_config, specs, times, calm,
                        tmp / f"calm-{storage[:8]}")
        side["with" if storage != "off" else "without"] = {
            "storage": storage, "submit_p50_ms": r["submit_latency_ms"]["p50"],
            "mean_workflow_response_s": r["mean_workflow_response_s"],
            "p95_workflow_response_s": r["p95_workflow_response_s"],
            "workflows_completed": r["workflows_completed"]}
        warm_up(env, live)
    return side


def _ray_default(cluster, env, live, base_specs, times, out: dict,
                 args: argparse.Namespace) -> dict:
    """Ray's own placement on the same stream and the same scenario: a node of the killed
    node's tier comes back, and that node is killed at the same model time of the run (a random
    node would remove other capacity)."""
    again = (cluster.add_node(cluster.node_tier[out["killed_node"]], args.servers_per_node)
             if out["killed_node"] else None)
    warm_up(env, live)
    target = make_target("ray-default", env, live, args.seed)
    timer = (threading.Timer(out["kill_model_s"] * (args.time_scale or 1.0),
                             cluster.kill_node, (again,)) if again else None)
    try:
        if timer is not None:
            timer.start()
        stats = stream(target, base_specs, times, args.time_scale, cluster, (), args.seed,
                       timeout_s=args.timeout)
        stats["workflow_response_s"] = [h.response_s for h in target.handles()
                                        if h.response_s is not None]
        return stats
    finally:
        if timer is not None:
            timer.cancel()
        target.shutdown()


def _against_ray_default(out: dict, base: dict, env, specs, times,
                         args: argparse.Namespace, load: MachineLoad) -> None:
    """The reference run's numbers, the service's relation to them with its spread over
    workflows, and (without a kill) the simulator twin, into ``out``; the comparison printed,
    or marked invalid (``scale_ray.bench.validity``: the service's live / twin ratio, the
    machine's load)."""
    out.update({f"ray_default_{k}": base[k] for k in (
        "mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s",
        "workflows_completed")})
    out["rel_diff_vs_ray_default"] = out["mean_workflow_response_s"] / base[
        "mean_workflow_response_s"] - 1.0
    out["rel_diff_interval"] = ratio_interval(out["workflow_response_s"],
                                              base["workflow_response_s"], args.seed)
    ratios: dict[str, float | None] = {args.policy: None, "ray-default": None}
    if not out["killed_node"]:  # the twin models no kill: only a run without one has a twin
        _add_twin(out, base, env, specs, times, args)
        row = out["twin"][0]
        ratios[args.policy] = twin_ratio(row["live_mean_workflow_response_s"],
                                         row.get("twin_mean_workflow_response_s"))
    out["validity"] = check(ratios, load)
    print(f"ray-default: {base['workflows_completed']}/{base['workflows_submitted']} completed, "
          f"mean {base['mean_workflow_response_s']:.3f} s, p95 "
          f"{base['p95_workflow_response_s']:.3f} s\n{format_check(out['validity'])}\n"
          + gain_line("service vs ray-default, mean workflow response",
                      out["rel_diff_vs_ray_default"], out["validity"], out["rel_diff_interval"]))


def _fair_off(out: dict, off: dict, base: dict | None, args: argparse.Namespace) -> None:
    """``--fair-share both``: the fair-share-off run's numbers (and its relation to the same
    ray-default run) into ``out["fair_share_off"]``, printed next to the fair-share run's."""
    keep = ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s",
            "workflows_completed", "workflows_submitted", "double_booked", "killed_node")
    row = {k: off.get(k) for k in keep}
    if base is not None:
        row["rel_diff_vs_ray_default"] = off["mean_workflow_response_s"] / base[
            "mean_workflow_response_s"] - 1.0
        row["rel_diff_interval"] = ratio_interval(off["workflow_response_s"],
                                                  base["workflow_response_s"], args.seed)
    out["fair_share_off"] = row
    if base is not None:
        on_d, off_d = out["rel_diff_vs_ray_default"], row["rel_diff_vs_ray_default"]
        print(f"mean vs ray-default: fair share on {rel(on_d)} "
              f"({out['mean_workflow_response_s']:.3f} s), off {rel(off_d)} "
              f"({off['mean_workflow_response_s']:.3f} s); the fair share costs "
              f"{100 * (on_d - off_d):.1f} points (on - off)", flush=True)


def _add_twin(out: dict, base: dict, env, specs, times, args: argparse.Namespace) -> None:
    """The simulator twin's prediction of the same arrivals next to the live numbers."""
    twin = predict(runtime_env(setting_env(args.setting, args.nodes)
                               if args.setting == "realistic" else env, args),
                   args.policy, specs, times, args.seed)
    out["twin"] = compare(
        {args.policy: live_model(out, args.time_scale),
         "ray-default": live_model(base, args.time_scale)}, {args.policy: twin},
        reference=args.policy)
    out["twin_error"] = out["twin"][0]["twin_error"]
    print(format_rows(out["twin"], args.policy))


def _checked_env(args: argparse.Namespace):
    """The run's env config (``--setting`` or ``--env-config``), the arguments checked."""
    if args.clients < 1 or args.workflows < 1 or args.nodes < 1:
        raise ValueError("--clients, --workflows and --nodes must be >= 1")
    if getattr(args, "fair_share", "on") == "both" and (args.kill_at >= 0 or args.kill_replica_at):
        raise ValueError("--fair-share both: the two service runs must see the same cluster; "
                         "use --kill-at -1 and no --kill-replica-at")
    if any(not 0 <= f < 1 for f in args.kill_replica_at):
        raise ValueError(f"--kill-replica-at: fractions in [0, 1), got {args.kill_replica_at}")
    if args.setting == "realistic":
        if args.env_config is not None:
            raise ValueError("--setting realistic names its env config; drop --env-config")
        args.env_config = SETTINGS["realistic"][0]
        env = setting_env("realistic", args.nodes)
    else:
        env = load_env(args.env_config, [], servers=args.nodes)
    resolve_setting(args)
    return env


def run(args: argparse.Namespace) -> int:
    if args.tenants is not None:
        return flood.run(args)
    if args.http_doors:
        return doors.run(args)
    env = _checked_env(args)
    runtime_env(env, args)  # a bad --noise fails before a cluster starts
    live = LiveConfig(time_scale=args.time_scale)
    # the documents name each task's kind (as the simulator's run-time model does): the
    # service's estimator learns per kind, and a task named t3 says nothing of its primitive
    specs = with_kinds(env, workload_specs(env, args.clients * args.workflows, args.seed))
    # ray-default runs the same noise (its own draws; it never sees hints)
    base_specs = (emulated_runtime(env, specs, "exact", args.noise, args.seed)
                  if args.noise > 0 else specs)
    rate = (rate_for_load(env, args.load, specs) if args.load is not None
            else env.workload.arrival_rate_16 * env.cluster.servers / 16.0)
    times = arrival_times(rate, len(specs), args.seed)
    t0 = time.perf_counter()
    load = MachineLoad()  # sampled after each arm (scale_ray.bench.validity)
    with tempfile.TemporaryDirectory(prefix="scale-bench-service-") as tmp, \
            LocalHeteroCluster(env.cluster, args.servers_per_node) as cluster:
        log.info("cluster up: %d servers on %d raylets", env.cluster.servers, len(cluster.plan()))
        warm_up(env, live)
        side = _journal_overhead(cluster, env, live, specs, times, args, Path(tmp)) \
            if args.journal_overhead else None
        off = None
        if args.fair_share == "both":  # the same stream, fair share off, first
            off = service_run(cluster, args.policy, args.env_config, specs, times, args,
                              Path(tmp) / "fair-off", fair_share=False)
            load.sample()
        out = service_run(cluster, args.policy, args.env_config, specs, times, args, Path(tmp))
        load.sample()
        if args.journal_overhead:
            out["journal_overhead"] = side
            print("journal overhead (no kills): " + "; ".join(
                f"{k} ({v['storage']}): submit p50 {v['submit_p50_ms']:.1f} ms, mean "
                f"{v['mean_workflow_response_s']:.3f} s" for k, v in side.items()), flush=True)
        base = (None if args.no_ray_default
                else _ray_default(cluster, env, live, base_specs, times, out, args))
        load.sample()
    out.update(policy=args.policy, servers=env.cluster.servers, time_scale=args.time_scale,
               load=args.load, hints=args.hints, noise=args.noise, estimator_mode=args.estimator,
               hedge_mode=args.hedge, setting=args.setting, wall_s=time.perf_counter() - t0)
    if base is not None:
        _against_ray_default(out, base, env, specs, times, args, load)
    if off is not None:
        _fair_off(out, off, base, args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = out["workflows_failed"] == 0 and out["double_booked"] == 0 and out["workflows_lost"] == 0
    return 0 if ok else 1
