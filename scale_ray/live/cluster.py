"""Heterogeneous emulated Ray nodes: how a node advertises its capacity, and a local cluster.

A Ray node is a *scale server node* when its resources contain ``scale_slot`` (the number of
servers it hosts, each running one primitive at a time). Its capacity is read from the node's
custom resources ``scale_compute`` (GFLOP/s per server) and ``scale_memory_gb`` (GB per server),
or, when those are absent, from its labels ``scale.compute`` / ``scale.memory_gb``; the label
``scale.tier`` names its tier. Any Ray cluster whose nodes carry these (a KubeRay worker group, a
fake-autoscaler node type, :class:`LocalHeteroCluster`) can be scheduled by the live scheduler.

:class:`LocalHeteroCluster` starts a real multi-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: one GCS, one raylet per node, its own temp dir and ports) with
the tiers of ``envs.config.ClusterConfig`` (docs/simulator.md). ``servers_per_node`` packs up to that
many servers of one tier into one raylet (a raylet costs ~0.4 GB and ~3 s of start-up on these
machines; see docs/live.md for the measurements). It works where Ray never ran, with and without
``RAY_AUTH_MODE=token`` (:func:`scale_ray.live.raylocal.prepare_local_ray`; it never writes ``~/.ray``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable

from envs.config import ClusterConfig, TierConfig
from envs.nodes import NodeSpec
from .raylocal import prepare_local_ray

log = logging.getLogger(__name__)

SLOT_RESOURCE = "scale_slot"
COMPUTE_RESOURCE = "scale_compute"
MEMORY_RESOURCE = "scale_memory_gb"
TIER_LABEL = "scale.tier"
COMPUTE_LABEL = "scale.compute"
GPU_COMPUTE_LABEL = "scale.gpu_compute"  # an emulated node's speed for GPU work, if it differs
MEMORY_LABEL = "scale.memory_gb"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One live server node as read from Ray (scale resources or, scale_ray.live.discovery, what
    Ray reports)."""
    node_id: str
    slots: int
    compute: float
    memory_gb: float
    tier: str
    idle_w: float = 0.0
    busy_w: float = 0.0
    # what one server offers a task's Ray options: sorted (resource, amount) pairs (CPU, GPU,
    # accelerator_type:*, custom resources; scale_ray.live.discovery.server_caps)
    caps: tuple[tuple[str, float], ...] = ()
    gpu_compute: float = 0.0  # its speed for GPU work (Ray's resource model); 0: ``compute``
    labels: tuple[tuple[str, str], ...] = ()  # its Ray labels (label selectors; nodes model)


def server_spec(node: NodeInfo, whole: bool) -> NodeSpec:
    """A live server as a node of the table (``envs.nodes``): a whole Ray node (``whole``,
    ``LiveConfig.model: nodes``: its Ray resources, memory in GB) or one server of one slot
    (``{slot: 1, memory: M}`` and its share of its node's resources, ``NodeInfo.caps``); its
    speed for every kind of work, labels and power."""
    res = dict(node.caps) | {"memory": node.memory_gb}
    if not whole:
        res["slot"] = 1.0
    return NodeSpec(node.tier, res, node.compute, node.gpu_compute or node.compute, "",
                    dict(node.labels), node.idle_w, node.busy_w)


def run_speed(node: NodeInfo, demands: tuple[tuple[str, float], ...]) -> float:
    """``node``'s speed for a task with ``demands``: GPU work when it asks for a GPU."""
    if node.gpu_compute and any(k == "GPU" and v > 0 for k, v in demands):
        return node.gpu_compute
    return node.compute


def emulated_speed(node: NodeInfo, demands: tuple[tuple[str, float], ...]) -> float:
    """The speed an emulated run on ``node`` really has: the node's ``scale.gpu_compute`` (GPU
    work) or ``scale.compute`` label where Ray reports one (an emulated cluster states its truth
    there, and Ray default's emulated runs read the same labels), else :func:`run_speed`."""
    labels = dict(node.labels)
    gpu = any(k == "GPU" and v > 0 for k, v in demands)
    key = GPU_COMPUTE_LABEL if gpu and GPU_COMPUTE_LABEL in labels else COMPUTE_LABEL
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return run_speed(node, demands)


