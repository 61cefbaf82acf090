"""Backup copies of stragglers (The Tail at Scale; MapReduce's backup tasks) in the simulator.

``runtime.hedge`` (``all``: any task; ``marked``: tasks whose spec says ``hedge``; ``off``) and
``runtime.hedge_quantile`` q: when a hedgeable task has run past the q-quantile of its estimated
run time (``RunModel.quantile_s``, an event armed at its start) it is a *straggler*. When a
placement round ends with no ready task to place and another node where it fits now exists, a
copy of it starts there (the fastest such node, the lowest on a tie; the copy draws its own run
time, and pays the transfer from its parents like any start). The first run to finish completes
the task; the other is cancelled at that instant and frees its resources. A node failing under
one of the two runs loses that run only. At most one copy per task; a task that is not
hedgeable is never copied.

Counted in the episode metrics: ``hedge_copies``, ``hedge_wins`` (the copy finished first),
``hedge_copy_server_s`` (server-seconds the copies ran) and ``hedge_waste_server_s`` (those of
the cancelled runs, whichever they were), next to ``busy_server_s``. Traced: the copy's
``start`` has ``"hedge": true``; the cancelled run ends with ``cancel``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .decision import DONE, RUNNING
from .events import HEDGE

if TYPE_CHECKING:
    from .episode import TaskRecord
    from .nodes import NodeTable
    from .run_model import RunModel
    from .simulator import Simulator

__all__ = ["HANDLERS", "Hedges"]


class Hedges:
    """The simulator's backup copies (module docstring; ``sim.hedges``, a part its fork copies):
    the stragglers not yet copied and the counters. The simulator starts the runs; this part
    decides when a run is a straggler and where its copy goes, and cancels the run that loses
    (:meth:`settle`, in the slots and the server table it is given)."""

    def __init__(self, rt: "RunModel") -> None:
        self.rt = rt
        self.stragglers: list[tuple[int, "TaskRecord"]] = []  # (token, task) past the quantile
        self.stats = [0, 0, 0.0, 0.0]  # copies, copy wins, copy server-s, wasted server-s

    def due(self, task: "TaskRecord", compute: float, tier: str, exec_start: float) -> float:
        """When a hedgeable run started at ``exec_start`` on a server of ``compute`` and ``tier``
        becomes a straggler: the estimated ``hedge_quantile`` of its run time."""
        rt = self.rt
        return exec_start + rt.quantile_s(task, compute, tier, rt.cfg.hedge_quantile)

    def seen(self, token: int, task: "TaskRecord") -> None:
        """Its straggler event fired: still the same run, and not yet copied, it waits for a
        server."""
        if task.token == token and task.state == RUNNING and task.copy_slot < 0:
            self.stragglers.append((token, task))

    def launch(self, table: "NodeTable", start_copy: Callable[["TaskRecord", int], None]
               ) -> None:
        """Nothing is ready to place: each straggler, in the order seen, gets a copy on the
        fastest other node where it fits now, the lowest on a tie (``start_copy(task, node)``;
        it then holds its demands there); one that fits none waits for the next time."""
        keep = []
        for token, task in self.stragglers:
            if task.token != token or task.state != RUNNING or task.copy_slot >= 0:
                continue  # finished, lost or already copied
            best, best_c = -1, 0.0
            for s in table.fitting(task.demands):
                c = table.speed(s, task.demands)
                if s != task.slot and c > best_c:
                    best, best_c = s, c
            if best < 0:
                keep.append((token, task))  # no node fits it now: later
                continue
            self.stats[0] += 1
            start_copy(task, best)
        self.stragglers = keep

    def settle(self, task: "TaskRecord", slot: int, t: float, sim: "Simulator") -> int:
        """Hedged ``task`` finished on ``slot`` at ``t`` while its other run went on: that run is
        cancelled and its resources freed (``sim.end_run``); the finishing run's node holds the
        result. Returns the cancelled run's node."""
        won_by_copy = slot == task.copy_slot
        other = task.copy_slot if not won_by_copy else task.slot
        other_start = task.run_from if won_by_copy else task.copy_start
        copy_s = t - (task.copy_start if won_by_copy else other_start)
        task.copy_slot = -1
        self.settled(won_by_copy, copy_s, t - other_start)
        sim.end_run(task, other, other_start)
        ids = sim.table.ids
        if won_by_copy:
            task.slot, task.sid, task.run_from = slot, ids[slot], task.copy_start
        if sim.trace is not None:
            sim.trace({"t": t, "event": "cancel", "task": task.id, "server": ids[other]})
        return other

    def settled(self, won_by_copy: bool, copy_s: float, cancelled_s: float) -> None:
        """A hedged task finished: the copy's run lasted ``copy_s``, the cancelled run
        ``cancelled_s`` server-seconds."""
        st = self.stats
        st[1] += won_by_copy
        st[2] += copy_s
        st[3] += cancelled_s

    def lost(self, run_s: float) -> None:
        """One of a hedged task's two runs was lost with its server after ``run_s`` s."""
        self.stats[3] += run_s

    def metrics(self) -> dict[str, Any]:
        """The episode's hedging counters (module docstring)."""
        copies, wins, copy_s, waste_s = self.stats
        return {"hedge_copies": int(copies), "hedge_wins": int(wins),
                "hedge_copy_server_s": float(copy_s), "hedge_waste_server_s": float(waste_s)}

    def copy(self, task: Callable[["TaskRecord"], "TaskRecord"], rt: "RunModel") -> "Hedges":
        """An independent copy using ``rt``; ``task`` maps a task to the copy's."""
        out = Hedges(rt)
        out.stragglers = [(tok, task(tk)) for tok, tk in self.stragglers if tk.state != DONE]
        out.stats = list(self.stats)
        return out


def _on_straggler(sim: "Simulator", _slot: int, token_task: tuple[int, "TaskRecord"]) -> None:
    sim.hedges.seen(*token_task)


#: the simulator's handler of the straggler events (armed at a hedgeable start)
HANDLERS = {HEDGE: _on_straggler}
