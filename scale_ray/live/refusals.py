"""Why a workflow is refused at submit: the messages of ``NoServers`` and ``Unschedulable``
(``scale_ray.live.config``), saying what is missing and how to add it."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["covers", "no_servers_message", "unmet_message"]


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
