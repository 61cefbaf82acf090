"""`scale-ray bench service --tenants 2 --flood N`: one tenant floods the scheduler service, the
other keeps submitting small workflows, over HTTP with bearer tokens.

On a local multi-node cluster (``--nodes`` servers, tiers 2:5:1) the service is deployed with two
tenants' tokens (``SCALE_SCHEDULER_TOKENS`` in the replica's environment) and a per-tenant task
quota equal to ``--flood``:

1. **reference**: tenant ``flood`` keeps a small backlog (topped up to a task per server
   whenever fewer are ready) for ``--window-s`` and the decisions per second are measured;
2. **flood**: ``flood`` queues ``--flood`` tasks (workflows of ``--flood-workflow-tasks``
   independent tasks, default 100: 10,000 is one big workflow; its quota
   is ``--flood`` tasks of unfinished workflows), then submits more until one answers 429
   (``accepted_past_flood``: those that fit because its first workflows finished meanwhile);
   the decisions per second over a window under that backlog are measured;
3. **victim**: tenant ``victim`` submits ``--victim-workflows`` one-task workflows, one every
   0.5 s; each one's *wait* is its response minus its emulated run time on the server it ran
   on. It also tries to read and cancel ten of the flood's workflows (each must be a 404), and
   a stranger (a wrong token, none) tries to read one (each must be a 401);
4. the flood is cancelled (``cancel_free_s``: from the last cancel until no server is busy);
   the replica's RSS (``/proc/<pid>/status``, this machine) is read
   before, at peak, and after.

JSON keys: ``victim_wait_s`` (p50, max), ``cross_tenant_reads_refused``,
``cross_tenant_cancels_refused`` (of ``cross_tenant_attempts`` each), ``rejected_429``,
``unauthenticated_refused`` (401s of a wrong and a missing token),
``replica_rss_mb`` (before, peak, after), ``decisions_per_s_under_backlog``,
``decisions_per_s_reference``, ``cancel_free_s``, ``server_free_s`` (the longest emulated flood task: a victim may
wait that long for a server), ``http_5xx``, ``metrics_scraped``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from scale_ray import client
from scale_ray.config import load_env
from scale_ray.live.cluster import LocalHeteroCluster
from serve_apps.scheduler_config import SchedulerTuning
from serve_apps.tenants import TOKENS_VAR

from .localservice import LocalService, scrape_metrics

FLOOD_TASK_GFLOP = 2.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _doc(name: str, tasks: int, gflop: float) -> dict[str, Any]:
    return {"name": name, "tasks": [{"name": f"t{i}", "compute_gflop": gflop}
                                    for i in range(tasks)]}


class _Http:
    """One tenant's HTTP client; counts 5xx answers."""

    def __init__(self, url: str, token: str):
        import httpx

        self.c = httpx.Client(base_url=url, timeout=120,
                              headers={"Authorization": f"Bearer {token}"} if token else {})
        self.errors_5xx = 0

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        r = self.c.request(method, path, **kw)
        if r.status_code >= 500:
            self.errors_5xx += 1
        return r


def _decisions() -> int:
    return int(client.cluster()["counters"]["decisions"])


