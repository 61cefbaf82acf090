"""Why a workflow is refused at submit (``LiveScheduler.submit``): :func:`check_fits` raises
``NoServers`` / ``Unschedulable`` (``scale_ray.live.config``) with messages that say what is
missing and how to add it."""

from __future__ import annotations

from typing import Any, Sequence

from envs.nodes import NodeTable

from .cluster import server_spec
from .config import LiveConfig, NoServers, Unschedulable

__all__ = ["check_fits", "no_servers_message", "hint_for"]


def check_fits(wf: Any, alive: Sequence[Any], tiers: Sequence[Any], cfg: LiveConfig,
               source: str | None, slotted: bool = True) -> None:
    """Refuse a workflow no server could ever run (nothing queued): no server at all
    (:class:`NoServers`), or a task whose demands on these servers (``slotted``: servers of one
    slot, else whole Ray nodes; ``envs.demands``) no server's totals cover
    (:class:`Unschedulable`, naming the resource, its unit, the most a server has and how to
    add it). With ``autoscale_hints`` Ray's autoscaler may still bring nodes: only memory above
    every configured tier is refused then. ``source``: where the servers come from (``scale`` /
    ``ray``, ``scale_ray.live.discovery``)."""
    hints = cfg.autoscale_hints
    name = wf.spec.name
    if not alive and not hints:
        raise NoServers(no_servers_message(name, cfg.servers))
    if hints:
        limit = max([t.memory_gb or 0.0 for t in tiers] + [s.node.memory_gb for s in alive],
                    default=0.0)
        for i, call in enumerate(wf.calls):
            prim = call.primitive
            if tiers and prim.memory_gb > limit:
                raise Unschedulable(
                    f"workflow {name!r} refused: task {i} ({prim.name!r}) needs memory_gb="
                    f"{prim.memory_gb:g} GB, more than any live server or configured tier has "
                    f"({limit:g} GB); add a node with more memory or lower the task's memory")
        return
    table = NodeTable([server_spec(s.node, not slotted) for s in alive])
    for i, call in enumerate(wf.calls):
        r = call.primitive.request
        why = table.missing(r.on_slot() if slotted else r.on_nodes())
        if why is not None:
            raise Unschedulable(
                f"workflow {name!r} refused: task {i} ({call.primitive.name!r}) asks for {why}: "
                f"no server of the cluster could ever run it; {hint_for(why)}, or lower the "
                f"task's demands")


def hint_for(why: str) -> str:
    """How to add what ``NodeTable.missing`` says is missing."""
    if why.startswith("GPU"):
        return "add a GPU node (`ray start --address HEAD:PORT --num-gpus 1`)"
    if why.startswith("CPU"):
        return ("give servers more CPUs (fewer live.slots_per_node, or a larger "
                "live.task_num_cpus) or add a larger node")
    if why.startswith("memory"):
        return "add a node with more memory"
    if why.startswith("label_selector"):
        return "add a node whose labels match (`ray start ... --labels KEY=VALUE`)"
    name = why.partition("=")[0]
    return f"add a node with the resource (`ray start ... --resources '{{\"{name}\": 1}}'`)"


def no_servers_message(name: str, source: str) -> str:
    where = {"scale": "no alive node advertises the scale_slot resource (servers: scale)",
             "ray": "no alive node has a CPU for a server (servers: ray)",
             "auto": "no alive node has scale_slot servers or a CPU for one"}.get(source, source)
    return (f"workflow {name!r} refused: the scheduler has no servers: {where}. Add a node with "
            f"CPUs (`ray start --address HEAD:PORT --num-cpus 4`), try a local heterogeneous "
            f"cluster (`scale-ray cluster up`), or set live.autoscale_hints: true to let "
            f"Ray's autoscaler bring nodes")