def node_resources(tier: TierConfig, slots: int) -> dict[str, float]:
    """Custom resources advertising ``slots`` servers of ``tier``."""
    return {SLOT_RESOURCE: float(slots), COMPUTE_RESOURCE: float(tier.compute),
            MEMORY_RESOURCE: float(tier.spec().memory_gb)}


def node_labels(tier: TierConfig) -> dict[str, str]:
    """Labels naming the node's tier and capacity (used by Ray-default placement and tasks)."""
    return {TIER_LABEL: tier.name, COMPUTE_LABEL: f"{tier.compute:g}",
            MEMORY_LABEL: f"{tier.spec().memory_gb:g}"}


def parse_node(raw: dict[str, Any], tiers: Iterable[TierConfig] = ()) -> NodeInfo | None:
    """NodeInfo from one ``ray.nodes()`` entry, or None for a dead or non-server node."""
    if not raw.get("Alive"):
        return None
    res = raw.get("Resources") or {}
    labels = raw.get("Labels") or {}
    slots = int(res.get(SLOT_RESOURCE, 0))
    if slots < 1:
        return None
    try:
        compute = float(res.get(COMPUTE_RESOURCE) or labels.get(COMPUTE_LABEL))
        memory = float(res.get(MEMORY_RESOURCE) or labels.get(MEMORY_LABEL))
    except (TypeError, ValueError):
        log.warning("node %s has %s but no compute/memory capacity; ignored",
                    raw.get("NodeID"), SLOT_RESOURCE)
        return None
    if compute <= 0:
        return None
    tier_name = labels.get(TIER_LABEL, "")
    tier = next((t for t in tiers if t.name == tier_name), None)
    if tier is None:  # no label: the configured tier with this capacity, if any
        tier = next((t for t in tiers if t.compute == compute and t.memory_gb == memory), None)
    return NodeInfo(raw["NodeID"], slots, compute, memory, tier.name if tier else tier_name,
                    tier.idle_w if tier else 0.0, tier.busy_w if tier else 0.0,
                    server_caps(res, slots))


_NOT_CAPS = (SLOT_RESOURCE, COMPUTE_RESOURCE, MEMORY_RESOURCE, "memory", "object_store_memory")


def server_caps(resources: dict[str, Any], slots: int) -> tuple[tuple[str, float], ...]:
    """What one of ``slots`` servers of a node with Ray ``resources`` offers a task's demands:
    the node's amount / slots (``accelerator_type:*`` is a presence marker: kept whole); the
    node's memory is its servers' ``memory_gb``, not a demand here."""
    out = []
    for k, v in resources.items():
        if k in _NOT_CAPS or k.startswith("node:") or not isinstance(v, (int, float)) or v <= 0:
            continue
        out.append((k, float(v) if k.startswith("accelerator_type:") else float(v) / slots))
    return tuple(sorted(out))


def live_nodes(tiers: Iterable[TierConfig] = ()) -> list[NodeInfo]:
    """The alive scale server nodes of the connected Ray cluster (one GCS call)."""
    import ray

    tiers = tuple(tiers)
    out = []
    for raw in ray.nodes():
        info = parse_node(raw, tiers)
        if info is not None:
            out.append(info)
    return out