def run(args: argparse.Namespace) -> int:
    if args.tenants != 2:
        raise ValueError("--tenants: the flood bench runs exactly 2 tenants (flood, victim)")
    per = args.flood_workflow_tasks
    if not 1 <= per <= SchedulerTuning().max_tasks:
        raise ValueError(f"--flood-workflow-tasks: 1 to {SchedulerTuning().max_tasks}, got {per}")
    if args.flood < per:
        raise ValueError(f"--flood: at least --flood-workflow-tasks={per} tasks, got "
                         f"{args.flood}")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
    env = load_env(args.env_config, [], servers=args.nodes)
    ts = args.time_scale if args.time_scale is not None else 0.1
    tokens = {"flood": secrets.token_hex(16), "victim": secrets.token_hex(16)}
    tuning = {**SchedulerTuning().__dict__, "max_queued_tasks_per_tenant": args.flood,
              "max_inflight_per_tenant": args.flood // per + 100}
    min_compute = min(t.compute for t in env.cluster.tiers)
    out: dict[str, Any] = {"servers": env.cluster.servers, "flood_tasks": args.flood,
                           "flood_workflow_tasks": per,
                           "time_scale": ts, "policy": args.policy,
                           "server_free_s": FLOOD_TASK_GFLOP / min_compute * ts}
    t_start = time.perf_counter()
    with LocalHeteroCluster(env.cluster, args.servers_per_node) as cluster:
        svc = LocalService(cluster, {"policy": args.policy, "env_config": args.env_config,
                                     "live": {"time_scale": ts}})
        svc.deploy_options = {"user_config": tuning, "ray_actor_options": {
            "num_cpus": 0, "runtime_env": {"env_vars": {
                TOKENS_VAR: ",".join(f"{k}=sha256:{hashlib.sha256(v.encode()).hexdigest()}"
                                     for k, v in tokens.items())}}}}
        svc.start()
        try:
            out.update(_flood(svc, cluster, args, ts, tokens, env))
        finally:
            svc.stop()
    out["wall_s"] = time.perf_counter() - t_start
    print(f"flood {args.flood} tasks in workflows of {per}: victim wait p50 {out['victim_wait_s']['p50']:.3f} s, max "
          f"{out['victim_wait_s']['max']:.3f} s (a server frees within "
          f"{out['server_free_s']:.2f} s); cross-tenant reads/cancels refused "
          f"{out['cross_tenant_reads_refused']}/{out['cross_tenant_cancels_refused']} of "
          f"{out['cross_tenant_attempts']}; 429s {out['rejected_429']}; decisions/s "
          f"{out['decisions_per_s_under_backlog']:.1f} under the flood vs "
          f"{out['decisions_per_s_reference']:.1f} at a small backlog; replica RSS MB "
          f"{out['replica_rss_mb']}; servers free {out['cancel_free_s']:.2f} s after the flood's "
          f"cancel; 5xx {out['http_5xx']}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = (out["cross_tenant_reads_refused"] == out["cross_tenant_attempts"]
          == out["cross_tenant_cancels_refused"] and out["http_5xx"] == 0
          and out["rejected_429"] >= 1
          and out["unauthenticated_refused"] == out["unauthenticated_attempts"])
    return 0 if ok else 1


def _flood(svc: LocalService, cluster: LocalHeteroCluster, args: argparse.Namespace, ts: float,
           tokens: dict[str, str], env: Any) -> dict[str, Any]:
    flood, victim = _Http(svc.url, tokens["flood"]), _Http(svc.url, tokens["victim"])
    pid = svc.replica_pid()
    rss = {"before": _rss_mb(pid), "peak": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            rss["peak"] = max(rss["peak"], _rss_mb(pid))
    threading.Thread(target=sample, daemon=True).start()
    servers = env.cluster.servers

    ref = _reference_rate(flood, servers, args.window_s)
    flood_ids, rejected_429, accepted_past = _fill(flood, args.flood, args.flood_workflow_tasks)
    queued = client.cluster(tenant="x")["ready_tasks"]
    d0, t0 = _decisions(), time.perf_counter()
    time.sleep(args.window_s)
    under = (_decisions() - d0) / (time.perf_counter() - t0)
    waits, probe, reads, cancels, strangers, unauthenticated = _victim(
        svc, victim, flood_ids, args.victim_workflows, ts)
    cancel_free_s = _cancel_all(flood, flood_ids)
    stop.set()
    rss["after"] = _rss_mb(pid)
    rss["peak"] = max(rss["peak"], rss["after"])
    return {
        "victim_wait_s": {"p50": float(np.percentile(waits, 50)), "max": float(max(waits))},
        "victim_workflows": len(waits), "flood_queued_ready_tasks": queued,
        "accepted_past_flood": accepted_past,
        "cross_tenant_attempts": len(probe), "cross_tenant_reads_refused": reads,
        "cross_tenant_cancels_refused": cancels, "rejected_429": rejected_429,
        "unauthenticated_refused": unauthenticated, "unauthenticated_attempts": len(strangers),
        "replica_rss_mb": {k: round(v, 1) for k, v in rss.items()},
        "decisions_per_s_under_backlog": under, "decisions_per_s_reference": ref,
        "http_5xx": flood.errors_5xx + victim.errors_5xx, "cancel_free_s": cancel_free_s,
        "metrics_scraped": {k: v for k, v in scrape_metrics(
            until=_decisions(), timeout_s=45,
            worker=client.cluster(tenant="x")["scheduler_worker_id"]).items()
            if "_bucket" not in k},
    }


def _reference_rate(flood: "_Http", servers: int, window_s: float) -> float:
    """1. Decisions per second with a small backlog, topped up to two tasks per server."""
    d0, t0, ids = _decisions(), time.perf_counter(), []
    while time.perf_counter() - t0 < window_s:
        if client.cluster(tenant="x")["ready_tasks"] < servers:
            ids.append(flood("POST", "/v1/workflows",
                             json=_doc("ref", servers, FLOOD_TASK_GFLOP)).json()["id"])
        time.sleep(0.05)
    ref = (_decisions() - d0) / (time.perf_counter() - t0)
    for i in ids:
        flood("GET", f"/v1/workflows/{i}", params={"wait_s": 60, "result": False})
    return ref


def _fill(flood: "_Http", n_tasks: int, per: int) -> tuple[list[str], int, int]:
    """2. The flood, then workflows past the quota until the cap answers 429 (the flood's
    first workflows finish meanwhile, so a few more may fit first): (ids, 429s, accepted
    past the flood)."""
    flood_ids = []
    for k in range(n_tasks // per):
        r = flood("POST", "/v1/workflows", json=_doc(f"flood{k}", per, FLOOD_TASK_GFLOP))
        if r.status_code == 201:
            flood_ids.append(r.json()["id"])
    rejected_429 = accepted_past = 0
    for k in range(50):
        over = flood("POST", "/v1/workflows", json=_doc(f"over{k}", per, FLOOD_TASK_GFLOP))
        if over.status_code == 429:
            rejected_429 += 1
            break
        if over.status_code == 201:
            accepted_past += 1
            flood_ids.append(over.json()["id"])
    return flood_ids, rejected_429, accepted_past


def _victim(svc: LocalService, victim: "_Http", flood_ids: list[str], n: int, ts: float):
    """3. The victim's small workflows (their waits), and its reads / cancels of the flood's
    ids and a stranger's, which must be refused."""
    waits, vids = [], []
    for k in range(n):
        r = victim("POST", "/v1/workflows", json=_doc(f"v{k}", 1, 1.0))
        vids.append(r.json()["id"])
        time.sleep(0.5)
    compute = {s["node"]: s["compute"] for s in client.cluster(tenant="x")["servers"]}
    for v in vids:
        rec = victim("GET", f"/v1/workflows/{v}", params={"wait_s": 60}).json()
        t = rec["tasks"][0]
        waits.append(rec["response_s"] - 1.0 / compute[t["node"]] * ts)
    probe = flood_ids[:10]
    reads = sum(victim("GET", f"/v1/workflows/{i}").status_code == 404 for i in probe)
    cancels = sum(victim("DELETE", f"/v1/workflows/{i}").status_code == 404 for i in probe)
    strangers = [_Http(svc.url, "not-a-token-of-anyone"), _Http(svc.url, "")]
    unauthenticated = sum(h("GET", f"/v1/workflows/{probe[0]}").status_code == 401
                          for h in strangers)
    return waits, probe, reads, cancels, strangers, unauthenticated


def _cancel_all(flood: "_Http", flood_ids: list[str]) -> float:
    """4. Cancel the flood and wait until it is gone; the wall s from the last cancel until no
    server is busy."""
    for i in flood_ids:
        flood("DELETE", f"/v1/workflows/{i}")
    t0 = time.perf_counter()
    free_s = float("inf")
    while time.perf_counter() - t0 < 30:
        if not any(s["busy"] for s in client.cluster(tenant="x")["servers"]):
            free_s = time.perf_counter() - t0
            break
        time.sleep(0.02)
    deadline = time.time() + 60
    while client.cluster(tenant="x")["workflows_pending"] and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(3.0)
    return free_s
