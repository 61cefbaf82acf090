"""``LiveScheduler.status()``'s answer: the servers, what they run, the queue and the counters
(read on the scheduler thread); its ``load()`` and ``summary()``."""

from __future__ import annotations

from typing import Any

from policies.guard import guard_summary

from .handles import summarize
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
            "running_tasks": len(sched.running), "workflows_pending": sched.pending(),
            "counters": dict(sched.counters)}


def load_of(sched: Any, running: dict) -> dict[str, int]:
    """``LiveScheduler.load``: ready and ``running`` tasks and servers (any thread)."""
    q = sched.placement.queue
    ready = sum(1 for e in list(q.heap) + list(q.blocked) if e[2].state == READY)
    return {"ready_tasks": ready, "running_tasks": len(running),
            "servers": len(sched.alive_servers)}


def summary_of(sched: Any, guard: Any) -> dict[str, Any]:
    """``LiveScheduler.summary``: response-time statistics, the counters, ``guard``'s."""
    out = summarize(sched.handles(), sched.cfg.time_scale)
    out.update(sched.counters)
    out.update(guard_summary(guard))
    out["policy"] = sched.policy.name
    out["servers_alive"] = len(sched.alive_servers)
    out["tasks_per_node"] = dict(sched.completions.node_tasks)
    ts = sched.cfg.time_scale if sched.cfg.time_scale > 0 else 1.0
    lag = sched.completions.run_lag
    runs = sum(v[1] for v in lag.values())
    # model s a run spent outside its worker (Completions.run_lag): mean, and per node mean/max
    out["run_lag_model_s"] = sum(v[0] for v in lag.values()) / runs / ts if runs else 0.0
    out["run_lag_by_node"] = {n: [v[0] / v[1] / ts, v[2] / ts] for n, v in lag.items()}
    if sched.estimator is not None:
        out["estimator"] = sched.estimator.summary()
    return out