class LocalHeteroCluster:
    """A real local multi-node Ray cluster with heterogeneous emulated server nodes.

    Args:
        cluster: tiers and the server count N (tier counts by ratio, docs/simulator.md).
        servers_per_node: pack up to this many servers of one tier into one raylet (1: one raylet
            per server, the faithful setting).
        temp_dir: Ray's temp dir for this cluster (default: a fresh short directory under /tmp,
            removed on shutdown).

    Use as a context manager; :meth:`shutdown` stops only this cluster's processes.
    """

    def __init__(self, cluster: ClusterConfig, servers_per_node: int = 1,
                 temp_dir: str | None = None):
        if servers_per_node < 1:
            raise ValueError(f"servers_per_node: {servers_per_node} must be >= 1")
        self.config = cluster
        self.servers_per_node = servers_per_node
        self._own_tmp = temp_dir is None
        # Short path: Ray's unix sockets live below it (108-byte limit).
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="scl_", dir="/tmp")
        self._cluster = None
        self.nodes: list[Any] = []  # ray._private.node.Node handles of server nodes
        self.node_tier: dict[str, str] = {}

    def plan(self) -> list[tuple[TierConfig, int]]:
        """(tier, slots) of each raylet to start."""
        out = []
        for name, count in self.config.tier_counts().items():
            tier = self.config.tier(name)
            while count > 0:
                k = min(count, self.servers_per_node)
                out.append((tier, k))
                count -= k
        return out

    def start(self, progress: bool = False, connect: bool = True) -> "LocalHeteroCluster":
        """Start the head (no servers, hosts the driver) and every server node; connect this
        process (``ray.init``) unless ``connect`` is False."""
        import ray
        from ray.cluster_utils import Cluster

        if connect and ray.is_initialized():
            raise RuntimeError("LocalHeteroCluster.start: this process is already connected to a "
                               "Ray cluster; call ray.shutdown() first")
        t0 = time.perf_counter()
        prepare_local_ray()  # a fresh machine: Ray's address-file dir; a token under token auth
        self._cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "temp_dir": self.temp_dir})
        for tier, slots in self.plan():
            self.add_node(tier.name, slots, wait=False)
        self._cluster.wait_for_nodes()
        if connect:
            ray.init(address=self._cluster.address, include_dashboard=False, log_to_driver=False)
        if progress:
            log.info("local cluster: %d server nodes (%d servers) up in %.1f s (temp dir %s)",
                     len(self.nodes), self.config.servers, time.perf_counter() - t0, self.temp_dir)
        return self

    @property
    def address(self) -> str:
        return self._cluster.address

    @property
    def ray_cluster(self) -> Any:
        """The ``ray.cluster_utils.Cluster`` behind it (None before ``start``, after
        ``shutdown``)."""
        return self._cluster

    def add_node(self, tier: str, slots: int = 1, wait: bool = True) -> str:
        """Start one more server node of ``tier`` with ``slots`` servers; returns its node id."""
        t = self.config.tier(tier)
        node = self._cluster.add_node(wait=wait, num_cpus=slots, resources=node_resources(t, slots),
                                      labels=node_labels(t))
        self.nodes.append(node)
        self.node_tier[node.node_id] = tier
        return node.node_id

    def kill_node(self, node_id: str | None = None) -> str:
        """Kill a server node at once (no drain; its running tasks are lost). Default: the most
        recently started one that is still up. Returns the killed node's id. Its processes get
        SIGKILL, as a crashed node; its dashboard agent first, so that nothing publishes the
        raylet's log tail to every driver (one ``killed node`` line is the caller's to log)."""
        if not self.nodes:
            raise RuntimeError("no server node left to kill")
        node = self.nodes[-1] if node_id is None else next(
            (n for n in self.nodes if n.node_id == node_id), None)
        if node is None:
            raise ValueError(f"node {node_id!r} is not a server node of this cluster")
        self.nodes.remove(node)
        _kill_agents(node)
        self._cluster.remove_node(node, allow_graceful=False)
        return node.node_id

    def shutdown(self) -> None:
        """Disconnect and stop this cluster's processes (only ours)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        if self._own_tmp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalHeteroCluster":
        return self.start() if self._cluster is None else self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _kill_agents(node: Any) -> None:
    """SIGKILL the dashboard and runtime-env agents of ``node`` (children of its raylet, found
    through /proc): the processes that, once their raylet dies, print "Raylet is terminated"
    and the raylet's last log lines to every driver. Nothing happens where /proc or the
    raylet's PID is not there."""
    try:
        raylet = node.all_processes["raylet"][0].process.pid
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except (KeyError, IndexError, AttributeError, OSError):
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != raylet:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if cmd.startswith((b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")) or \
                    b"dashboard/agent.py" in cmd or b"runtime_env/agent/main.py" in cmd:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
