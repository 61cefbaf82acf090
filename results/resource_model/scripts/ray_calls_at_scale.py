"""What Ray's client calls cost a driver thread per task at 8 and at 64 raylets (issue 46's
"scheduler CPU per task at 64 nodes"): one local cluster after the other (4 logical CPUs a
node, its own temp dir), each warmed with one worker a node, then R rounds of one 0.2-s task
pinned to every node (hard node affinity, one cached variant a node, as the live executor
places), completions taken as the live scheduler takes them (``ray.wait(num_returns=1)`` over
every run in flight, then ``ray.get``), plus the node refresh (``ray.nodes()``). Thread CPU,
medians over rounds. An experiment script (results/resource_model/README.md), ~6 min:

    RAY_TMPDIR=$(mktemp -d) python results/resource_model/scripts/ray_calls_at_scale.py 8 64
"""
import statistics
import sys
import tempfile
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scale_ray.live.raylocal import prepare_local_ray

ROUNDS = 5


def available_gb() -> float:
    with open("/proc/meminfo") as f:
        info = {ln.split(":")[0]: int(ln.split()[1]) for ln in f}
    return info["MemAvailable"] / 1e6


def measure(n: int) -> dict:
    t0 = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "temp_dir": tempfile.mkdtemp(prefix="rc_", dir="/tmp")})
    try:
        for _ in range(n):
            c.add_node(wait=False, num_cpus=4, memory=int(16e9), object_store_memory=100 * 10 ** 6)
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        up = time.perf_counter() - t0

        @ray.remote(num_cpus=1, max_retries=0)
        def run(s: float) -> float:
            time.sleep(s)
            return s

        ids = [x["NodeID"] for x in ray.nodes() if x["Alive"] and x["Resources"].get("CPU")]
        # one pinned variant a node, built once (the live executor caches them: `pinned`)
        pins = [run.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False))
                for i in ids]
        ray.get([p.remote(0.0) for p in pins])  # warm
        warm = time.perf_counter() - t0 - up
        print(f"{n} nodes: up in {up:.0f} s, warm in {warm:.0f} s, "
              f"{available_gb():.1f} GB available", flush=True)
        sub, comp, nodes_call = [], [], []
        for _ in range(ROUNDS):
            t = time.thread_time()
            running = {p.remote(0.2): p for p in pins}
            sub.append((time.thread_time() - t) / len(pins))
            t = time.thread_time()
            while running:
                done, _ = ray.wait(list(running), num_returns=1, timeout=10, fetch_local=False)
                for r in done:
                    ray.get(r)
                    running.pop(r)
            comp.append((time.thread_time() - t) / len(pins))
            t = time.thread_time()
            ray.nodes()
            nodes_call.append(time.thread_time() - t)
        return {"nodes": n, "submit_ms": 1e3 * statistics.median(sub),
                "wait_get_ms": 1e3 * statistics.median(comp),
                "ray_nodes_ms": 1e3 * statistics.median(nodes_call), "up_s": up, "warm_s": warm}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


if __name__ == "__main__":
    prepare_local_ray()
    for n in [int(a) for a in sys.argv[1:]] or [8, 64]:
        if available_gb() < 8:
            sys.exit(f"{available_gb():.1f} GB available: {n} raylets need about 8 GB more")
        r = measure(n)
        print(f"{r['nodes']:>4} nodes: thread CPU a task: submit {r['submit_ms']:.3f} ms, "
              f"ray.wait + ray.get {r['wait_get_ms']:.3f} ms (with {r['nodes']} in flight); "
              f"ray.nodes() {r['ray_nodes_ms']:.2f} ms a call", flush=True)
