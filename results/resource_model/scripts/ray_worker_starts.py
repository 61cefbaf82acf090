"""Does Ray default wait for worker processes to start? One live run each of Ray default and
`eft_spread` (8 agents nodes, seed 1, N requests, the bench's warm workers) on one fresh cluster;
per run, from Ray's task events and its GCS worker table: the workers that ran its tasks, those
launched during the run, the tasks whose lease waited for a worker launched inside their lease
phase (PENDING_NODE_ASSIGNMENT -> SUBMITTED_TO_WORKER), that phase's total with and without
them, and the most tasks running at once on a node. Then the leases that waited over 0.05
model s: GPU or not, and whether any node had room for the task when it asked (from the runs'
own start and end times); and the same requests' waits (start - ready) in Ray default's twin in
this cluster's tie order. An experiment script (results/resource_model/README.md), ~4 min:

    RAY_TMPDIR=$(mktemp -d) python results/resource_model/scripts/ray_worker_starts.py 60 [rows.json]
"""
import sys
import time
from collections import defaultdict

import numpy as np
import ray
from ray._private.state import state
from ray.core.generated import common_pb2, gcs_pb2

from envs.agents import load_agents, node_specs
from envs.config_files import read_yaml, resolve_config_path
from policies import get_policy
from scale_ray.bench.agents_cluster import CONFIG, AgentsCluster, live_settings, requests
from scale_ray.bench.agents_live import live_run
from scale_ray.live import LiveScheduler
from scale_ray.live.ray_default import RayDefaultRunner

TS = 0.5
S = common_pb2.TaskStatus


def task_events():
    out = {}
    for ev in state._get_all_task_events():
        su = ev.state_updates
        out[ev.task_id] = (dict(su.state_ts_ns), su.node_id, su.worker_id,
                           ev.task_info.name, dict(ev.task_info.required_resources))
    return out


def worker_launches():
    """worker id -> (launch ms, launched ms) for every worker process the GCS knows."""
    out = {}
    for raw in state._connect_and_get_accessor().get_worker_table():
        w = gcs_pb2.WorkerTableData.FromString(raw)
        if w.worker_type == common_pb2.WORKER:
            out[w.worker_address.worker_id] = (w.worker_launch_time_ms, w.worker_launched_time_ms)
    return out


def peak_running(intervals):
    ev = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def report(name, s, evs, launches, t0_ms):
    sched, fresh, workers, per_node = [], [], set(), defaultdict(list)
    for st, node, worker, _, _ in evs.values():
        p, sub, r, f = (st.get(k) for k in (S.PENDING_NODE_ASSIGNMENT, S.SUBMITTED_TO_WORKER,
                                             S.RUNNING, S.FINISHED))
        if None in (p, sub, r, f):
            continue
        workers.add(worker)
        per_node[node].append((r, f))
        w = (sub - p) / 1e9 / TS
        sched.append(w)
        launch = launches.get(worker, (0, 0))[0]
        fresh.append(p / 1e6 - 50 <= launch <= sub / 1e6)  # launched for this lease
    sched, fresh = np.array(sched), np.array(fresh)
    new = sum(1 for w in workers if launches.get(w, (0, 0))[0] >= t0_ms)
    print(f"{name}: mean wf response {s['mean_workflow_response_model_s']:.2f} model s, "
          f"{len(sched)} tasks, {len(workers)} workers ran them, {new} launched during the run")
    print(f"  lease phase: total {sched.sum():.1f} model s, mean {sched.mean():.3f}; "
          f"{int(fresh.sum())} tasks waited for a worker launched in it: "
          f"{sched[fresh].sum():.1f} model s of the total (mean {sched[fresh].mean() if fresh.any() else 0:.3f})")
    print(f"  most tasks running at once per node: "
          f"{sorted(peak_running(v) for v in per_node.values())}")


def dump(evs, ids):
    """The run's tasks as JSON rows: name, demands, node index, the state times (ns)."""
    return [{"name": name, "demands": req, "node": ids.get(node, -1),
             "ts": {S.Name(k): v for k, v in st.items()}}
            for st, node, _, name, req in evs.values()]


