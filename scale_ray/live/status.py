"""``LiveScheduler.status()``'s answer: the servers, what they run, the queue and the counters
(read on the scheduler thread)."""

from __future__ import annotations

from typing import Any

from .tasks import READY


def status_of(sched: Any) -> dict[str, Any]:
    """The live scheduler's status (``LiveScheduler.status``)."""
    q = sched.placement.queue
    servers = []
    for s in sched.alive_servers:
        t = s.task
        servers.append({
            "server": s.sid, "node": s.node.node_id, "slot": s.slot, "tier": s.node.tier,
            "compute": s.node.compute, "memory_gb": s.node.memory_gb,
            "accepting": s.offered, "busy": t is not None, "running": len(s.running),
            "task": None if t is None else {"workflow": t.wf.handle.id, "task": t.idx,
                                            "name": t.prim.name}})
    return {"servers": servers, "policy": sched.policy.name,
            "estimator": None if sched.estimator is None else sched.estimator.summary(),
            "ready_tasks": sum(1 for e in q.heap if e[2].state == READY),
            "set_aside_tasks": sum(1 for e in q.blocked if e[2].state == READY),
            "running_tasks": len(sched._running), "workflows_pending": sched.pending(),
            "counters": dict(sched.counters)}
