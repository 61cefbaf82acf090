"""The simulator's cluster dynamics (``sim.cluster``, a part the simulator owns and its fork
copies): servers that join, drain and leave, or fail and lose their run, and the slots they take.

:class:`Cluster` owns what only the dynamics use: their random generator (``rng_dynamics``) and
the count of runs lost to failures (``lost``). Its constructor names the simulator's parts it
writes: the per-slot records (``envs.slots.Slots``), the decision core's server table and ready
queue (``envs.decision``), the event queue (``envs.events``) and the hedging part
(``envs.hedging``); it keeps the slots and the server table in step. The simulator builds it
anew at each reset, and a fork's copy (:meth:`Cluster.copy`) is given the fork's parts. The clock and the trace sink
are the simulator's; each call is given them (``t``, ``trace``). The simulator's event loop hands
the server events to :data:`HANDLERS`, which pass them on with its clock and trace sink.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .config import EnvConfig, ServerEventConfig, TierConfig
from .decision import READY, ReadyQueue, ServerTable
from .events import ADD, FAIL, JOIN, LEAVE, REMOVE, EventQueue
from .fork import copy_rng
from .hedging import Hedges
from .slots import Slots

if TYPE_CHECKING:
    from .simulator import Simulator

__all__ = ["Cluster", "HANDLERS"]

Trace = Callable[[dict[str, Any]], None] | None


class Cluster:
    """The servers of one episode that come and go (module docstring)."""

    def __init__(self, cfg: EnvConfig, rng_dynamics: np.random.Generator, slots: Slots,
                 table: ServerTable, queue: ReadyQueue, events: EventQueue,
                 hedges: Hedges) -> None:
        self.cfg = cfg
        self.rng_dynamics = rng_dynamics
        self.slots, self.table, self.queue, self.events, self.hedges = (slots, table, queue,
                                                                        events, hedges)
        self.lost = 0  # runs lost with their server (the task became ready again)

    def copy(self, rng_dynamics: np.random.Generator | None, slots: Slots, table: ServerTable,
             queue: ReadyQueue, events: EventQueue, hedges: Hedges) -> "Cluster":
        """An independent copy writing the fork's parts; ``rng_dynamics``: a generator it may
        take over (its state is overwritten with this one's)."""
        out = Cluster(self.cfg, copy_rng(self.rng_dynamics, rng_dynamics), slots, table, queue,
                      events, hedges)
        out.lost = self.lost
        return out

    def start(self, t: float, trace: Trace) -> None:
        """An episode's first servers (``cluster``) and its server events (``dynamics``)."""
        cfg = self.cfg
        for tier, count in cfg.cluster.tier_counts().items():
            for _ in range(count):
                self.add(cfg.cluster.tier(tier), t, trace)
        for ev in cfg.dynamics.events:
            kind = {"add": ADD, "remove": REMOVE, "fail": FAIL}[ev.kind]
            for _ in range(ev.count):
                self.events.push(ev.t, kind, ev, None)
        d = cfg.dynamics
        if d.join_rate_s > 0:
            self.events.push(self.rng_dynamics.exponential(1 / d.join_rate_s), JOIN, None, None)
        if d.leave_rate_s > 0:
            self.events.push(self.rng_dynamics.exponential(1 / d.leave_rate_s), LEAVE, None, None)

    def add(self, tier: TierConfig, t: float, trace: Trace) -> None:
        """A server of ``tier`` joins now (its failure drawn when failures are on)."""
        slot, sid = self.slots.add(tier)
        self.table.set_server(slot, tier.compute, tier.memory_gb, tier.idle_w, tier.busy_w)
        if trace is not None:
            trace({"t": t, "event": "server_add", "server": sid, "tier": tier.name,
                   "compute": tier.compute, "memory_gb": tier.memory_gb})
        rate = self.cfg.dynamics.fail_rate_per_server_s
        if rate > 0:
            self.events.push(t + self.rng_dynamics.exponential(1 / rate), FAIL, None, sid)
        self.queue.requeue_blocked()  # a task that fit nowhere may fit here

    def drop(self, slot: int, event: str, t: float, trace: Trace) -> None:
        """The server in ``slot`` leaves now (``event``: the trace's name for why)."""
        self.table.clear(slot)
        sid = self.slots.drop(slot)
        if trace is not None:
            trace({"t": t, "event": event, "server": sid})

    def pick(self, ev: ServerEventConfig | None, server: int | None) -> int | None:
        """Slot targeted by a remove/fail: a given id, else a random accepting server (of a tier)."""
        if server is None and ev is not None:
            server = ev.server
        if server is not None:
            return self.slots.slot_of.get(server)  # already gone: nothing to do
        cand = self.slots.present & self.table.accepting
        if ev is not None and ev.tier is not None:
            cand &= np.array([t == ev.tier for t in self.slots.srv_tier])
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return None
        return int(idx[int(self.rng_dynamics.integers(0, idx.size))])

    def fail(self, t: float, trace: Trace, ev: ServerEventConfig | None,
             server: int | None) -> float:
        """A server fails now: its run is lost (a hedged task's other run goes on), its task
        ready again. Returns the server-seconds the lost run had taken (0.0: none)."""
        slot = self.pick(ev, server)
        if slot is None:
            return 0.0
        s = self.slots
        task = s.running[slot]
        sid, tier = int(s.srv_id[slot]), s.srv_tier[slot]
        run_s = 0.0
        if task is not None:
            run_s = t - s.run_start[slot]
            s.running[slot] = None
            self.table.finish(slot)
        if task is not None and task.copy_slot >= 0:  # hedged: only this run is lost
            if slot == task.slot:
                task.slot, task.sid = task.copy_slot, s.sid_l[task.copy_slot]
            task.copy_slot = -1
            self.hedges.lost(run_s)
            if trace is not None:
                trace({"t": t, "event": "cancel", "task": task.id, "server": sid,
                       "reason": "server_fail"})
        elif task is not None:
            task.state, task.slot, task.sid, task.start = READY, -1, -1, math.nan
            self.lost += 1
            if trace is not None:
                trace({"t": t, "event": "lost", "task": task.id, "server": sid})
            self.queue.push(task.key, task.id, task)
        self.drop(slot, "server_fail", t, trace)
        if self.cfg.dynamics.rejoin_after_s is not None:
            self.events.push(t + self.cfg.dynamics.rejoin_after_s, ADD, tier, None)
        return run_s

    def remove(self, t: float, trace: Trace, ev: ServerEventConfig | None,
               server: int | None) -> None:
        """A server leaves: at once when idle, else it drains (its run finishes first)."""
        slot = self.pick(ev, server)
        if slot is None:
            return
        if self.table.busy_l[slot]:
            self.table.set_accepting(slot, False)  # drain: finish the current task first
            if trace is not None:
                trace({"t": t, "event": "server_drain", "server": int(self.slots.srv_id[slot])})
        else:
            self.drop(slot, "server_remove", t, trace)

    def join(self, t: float, trace: Trace) -> None:
        """A random join (``dynamics.join_rate_s``): a server of a tier drawn by ratio, when a
        slot is free; the next join drawn."""
        tiers = self.cfg.cluster.tiers
        w = np.array([tr.ratio for tr in tiers], dtype=float)
        tier = tiers[int(self.rng_dynamics.choice(len(tiers), p=w / w.sum()))]
        if self.slots.count < len(self.slots.present):
            self.add(tier, t, trace)
        self.events.push(t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.join_rate_s),
                         JOIN, None, None)

    def leave(self, t: float, trace: Trace) -> None:
        """A random leave (``dynamics.leave_rate_s``); the next one drawn."""
        self.remove(t, trace, None, None)
        self.events.push(t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.leave_rate_s),
                         LEAVE, None, None)


def _on_fail(sim: "Simulator", ev: ServerEventConfig | None, server: int | None) -> None:
    sim.busy_seconds += sim.cluster.fail(sim.t, sim.trace, ev, server)


def _on_remove(sim: "Simulator", ev: ServerEventConfig | None, server: int | None) -> None:
    sim.cluster.remove(sim.t, sim.trace, ev, server)


def _on_add(sim: "Simulator", ev: ServerEventConfig | str, _: Any) -> None:
    tier = ev if isinstance(ev, str) else ev.tier
    sim.cluster.add(sim.cfg.cluster.tier(tier), sim.t, sim.trace)


def _on_join(sim: "Simulator", _a: Any, _b: Any) -> None:
    sim.cluster.join(sim.t, sim.trace)


def _on_leave(sim: "Simulator", _a: Any, _b: Any) -> None:
    sim.cluster.leave(sim.t, sim.trace)


#: the simulator's handlers of the server events, by kind: ``handler(sim, a, b)``
HANDLERS = {FAIL: _on_fail, REMOVE: _on_remove, ADD: _on_add, JOIN: _on_join, LEAVE: _on_leave}
