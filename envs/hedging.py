"""Backup copies of stragglers (The Tail at Scale; MapReduce's backup tasks) in the simulator.

``runtime.hedge`` (``all``: any task; ``marked``: tasks whose spec says ``hedge``; ``off``) and
``runtime.hedge_quantile`` q: when a hedgeable task has run past the q-quantile of its estimated
run time (``RunModel.quantile_s``, an event armed at its start) it is a *straggler*. When a
placement round ends with no ready task to place and an accepting idle server fits a straggler,
a copy of it starts there (the fastest such server; the copy draws its own run time, and pays
the transfer from its parents like any start). The first run to finish completes the task; the
other is cancelled at that instant and its server is free. A server failing under one of the two
runs loses that run only. At most one copy per task; a task that is not hedgeable is never
copied.

Counted in the episode metrics: ``hedge_copies``, ``hedge_wins`` (the copy finished first),
``hedge_copy_server_s`` (server-seconds the copies ran) and ``hedge_waste_server_s`` (those of
the cancelled runs, whichever they were), next to ``busy_server_s``. Traced: the copy's
``start`` has ``"hedge": true``; the cancelled run ends with ``cancel``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from .decision import RUNNING

if TYPE_CHECKING:
    from .episode import TaskRecord
    from .simulator import Simulator

__all__ = ["arm", "on_straggler", "launch", "settle", "lose_one", "metrics", "HEDGE"]

HEDGE = 7  # event kind (after envs.sim_cluster's): a hedgeable run passed its quantile
_FINISH = 0  # envs.sim_cluster.FINISH (that module imports this one)


def arm(sim: "Simulator", task: "TaskRecord", slot: int, exec_start: float) -> None:
    """At a hedgeable task's start: its straggler event at the estimated quantile."""
    rt = sim._rt
    q = rt.quantile_s(task, sim._compute_l[slot], sim.srv_tier[slot], rt.cfg.hedge_quantile)
    sim._seq += 1
    heapq.heappush(sim._events, (exec_start + q, HEDGE, sim._seq, slot, (task.token, task)))


def on_straggler(sim: "Simulator", slot: int, token_task: tuple[int, "TaskRecord"]) -> None:
    token, task = token_task
    if task.token == token and task.state == RUNNING and task.copy_slot < 0:
        sim._stragglers.append((token, task))


def launch(sim: "Simulator") -> None:
    """Nothing is ready to place: start copies of stragglers on idle fitting servers."""
    table = sim.servers
    acc, busy, mem, comp = table.accept_l, table.busy_l, table.memory_l, table.compute_l
    keep = []
    for token, task in sim._stragglers:
        if task.token != token or task.state != RUNNING or task.copy_slot >= 0:
            continue  # finished, lost or already copied
        best, best_c = -1, 0.0
        for s in range(sim.n_slots):
            if acc[s] and not busy[s] and mem[s] >= task.memory_gb and comp[s] > best_c:
                best, best_c = s, comp[s]
        if best < 0:
            keep.append((token, task))  # no idle server fits it now: later
            continue
        _start_copy(sim, task, best)
    sim._stragglers = keep


def _start_copy(sim: "Simulator", task: "TaskRecord", slot: int) -> None:
    t = sim.t
    sid = sim._sid_l[slot]
    estimate, run_s = sim._rt.run_times(task, sim._compute_l[slot], sim.srv_tier[slot], copy=True)
    delay = 0.0
    if sim._transfer_delays:
        delay = max((p.output / sim._bw + sim._lat for p in task.parents if p.sid != sid),
                    default=0.0)
    task.copy_slot = slot
    sim._busy_l[slot] = True
    sim.busy_until[slot] = t + delay + estimate
    sim._feat[slot, 3] = sim._busy_pf_l[slot]
    sim.running[slot] = task
    sim.run_start[slot] = t
    sim.hedge_stats[0] += 1
    sim._seq += 1
    heapq.heappush(sim._events, (t + delay + run_s, _FINISH, sim._seq, slot, (task.token, task)))
    if sim.trace is not None:
        ev = {"t": t, "event": "start", "task": task.id, "server": sid, "hedge": True,
              "estimate_s": estimate, "run_s": run_s}
        if delay:
            ev["transfer_s"] = delay
        sim._emit(ev)


def settle(sim: "Simulator", task: "TaskRecord", slot: int) -> None:
    """``task`` finished on ``slot`` while a copy ran: cancel the other run, free its server;
    the finishing run's server holds the result."""
    other = task.copy_slot if slot != task.copy_slot else task.slot
    won_by_copy = slot == task.copy_slot
    task.copy_slot = -1
    t = sim.t
    st = sim.hedge_stats
    st[1] += won_by_copy
    # copies' server-seconds: the copy's run (finished or cancelled)
    copy_slot = slot if won_by_copy else other
    st[2] += t - sim.run_start[copy_slot]
    st[3] += t - sim.run_start[other]
    sim.busy_seconds += t - sim.run_start[other]
    sim._busy_l[other] = False
    sim._feat[other, 3] = sim._idle_pf_l[other]
    sim.busy_until[other] = t
    sim.running[other] = None
    if won_by_copy:
        task.slot, task.sid = slot, sim._sid_l[slot]
    if sim.trace is not None:
        sim._emit({"t": t, "event": "cancel", "task": task.id, "server": sim._sid_l[other]})
    if sim._present_l[other] and not sim._accept_l[other]:  # draining: leave now
        sim._drop_server(other, "server_remove")


def lose_one(sim: "Simulator", task: "TaskRecord", slot: int) -> None:
    """A server failed under one of ``task``'s two runs: that run is lost, the other goes on."""
    if slot == task.slot:
        task.slot, task.sid = task.copy_slot, sim._sid_l[task.copy_slot]
    task.copy_slot = -1
    sim.busy_seconds += sim.t - sim.run_start[slot]
    sim.hedge_stats[3] += sim.t - sim.run_start[slot]
    sim.running[slot] = None
    sim.servers.finish(slot)
    sim._emit({"t": sim.t, "event": "cancel", "task": task.id, "server": sim._sid_l[slot],
               "reason": "server_fail"})


def metrics(sim: "Simulator") -> dict[str, Any]:
    copies, wins, copy_s, waste_s = sim.hedge_stats
    return {"hedge_copies": int(copies), "hedge_wins": int(wins),
            "hedge_copy_server_s": float(copy_s), "hedge_waste_server_s": float(waste_s)}
