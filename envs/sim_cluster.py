"""The simulator's cluster dynamics (a mixin of :class:`envs.simulator.Simulator`): servers
that join, drain and leave, or fail and lose their running task, and the slots they take.
The decision core's server table (``envs.decision.ServerTable``) holds what the rules and the
encoder read, the simulator's ``slots`` (envs.slots) the rest; these methods keep both in step."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import ServerEventConfig, TierConfig
from .decision import READY
from .events import ADD, FAIL, JOIN, LEAVE, REMOVE


class ClusterDynamics:
    """Server events of the simulator (see the module docstring)."""

    @property
    def busy(self) -> np.ndarray:
        """Whether each slot runs a task now, (n_slots,) bool (a copy; the decision loop keeps a
        list)."""
        return np.array(self._busy_l, dtype=bool)

    def _start_cluster(self) -> None:
        """An episode's first servers (``cluster``) and its server events (``dynamics``)."""
        cfg = self.cfg
        for tier, count in cfg.cluster.tier_counts().items():
            for _ in range(count):
                self._add_server(cfg.cluster.tier(tier))
        for ev in cfg.dynamics.events:
            kind = {"add": ADD, "remove": REMOVE, "fail": FAIL}[ev.kind]
            for _ in range(ev.count):
                self.event_q.push(ev.t, kind, ev, None)
        d = cfg.dynamics
        if d.join_rate_s > 0:
            self.event_q.push(self.rng_dynamics.exponential(1 / d.join_rate_s), JOIN, None, None)
        if d.leave_rate_s > 0:
            self.event_q.push(self.rng_dynamics.exponential(1 / d.leave_rate_s), LEAVE, None, None)

    def _add_server(self, tier: TierConfig) -> None:
        slot, sid = self.slots.add(tier)
        self.servers.set_server(slot, tier.compute, tier.memory_gb, tier.idle_w, tier.busy_w)
        self._emit({"t": self.t, "event": "server_add", "server": sid, "tier": tier.name,
                    "compute": tier.compute, "memory_gb": tier.memory_gb})
        if self.cfg.dynamics.fail_rate_per_server_s > 0:
            t_fail = self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.fail_rate_per_server_s)
            self.event_q.push(t_fail, FAIL, None, sid)
        self._queue.requeue_blocked()  # a task that fit nowhere may fit here

    def _drop_server(self, slot: int, event: str) -> None:
        self.servers.clear(slot)
        self._emit({"t": self.t, "event": event, "server": self.slots.drop(slot)})

    def _pick_server(self, ev: ServerEventConfig | None, server: int | None) -> int | None:
        """Slot targeted by a remove/fail: a given id, else a random accepting server (of a tier)."""
        if server is None and ev is not None:
            server = ev.server
        if server is not None:
            return self._slot_of.get(server)  # already gone: nothing to do
        cand = self.present & self.accepting
        if ev is not None and ev.tier is not None:
            cand &= np.array([t == ev.tier for t in self.srv_tier])
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return None
        return int(idx[int(self.rng_dynamics.integers(0, idx.size))])


    def _on_fail(self, ev: ServerEventConfig | None, server: int | None) -> None:
        slot = self._pick_server(ev, server)
        if slot is None:
            return
        task = self.running[slot]
        sid = int(self.srv_id[slot])
        tier = self.srv_tier[slot]
        if task is not None and task.copy_slot >= 0:  # hedged: only this run is lost
            if slot == task.slot:
                task.slot, task.sid = task.copy_slot, self._sid_l[task.copy_slot]
            task.copy_slot = -1
            self.busy_seconds += self.t - self.run_start[slot]
            self.hedges.lost(self.t - self.run_start[slot])
            self.running[slot] = None
            self.servers.finish(slot)
            self._emit({"t": self.t, "event": "cancel", "task": task.id, "server": sid,
                        "reason": "server_fail"})
        elif task is not None:
            self.busy_seconds += self.t - self.run_start[slot]
            task.state = READY
            task.slot = -1
            task.sid = -1
            task.start = math.nan
            self.lost += 1
            self._emit({"t": self.t, "event": "lost", "task": task.id, "server": sid})
            self.running[slot] = None
            self.servers.finish(slot)
            self._make_ready(task)
        self._drop_server(slot, "server_fail")
        if self.cfg.dynamics.rejoin_after_s is not None:
            self.event_q.push(self.t + self.cfg.dynamics.rejoin_after_s, ADD, tier, None)

    def _on_remove(self, ev: ServerEventConfig | None, server: int | None) -> None:
        slot = self._pick_server(ev, server)
        if slot is None:
            return
        if self._busy_l[slot]:
            self.servers.set_accepting(slot, False)  # drain: finish the current task first
            self._emit({"t": self.t, "event": "server_drain", "server": int(self.srv_id[slot])})
        else:
            self._drop_server(slot, "server_remove")

    def _on_add(self, ev: ServerEventConfig | str, _: Any) -> None:
        tier = ev if isinstance(ev, str) else ev.tier
        self._add_server(self.cfg.cluster.tier(tier))

    def _on_join(self, _a: Any, _b: Any) -> None:
        tiers = self.cfg.cluster.tiers
        w = np.array([t.ratio for t in tiers], dtype=float)
        tier = tiers[int(self.rng_dynamics.choice(len(tiers), p=w / w.sum()))]
        if self.slots.count < self.n_slots:
            self._add_server(tier)
        self.event_q.push(self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.join_rate_s),
                   JOIN, None, None)

    def _on_leave(self, _a: Any, _b: Any) -> None:
        self._on_remove(None, None)
        self.event_q.push(self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.leave_rate_s),
                   LEAVE, None, None)
