"""Ray's task events of one live run each of Ray default and `eft_spread` (8 agents nodes, seed
1, N requests): per task, model s from ready-for-args to pending node assignment (args), from
there to submitted to a worker (sched: the lease, waiting for resources), to running (push),
to finished (run). An experiment script (results/resource_model/README.md), ~4 min:

    RAY_TMPDIR=$(mktemp -d) python results/resource_model/scripts/ray_task_phases.py 60
"""
import sys, time, json
import numpy as np
from envs.agents import load_agents, node_specs
from envs.config_files import read_yaml, resolve_config_path
from policies import get_policy
from scale_ray.bench.agents_cluster import CONFIG, AgentsCluster, live_settings, requests
from scale_ray.bench.agents_live import live_run
from scale_ray.live import LiveScheduler
from scale_ray.live.ray_default import RayDefaultRunner
import ray
from ray._private.state import state
from ray.core.generated import common_pb2

TS = 0.5
cfg = load_agents(read_yaml(resolve_config_path(CONFIG)))
nodes = node_specs(cfg, 8)
env, live_cfg = live_settings(nodes, TS)
reqs = requests(cfg, nodes, int(sys.argv[1]) if len(sys.argv) > 1 else 60, 1, 0.0)
S = common_pb2.TaskStatus
def events():
    out = {}
    for ev in state._get_all_task_events():
        st = dict(ev.state_updates.state_ts_ns)
        out[ev.task_id] = (ev.task_info.name, st, ev.state_updates.node_id)
    return out
with AgentsCluster(nodes) as cl:
    res = {}
    for name in ("ray-default", "eft_spread"):
        before = set(events())
        runner = RayDefaultRunner(env, dict(live_cfg)) if name == "ray-default" else \
            LiveScheduler(get_policy("eft"), env, {**live_cfg, "node_rule": name})
        s = live_run(runner, reqs, TS, 600)
        time.sleep(3)
        evs = {k: v for k, v in events().items() if k not in before}
        phases = {"args": [], "sched": [], "push": [], "run": []}
        for tname, st, node in evs.values():
            g = lambda s_: st.get(s_)
            a, p, sub, r, f = g(S.PENDING_ARGS_AVAIL), g(S.PENDING_NODE_ASSIGNMENT), g(S.SUBMITTED_TO_WORKER), g(S.RUNNING), g(S.FINISHED)
            if None in (p, sub, r, f): continue
            if a is not None: phases["args"].append((p - a) / 1e9 / TS)
            phases["sched"].append((sub - p) / 1e9 / TS)
            phases["push"].append((r - sub) / 1e9 / TS)
            phases["run"].append((f - r) / 1e9 / TS)
        print(name, "mean wf response", round(s["mean_workflow_response_model_s"], 2), "tasks", len(evs))
        for k, v in phases.items():
            if v:
                v = np.array(v)
                print(f"  {k:6s} n={len(v)} mean {v.mean():.3f} p50 {np.median(v):.3f} p95 {np.percentile(v,95):.3f} max {v.max():.3f} model s")
