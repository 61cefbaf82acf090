"""The live side of ``scale-ray bench live --setting agents`` (scale_ray/bench/agents_live.py):
the requests of ``configs/env/agents.yaml`` with their arrival times, the local Ray cluster of
its node shapes (its own temp dir and ports; its nodes' order in Ray's tie-break,
``ray_node_order``) and the settings every run shares.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import numpy as np

from envs.agents import sample_request
from envs.config import EnvConfig, replace
from envs.nodes import NodeSpec
from envs.sim_arrivals import base_rate
from envs.workflow import WorkflowSpec
from policies.heuristics import ray_node_order
from scale_ray.live.cluster import COMPUTE_LABEL, GPU_COMPUTE_LABEL, TIER_LABEL
from scale_ray.live.raylocal import prepare_local_ray
from scale_ray.live.workflow import from_spec

CONFIG = "configs/env/agents.yaml"
REFERENCE = "ray-default"


def requests(env: EnvConfig, n: int, seed: int, noise: float = 0.0
             ) -> list[tuple[float, WorkflowSpec]]:
    """``n`` requests of ``env``'s agents workload and their arrival times (model s) at its
    rate (``workload.gpu_load`` on its cluster); with ``noise``, each call's two run factors
    (a run, a hedged copy) from a stream of their own (the requests stay those without noise),
    carried by the tasks (``TaskSpec.factors``: live and twin alike)."""
    rate = base_rate(env)
    rng = np.random.default_rng(seed)
    noisy = np.random.default_rng([seed, 1])
    t, out = 0.0, []
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        spec = sample_request(env.workload.agents, rng)
        if noise > 0:
            spec = WorkflowSpec(tuple(ts._replace(factors=tuple(
                float(f) for f in noisy.lognormal(-noise * noise / 2, noise, 2)))
                for ts in spec.tasks), spec.name)
        out.append((t, spec))
    return out


def collected(spec: WorkflowSpec, name: str) -> Any:
    """A request as the live runtime's workflow: emulated bodies with the calls' Ray demands
    (``scale_ray.live.workflow.from_spec``)."""
    return from_spec(WorkflowSpec(spec.tasks, name))


def cpuless_head(prefix: str) -> tuple[Any, str]:
    """A local Ray cluster (``ray.cluster_utils.Cluster``) whose head has no CPUs, in a temp
    dir of its own (``/tmp/<prefix>...``): (the cluster, the temp dir)."""
    from ray.cluster_utils import Cluster

    prepare_local_ray()
    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    return Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "temp_dir": temp_dir}), temp_dir


def add_node(cluster: Any, nd: NodeSpec) -> Any:
    """A raylet of ``nd``'s shape on ``cluster`` (logical CPUs, GPUs, memory, an accelerator
    marker, the labels the emulated bodies read their speeds from); not waited for."""
    r = dict(nd.resources)
    labels = {TIER_LABEL: nd.name, COMPUTE_LABEL: f"{nd.cpu_speed:g}"}
    if r.get("GPU"):
        labels[GPU_COMPUTE_LABEL] = f"{nd.gpu_speed:g}"
    return cluster.add_node(
        wait=False, num_cpus=r.get("CPU", 0), num_gpus=r.get("GPU", 0),
        memory=int(r.get("memory", 0) * 1e9), object_store_memory=100 * 10 ** 6,
        resources={f"accelerator_type:{nd.accelerator}": 1} if nd.accelerator else {},
        labels=labels)


def close(cluster: Any, temp_dir: str) -> None:
    """Disconnect this driver, stop ``cluster`` (if started) and remove its temp dir."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


class AgentsCluster:
    """A local Ray cluster of ``nodes`` (logical CPUs, GPUs, memory, an accelerator marker; the
    labels the emulated bodies read their speed from), its own temp dir and ports."""

    def __init__(self, nodes: list[NodeSpec], warm_workers: int = 6):
        if warm_workers < 0:
            raise ValueError(f"--warm-workers: {warm_workers} must be >= 0")
        self.nodes = nodes
        self.warm_workers = warm_workers  # CPU workers started per node before any run
        self._cluster: Any = None
        self.temp_dir = ""
        #: ``nodes``' indices in Ray's tie order of their node ids (``ray_node_order``)
        self.ray_order: list[int] = []

    def __enter__(self) -> "AgentsCluster":
        import ray

        self._cluster, self.temp_dir = cpuless_head("sca_")
        ids = [add_node(self._cluster, nd).node_id for nd in self.nodes]
        self._cluster.wait_for_nodes()
        self.ray_order = ray_node_order(ids)
        ray.init(address=self._cluster.address, include_dashboard=False, log_to_driver=False)
        self.warm(self.warm_workers)
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
        close(self._cluster, self.temp_dir)


def live_settings(env: EnvConfig, nodes: list[NodeSpec], ts: float, speeds: str = "known"
                  ) -> tuple[EnvConfig, dict[str, Any]]:
    """The env and the live config of every run: whole Ray nodes, emulated run times at time
    scale ``ts``, no hedging, ``env``'s order and rules; ``speeds`` ``known``: the nodes' GPU
    speeds relative to their CPU speed configured (``gpu_speeds``), ``learned``: none is (every
    node speed 1) and the run-time estimator learns them per kind and node shape."""
    cfg: dict[str, Any] = {"model": "nodes", "time_scale": ts, "server_compute": 1.0,
                           "hedge": "off"}
    if speeds == "known":
        cfg["gpu_speeds"] = {nd.accelerator: nd.gpu_speed / nd.cpu_speed
                             for nd in nodes if nd.accelerator}
    else:
        cfg["estimator"] = "online"
    return replace(env, mdp={"transfer_delays_start": False}), cfg
