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

from typing import TYPE_CHECKING, Any

from .decision import RUNNING
from .events import FINISH, HEDGE

if TYPE_CHECKING:
    from .episode import TaskRecord

__all__ = ["Hedging"]


class Hedging:
    """The simulator's backup copies (module docstring); a mixin of
    :class:`envs.simulator.Simulator`, whose state it reads and writes."""

    def _hedge_arm(self, task: "TaskRecord", slot: int, exec_start: float) -> None:
        """At a hedgeable task's start: its straggler event at the estimated quantile."""
        rt = self._rt
        q = rt.quantile_s(task, self._compute_l[slot], self.srv_tier[slot], rt.cfg.hedge_quantile)
        self.event_q.push(exec_start + q, HEDGE, slot, (task.token, task))

    def _on_straggler(self, slot: int, token_task: tuple[int, "TaskRecord"]) -> None:
        token, task = token_task
        if task.token == token and task.state == RUNNING and task.copy_slot < 0:
            self._stragglers.append((token, task))

    def _hedge_launch(self) -> None:
        """Nothing is ready to place: start copies of stragglers on idle fitting servers."""
        table = self.servers
        acc, busy, mem, comp = table.accept_l, table.busy_l, table.memory_l, table.compute_l
        keep = []
        for token, task in self._stragglers:
            if task.token != token or task.state != RUNNING or task.copy_slot >= 0:
                continue  # finished, lost or already copied
            best, best_c = -1, 0.0
            for s in range(self.n_slots):
                if acc[s] and not busy[s] and mem[s] >= task.memory_gb and comp[s] > best_c:
                    best, best_c = s, comp[s]
            if best < 0:
                keep.append((token, task))  # no idle server fits it now: later
                continue
            self._hedge_copy(task, best)
        self._stragglers = keep

    def _hedge_copy(self, task: "TaskRecord", slot: int) -> None:
        t = self.t
        sid = self._sid_l[slot]
        estimate, run_s = self._rt.run_times(task, self._compute_l[slot], self.srv_tier[slot],
                                             copy=True)
        delay = 0.0
        if self._transfer_delays:
            delay = max((p.output / self._bw + self._lat for p in task.parents if p.sid != sid),
                        default=0.0)
        task.copy_slot = slot
        self._busy_l[slot] = True
        self.busy_until[slot] = t + delay + estimate
        self._feat[slot, 3] = self._busy_pf_l[slot]
        self.running[slot] = task
        self.run_start[slot] = t
        self.hedge_stats[0] += 1
        self.event_q.push(t + delay + run_s + self._overhead, FINISH, slot, (task.token, task))
        if self.trace is not None:
            ev = {"t": t, "event": "start", "task": task.id, "server": sid, "hedge": True,
                  "estimate_s": estimate, "run_s": run_s}
            if delay:
                ev["transfer_s"] = delay
            self._emit(ev)

    def _hedge_settle(self, task: "TaskRecord", slot: int) -> None:
        """``task`` finished on ``slot`` while a copy ran: cancel the other run, free its server;
        the finishing run's server holds the result."""
        other = task.copy_slot if slot != task.copy_slot else task.slot
        won_by_copy = slot == task.copy_slot
        task.copy_slot = -1
        t = self.t
        st = self.hedge_stats
        st[1] += won_by_copy
        # copies' server-seconds: the copy's run (finished or cancelled)
        copy_slot = slot if won_by_copy else other
        st[2] += t - self.run_start[copy_slot]
        st[3] += t - self.run_start[other]
        self.busy_seconds += t - self.run_start[other]
        self._busy_l[other] = False
        self._feat[other, 3] = self._idle_pf_l[other]
        self.busy_until[other] = t
        self.running[other] = None
        if won_by_copy:
            task.slot, task.sid = slot, self._sid_l[slot]
        if self.trace is not None:
            self._emit({"t": t, "event": "cancel", "task": task.id, "server": self._sid_l[other]})
        if self._present_l[other] and not self._accept_l[other]:  # draining: leave now
            self._drop_server(other, "server_remove")

    def _hedge_lose_one(self, task: "TaskRecord", slot: int) -> None:
        """A server failed under one of ``task``'s two runs: that run is lost, the other goes on."""
        if slot == task.slot:
            task.slot, task.sid = task.copy_slot, self._sid_l[task.copy_slot]
        task.copy_slot = -1
        self.busy_seconds += self.t - self.run_start[slot]
        self.hedge_stats[3] += self.t - self.run_start[slot]
        self.running[slot] = None
        self.servers.finish(slot)
        self._emit({"t": self.t, "event": "cancel", "task": task.id, "server": self._sid_l[slot],
                   "reason": "server_fail"})

    def hedge_metrics(self) -> dict[str, Any]:
        """The episode's hedging counters (module docstring)."""
        copies, wins, copy_s, waste_s = self.hedge_stats
        return {"hedge_copies": int(copies), "hedge_wins": int(wins),
                "hedge_copy_server_s": float(copy_s), "hedge_waste_server_s": float(waste_s)}
