"""Which servers a Ray cluster offers: its scale server nodes, or every node as Ray reports it.

``LiveConfig.servers``:

* ``scale``: the nodes that advertise ``scale_slot`` (``scale_ray.live.cluster.parse_node``: the
  explicit override, e.g. :class:`~scale_ray.live.cluster.LocalHeteroCluster`, a KubeRay worker
  group with those resources).
* ``ray``: every alive node with CPUs, from what Ray reports (:func:`parse_plain_node`): it hosts
  ``slots_per_node`` servers, else one per ``task_num_cpus`` CPUs; a server's memory is the node's
  Ray ``memory`` / slots; its compute is ``server_compute`` (default: the mean compute of the env's
  tiers, so the policy sees familiar numbers) times its tier's ``tier_speeds`` entry. Nodes of
  the same shape (CPUs, GPUs, accelerator type: ``cpu8``, ``cpu8-gpu1-A100``) form a tier, unless
  the node's ``scale.tier`` label names one.
* ``auto`` (default): ``scale`` when any alive node has ``scale_slot``, else ``ray``. So a laptop's
  local Ray schedules onto its CPUs, and a cluster that declares scale nodes uses only those.

With ``LiveConfig.model: nodes`` (the default for ``ray``), a plain node is one server, the
whole node: its memory is the node's Ray ``memory``, its ``caps`` every resource it has, and it
runs every task whose Ray demands fit what is free (``envs.nodes``).

Every server also carries what it offers a task's Ray options (``NodeInfo.caps``: CPUs, GPUs,
accelerator type and custom resources per server), checked against a task's demands
(``envs.decision.ServerTable.eligible``).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable

from envs.config import TierConfig

from .cluster import NodeInfo, SLOT_RESOURCE, TIER_LABEL, parse_node, server_caps
from .config import LiveConfig, resolved_model

log = logging.getLogger(__name__)

__all__ = ["discover", "parse_plain_node", "node_shape", "default_compute"]


def default_compute(tiers: Iterable[TierConfig]) -> float:
    """The ratio-weighted mean compute of the configured tiers (1.0 without tiers)."""
    tiers = [t for t in tiers if t.ratio > 0] or list(tiers)
    w = sum(t.ratio for t in tiers) or len(tiers)
    if not tiers or w <= 0:
        return 1.0
    return sum(t.compute * (t.ratio if t.ratio > 0 else 1.0) for t in tiers) / w


def node_shape(resources: dict[str, Any]) -> str:
    """A node's shape, the tier name of a plain node: ``cpu8``, ``cpu8-gpu1``,
    ``cpu8-gpu1-A100``."""
    name = f"cpu{float(resources.get('CPU', 0)):g}"
    gpus = float(resources.get("GPU", 0) or 0)
    if gpus > 0:
        name += f"-gpu{gpus:g}"
        acc = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
        if acc:
            name += "-" + acc[0]
    return name


def parse_plain_node(raw: dict[str, Any], cfg: LiveConfig, compute: float,
                     whole: bool = False) -> NodeInfo | None:
    """NodeInfo of an alive node from what Ray reports (module docstring); None for a dead node
    or one with no CPU for a server. ``whole`` (Ray's resource model, ``LiveConfig.model:
    nodes``): one server, the whole node (all its memory and resources)."""
    if not raw.get("Alive"):
        return None
    res = raw.get("Resources") or {}
    if whole:
        if not any(v > 0 for k, v in res.items() if k not in ("memory", "object_store_memory")
                   and not k.startswith("node:") and isinstance(v, (int, float))):
            return None
        labels = raw.get("Labels") or {}
        tier = labels.get(TIER_LABEL) or node_shape(res)
        speed = cfg.tier_speeds.get(tier, 1.0)
        acc = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
        gpu = cfg.gpu_speeds.get(acc[0], 1.0) if acc and res.get("GPU") else 1.0
        base = (cfg.server_compute or compute) * speed
        return NodeInfo(raw["NodeID"], 1, base, float(res.get("memory", 0) or 0) / 1e9, tier,
                        0.0, 0.0, server_caps(res, 1), base * gpu if gpu != 1.0 else 0.0,
                        tuple(sorted((str(k), str(v)) for k, v in labels.items())))
    cpus = float(res.get("CPU", 0) or 0)
    per = cfg.task_num_cpus if cfg.task_num_cpus > 0 else 1.0
    slots = cfg.slots_per_node or int(math.floor(cpus / per + 1e-9))
    if slots < 1 or cpus <= 0:
        return None
    labels = raw.get("Labels") or {}
    tier = labels.get(TIER_LABEL) or node_shape(res)
    speed = cfg.tier_speeds.get(tier, 1.0)
    mem_gb = float(res.get("memory", 0) or 0) / 1e9 / slots
    return NodeInfo(raw["NodeID"], slots, (cfg.server_compute or compute) * speed, mem_gb, tier,
                    0.0, 0.0, server_caps(res, slots))


def discover(raw_nodes: Iterable[dict[str, Any]], tiers: Iterable[TierConfig],
             cfg: LiveConfig) -> tuple[list[NodeInfo], str]:
    """The server nodes among ``ray.nodes()`` entries under ``cfg.servers``, and the source
    used (``scale`` or ``ray``)."""
    tiers = tuple(tiers)
    raw_nodes = [r for r in raw_nodes if r.get("Alive")]
    source = cfg.servers
    if source == "auto":
        source = "scale" if any((r.get("Resources") or {}).get(SLOT_RESOURCE, 0) >= 1
                                for r in raw_nodes) else "ray"
    out = []
    if source == "scale":
        out = [n for n in (parse_node(r, tiers) for r in raw_nodes) if n is not None]
    else:
        compute = default_compute(tiers)
        whole = resolved_model(cfg, "ray") == "nodes"
        out = [n for n in (parse_plain_node(r, cfg, compute, whole) for r in raw_nodes)
               if n is not None]
    return out, source