def lease_waits(rows, totals):
    """Leases over 0.05 model s in a run's ``dump`` rows: count, total, GPU share, and how many
    asked while some node had room (resources held from grant to finish)."""
    runs = [(r["ts"]["PENDING_NODE_ASSIGNMENT"], r["ts"]["SUBMITTED_TO_WORKER"],
             r["ts"]["FINISHED"], r["node"], r["demands"]) for r in rows
            if all(k in r["ts"] for k in ("PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
                                          "FINISHED"))]
    long = []
    for p, sub, f, node, dem in runs:
        w = (sub - p) / 1e9 / TS
        if w <= 0.05:
            continue
        free = [dict(x) for x in totals]
        for p2, s2, f2, n2, d2 in runs:
            if s2 <= p < f2 and n2 >= 0 and (p2, s2) != (p, sub):
                for k, v in d2.items():
                    free[n2][k] = free[n2].get(k, 0.0) - v
        room = any(all(x.get(k, 0.0) >= v - 1e-9 for k, v in dem.items()) for x in free)
        long.append((w, "GPU" in dem, room))
    a = np.array([w for w, _, _ in long]) if long else np.zeros(0)
    gpu = sum(w for w, g, _ in long if g)
    room = [w for w, _, r in long if r]
    print(f"  leases over 0.05 model s: {len(long)}, total {a.sum():.1f} model s; GPU tasks "
          f"{sum(1 for _, g, _ in long if g)} ({gpu:.1f} s); asked while some node had room: "
          f"{len(room)} ({sum(room):.1f} s)")


def twin_waits(cfg, nodes, reqs, order):
    """Ray default's twin of the same requests in the cluster's tie order: its mean response
    and the total wait (start - ready) of its tasks, GPU tasks apart."""
    from envs import node_sim
    from policies.node_rules import RayHybrid
    ready = {}
    _ready = node_sim._Episode.ready

    def mark(ep, t):
        ready[t.id] = ep.now
        _ready(ep, t)
    node_sim._Episode.ready = mark
    try:
        ep = node_sim.NodeSimulator(cfg, nodes).episode(1, arrivals=reqs)
        ep.policy = RayHybrid(order=order)
        m = ep.run()
    finally:
        node_sim._Episode.ready = _ready
    w = [(t.start - ready[t.id], "GPU" in dict(t.demands)) for t in ep.tasks]
    print(f"  its twin: mean wf response {m['mean_workflow_response_s']:.2f} model s; waits over "
          f"0.05 model s: {sum(1 for x, _ in w if x > 0.05)}, total {sum(x for x, _ in w):.1f} "
          f"model s (GPU tasks {sum(x for x, g in w if g):.1f})")


def main(n, out=None):
    cfg = load_agents(read_yaml(resolve_config_path(CONFIG)))
    nodes = node_specs(cfg, 8)
    env, live_cfg = live_settings(nodes, TS)
    reqs = requests(cfg, nodes, n, 1, 0.0)
    with AgentsCluster(nodes) as cl:
        print(f"warm workers per node: {cl.warm_workers}", flush=True)
        alive = [x for x in ray.nodes() if x["Alive"] and x["Resources"].get("CPU")]
        ids = {bytes.fromhex(x["NodeID"]): i for i, x in enumerate(alive)}
        rows = {"nodes": [x["Resources"] for x in alive], "ids": [x["NodeID"] for x in alive],
                "runs": {}}
        for name in ("ray-default", "eft_spread"):
            before = set(task_events())
            t0_ms = time.time() * 1000
            runner = RayDefaultRunner(env, dict(live_cfg)) if name == "ray-default" else \
                LiveScheduler(get_policy("eft"), env, {**live_cfg, "node_rule": name})
            s = live_run(runner, reqs, TS, 600)
            time.sleep(3)
            evs = {k: v for k, v in task_events().items() if k not in before}
            report(name, s, evs, worker_launches(), t0_ms)
            rows["runs"][name] = dump(evs, ids)
            lease_waits(rows["runs"][name], rows["nodes"])
            if name == "ray-default":
                twin_waits(cfg, nodes, reqs, cl.ray_order)
    ray.shutdown()
    if out:
        import json
        json.dump(rows, open(out, "w"))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60, sys.argv[2] if len(sys.argv) > 2 else None)
