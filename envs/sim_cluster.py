"""The simulator's node dynamics (``sim.cluster``, a part the simulator owns and its fork
copies): nodes that join, drain and leave, or fail and lose their runs, and the positions of
the table they take.

:class:`Cluster` owns what only the dynamics use: their random generator (``rng_dynamics``),
the node ids it hands out (``next_id``, ``slot_of``: node id -> position), the nodes present
(``count``) and the runs lost to failures (``lost``). Its constructor names the parts it
writes: the decision core's table and ready queue (``envs.decision``), the event queue
(``envs.events``), the hedging part (``envs.hedging``) and the simulator, whose run bookkeeping
(:meth:`envs.simulator.Simulator.end_run`) a lost run goes through. The clock and the trace sink
are the simulator's; each call is given them (``t``, ``trace``). The simulator's event loop hands
the node events to :data:`HANDLERS`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .accounting import Billing
from .config import EnvConfig, ServerEventConfig, TierConfig
from .decision import READY, ReadyQueue
from .events import ADD, FAIL, JOIN, LEAVE, REMOVE, EventQueue
from .fork import copy_rng
from .hedging import Hedges
from .nodes import NodeTable

if TYPE_CHECKING:
    from .simulator import Simulator

__all__ = ["Cluster", "HANDLERS"]

Trace = Callable[[dict[str, Any]], None] | None


class Cluster:
    """The nodes of one episode that come and go (module docstring)."""

    def __init__(self, cfg: EnvConfig, rng_dynamics: np.random.Generator, table: NodeTable,
                 queue: ReadyQueue, events: EventQueue, hedges: Hedges, sim: "Simulator"
                 ) -> None:
        self.cfg = cfg
        self.rng_dynamics = rng_dynamics
        self.table, self.queue, self.events, self.hedges, self.sim = (table, queue, events,
                                                                      hedges, sim)
        self.slot_of: dict[int, int] = {}  # node id -> position, for the nodes present
        self.next_id = 0
        self.count = 0
        self.lost = 0  # runs lost with their node (the task became ready again)
        #: every node's bill, from its ask to its leaving (envs.accounting)
        self.billing = Billing({t.name: t.price_per_hour for t in cfg.cluster.tiers},
                               cfg.cluster.billing_min_s)
        self.launching: dict[str, list[int]] = {}  # tier -> billing keys of nodes launching
        self.next_launch = 0

    def copy(self, rng_dynamics: np.random.Generator | None, table: NodeTable,
             queue: ReadyQueue, events: EventQueue, hedges: Hedges, sim: "Simulator"
             ) -> "Cluster":
        """An independent copy writing the fork's parts; ``rng_dynamics``: a generator it may
        take over (its state is overwritten with this one's)."""
        out = Cluster(self.cfg, copy_rng(self.rng_dynamics, rng_dynamics), table, queue, events,
                      hedges, sim)
        out.slot_of, out.next_id, out.count, out.lost = (dict(self.slot_of), self.next_id,
                                                         self.count, self.lost)
        out.billing, out.next_launch = self.billing.copy(), self.next_launch
        out.launching = {k: list(v) for k, v in self.launching.items()}
        return out

    def start(self, t: float, trace: Trace) -> None:
        """An episode's first nodes (``cluster``) and its node events (``dynamics``)."""
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

    def launch(self, tier: TierConfig, t: float, delay: float, trace: Trace) -> None:
        """A sizer asks for a node of ``tier`` now: billed from now, it joins ``delay`` s later
        (an ADD event carrying its billing key)."""
        key = ("launch", self.next_launch)
        self.next_launch += 1
        self.billing.start(key, tier.name, t)
        self.launching.setdefault(tier.name, []).append(key)
        self.events.push(t + delay, ADD, tier.name, key)
        if trace is not None:
            trace({"t": t, "event": "server_launch", "tier": tier.name, "joins_at": t + delay})

    def add(self, tier: TierConfig, t: float, trace: Trace, launched: Any = None) -> None:
        """A node of ``tier`` joins now (its failure drawn when failures are on); ``launched``:
        the billing key of the launch it ends (None: billed from now)."""
        slot = self.table.free_position()
        if slot < 0:
            raise RuntimeError(f"no free node position: the observation is padded to "
                               f"{self.table.n} nodes (set env.n_max higher)")
        sid = self.next_id
        self.next_id += 1
        self.table.set_node(slot, tier.spec(), sid)
        self.slot_of[sid] = slot
        self.count += 1
        if launched is not None:
            self.launching[tier.name].remove(launched)
            self.billing.rekey(launched, sid)
        else:
            self.billing.start(sid, tier.name, t)
        if self.sim is not None:
            self.sim.idle_since[slot] = t
        if trace is not None:
            trace({"t": t, "event": "server_add", "server": sid, "tier": tier.name,
                   "compute": tier.compute, "memory_gb": self.table.memory_l[slot]})
        rate = self.cfg.dynamics.fail_rate_per_server_s
        if rate > 0:
            self.events.push(t + self.rng_dynamics.exponential(1 / rate), FAIL, None, sid)
        self.queue.requeue_blocked()  # a task that fit nowhere may fit here

    def drop(self, slot: int, event: str, t: float, trace: Trace) -> None:
        """The node at ``slot`` leaves now (``event``: the trace's name for why)."""
        sid = self.table.ids[slot]
        self.table.clear(slot)
        del self.slot_of[sid]
        self.count -= 1
        self.billing.stop(sid, t)
        if trace is not None:
            trace({"t": t, "event": event, "server": sid})

    def pick(self, ev: ServerEventConfig | None, server: int | None) -> int | None:
        """Position targeted by a remove/fail: a given id, else a random accepting node (of a
        tier)."""
        if server is None and ev is not None:
            server = ev.server
        if server is not None:
            return self.slot_of.get(server)  # already gone: nothing to do
        table = self.table
        cand = np.array(table.accept_l, dtype=bool)
        if ev is not None and ev.tier is not None:
            cand &= np.array([s is not None and s.name == ev.tier for s in table.specs])
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return None
        return int(idx[int(self.rng_dynamics.integers(0, idx.size))])

    def fail(self, t: float, trace: Trace, ev: ServerEventConfig | None,
             server: int | None) -> None:
        """A node fails now: its runs are lost (a hedged task's other run goes on), their tasks
        ready again."""
        slot = self.pick(ev, server)
        if slot is None:
            return
        table, sim = self.table, self.sim
        sid, tier = table.ids[slot], table.specs[slot].name
        for task in list(table.running[slot]):
            copy = slot == task.copy_slot
            started = task.copy_start if copy else task.run_from
            sim.end_run(task, slot, started)
            if task.copy_slot >= 0:  # hedged: only this run is lost
                if not copy:  # the copy's run is the task's now
                    task.slot, task.sid = task.copy_slot, table.ids[task.copy_slot]
                    task.run_from = task.copy_start
                self.hedges.lost(t - started)
                task.copy_slot = -1
                if trace is not None:
                    trace({"t": t, "event": "cancel", "task": task.id, "server": sid,
                           "reason": "server_fail"})
            else:
                task.state, task.slot, task.sid, task.start = READY, -1, -1, math.nan
                self.lost += 1
                if trace is not None:
                    trace({"t": t, "event": "lost", "task": task.id, "server": sid})
                self.queue.push(task.key, task.id, task)
        self.drop(slot, "server_fail", t, trace)
        if self.cfg.dynamics.rejoin_after_s is not None:
            self.events.push(t + self.cfg.dynamics.rejoin_after_s, ADD, tier, None)

    def remove(self, t: float, trace: Trace, ev: ServerEventConfig | None,
               server: int | None) -> None:
        """A node leaves: at once when idle, else it drains (its runs finish first)."""
        slot = self.pick(ev, server)
        if slot is None:
            return
        if self.table.running[slot]:
            self.table.set_accepting(slot, False)  # drain: finish the current runs first
            if trace is not None:
                trace({"t": t, "event": "server_drain", "server": self.table.ids[slot]})
        else:
            self.drop(slot, "server_remove", t, trace)

    def join(self, t: float, trace: Trace) -> None:
        """A random join (``dynamics.join_rate_s``): a node of a tier drawn by ratio, when a
        position is free; the next join drawn."""
        tiers = self.cfg.cluster.tiers
        w = np.array([tr.ratio for tr in tiers], dtype=float)
        tier = tiers[int(self.rng_dynamics.choice(len(tiers), p=w / w.sum()))]
        if self.count < self.table.n:
            self.add(tier, t, trace)
        self.events.push(t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.join_rate_s),
                         JOIN, None, None)

    def leave(self, t: float, trace: Trace) -> None:
        """A random leave (``dynamics.leave_rate_s``); the next one drawn."""
        self.remove(t, trace, None, None)
        self.events.push(t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.leave_rate_s),
                         LEAVE, None, None)


def _on_fail(sim: "Simulator", ev: ServerEventConfig | None, server: int | None) -> None:
    sim.cluster.fail(sim.t, sim.trace, ev, server)


def _on_remove(sim: "Simulator", ev: ServerEventConfig | None, server: int | None) -> None:
    sim.cluster.remove(sim.t, sim.trace, ev, server)


def _on_add(sim: "Simulator", ev: ServerEventConfig | str, launched: Any) -> None:
    tier = ev if isinstance(ev, str) else ev.tier
    sim.cluster.add(sim.cfg.cluster.tier(tier), sim.t, sim.trace, launched)


def _on_join(sim: "Simulator", _a: Any, _b: Any) -> None:
    sim.cluster.join(sim.t, sim.trace)


def _on_leave(sim: "Simulator", _a: Any, _b: Any) -> None:
    sim.cluster.leave(sim.t, sim.trace)


#: the simulator's handlers of the node events, by kind: ``handler(sim, a, b)``
HANDLERS = {FAIL: _on_fail, REMOVE: _on_remove, ADD: _on_add, JOIN: _on_join, LEAVE: _on_leave}
