"""Why a workflow is refused at submit (``LiveScheduler.submit``): :func:`check_fits` raises
``NoServers`` / ``Unschedulable`` (``scale_ray.live.config``) with messages that say what is
missing and how to add it."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from envs.node_labels import LABEL_PREFIX
from envs.nodes import NodeTable

from .cluster import node_spec
from .config import LiveConfig, NoServers, Unschedulable

__all__ = ["check_fits", "covers", "no_servers_message", "unmet_message"]


def check_fits(wf: Any, alive: Sequence[Any], tiers: Sequence[Any], cfg: LiveConfig,
               source: str | None, pooled: bool = False) -> None:
    """Refuse a workflow no server could ever run (nothing queued): no server at all
    (:class:`NoServers`), or a task whose memory or Ray demands no server covers
    (:class:`Unschedulable`). With ``autoscale_hints`` a configured tier may still come for
    memory, and nodes for demands, so only memory above every tier is refused. ``source``: where
    the servers come from (``scale`` / ``ray``, ``scale_ray.live.discovery``)."""
    hints = cfg.autoscale_hints
    name = wf.spec.name
    if not alive and not hints:
        raise NoServers(no_servers_message(name, cfg.servers))
    if pooled:  # Ray's resource model: refused only what no node could ever hold, as Ray would
        if not hints:
            table = NodeTable([node_spec(s.node) for s in alive])
            for i, call in enumerate(wf.calls):
                why = table.missing(call.primitive.ray_demands)
                if why is not None:
                    raise Unschedulable(
                        f"workflow {name!r} refused: task {i} ({call.primitive.name!r}) asks for "
                        f"{memory_in_gb(why)}: no node of the cluster could ever run it; add a node that has it "
                        f"or lower the task's Ray options")
        return
    live_max = max((s.node.memory_gb for s in alive), default=0.0)
    # with hints the autoscaler may still add the largest configured tier; without, only the
    # live servers count (and only they are named: the configured tiers may not be this cluster's)
    tier_max = max((t.memory_gb for t in tiers), default=math.inf) if hints else None
    limit = live_max if tier_max is None else tier_max
    for i, call in enumerate(wf.calls):
        prim = call.primitive
        if any(k.startswith(LABEL_PREFIX) for k, _ in prim.demands):
            raise Unschedulable(
                f"workflow {name!r}: task {i} ({prim.name!r}) has a label_selector, which the "
                f"slot model (scale_slot servers) does not place by; plain Ray nodes (live.model: "
                f"nodes) honour it")
        if prim.memory_gb > limit:
            more = "" if tier_max is None else (f", largest tier the autoscaler may add: "
                                                f"{tier_max:g} GB")
            raise Unschedulable(
                f"workflow {name!r}: task {i} ({prim.name!r}) needs memory_gb="
                f"{prim.memory_gb:g}, which fits no server (largest live server: {live_max:g} "
                f"GB{more}); add a node with more memory or lower the task's memory")
        if prim.demands and not hints and not any(
                covers(s.node.caps, prim.demands) and s.node.memory_gb >= prim.memory_gb
                for s in alive):
            raise Unschedulable(unmet_message(name, i, prim.name, prim.demands, alive))


_MEMORY_MOST = re.compile(r"\bmemory=([^ ,)]+) \(the most (.+?) has: ([^)]+)\)")
_MEMORY = re.compile(r"\bmemory=([^ ,)]+)(?! GB)(?=[ ,)]|$)")


def memory_in_gb(why: str) -> str:
    """``envs.nodes.NodeTable.missing``'s reason with the unit of its memory amounts, GB (Ray's
    ``memory`` option, in bytes, / 1e9; ``memory_gb``): ``memory=1099.51 GB (the most any node
    has: 12.29 GB)``."""
    why = _MEMORY_MOST.sub(r"memory=\1 GB (the most \2 has: \3 GB)", why)
    return _MEMORY.sub(r"memory=\1 GB", why)


def covers(caps: Sequence[tuple[str, float]], demands: Sequence[tuple[str, float]]) -> bool:
    """Whether a server's capacities ``caps`` cover ``demands`` (as
    ``envs.decision.ServerTable.eligible``)."""
    have = dict(caps)
    return all(have.get(k, 0.0) >= v - 1e-9 for k, v in demands)


def no_servers_message(name: str, source: str) -> str:
    where = {"scale": "no alive node advertises the scale_slot resource (servers: scale)",
             "ray": "no alive node has a CPU for a server (servers: ray)",
             "auto": "no alive node has scale_slot servers or a CPU for one"}.get(source, source)
    return (f"workflow {name!r} refused: the scheduler has no servers: {where}. Add a node with "
            f"CPUs (`ray start --address HEAD:PORT --num-cpus 4`), try a local heterogeneous "
            f"cluster (`scale-ray cluster up`), or set live.autoscale_hints: true to let "
            f"Ray's autoscaler bring nodes")


def _fmt(demands: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in demands)


def unmet_message(name: str, index: int, task: str, demands: Sequence[tuple[str, float]],
                  alive: Sequence[Any]) -> str:
    """No alive server covers a task's Ray demands: what it asks, what the servers offer."""
    offers: dict[str, str] = {}
    for s in alive:
        n = s.node
        offers.setdefault(n.tier or n.node_id[:12], _fmt(n.caps) or "nothing")
    have = "; ".join(f"{t}: {c}" for t, c in sorted(offers.items())) or "no servers"
    missing = sorted({k for k, v in demands
                      if not any(dict(s.node.caps).get(k, 0.0) >= v - 1e-9 for s in alive)})
    hint = []
    if "GPU" in missing:
        hint.append("add a GPU node (`ray start --address HEAD:PORT --num-gpus 1`)")
    if "CPU" in missing:
        hint.append("give servers more CPUs (fewer live.slots_per_node, or a larger "
                    "live.task_num_cpus) or lower num_cpus")
    other = [k for k in missing if k not in ("GPU", "CPU")]
    if other:
        hint.append(f"add a node with the resource{'s' if len(other) > 1 else ''} "
                    f"{', '.join(other)} (`ray start ... --resources '{{\"{other[0]}\": 1}}'`)")
    return (f"workflow {name!r} refused: task {index} ({task!r}) asks for {_fmt(demands)} (its "
            f"Ray options) per server, and no server offers "
            f"{', '.join(missing) or 'that together with its memory'} (servers per tier offer: "
            f"{have}). To run it, {' or '.join(hint) or 'add such a node'}, or drop the option")
