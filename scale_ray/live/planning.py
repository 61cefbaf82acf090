"""The ``lookahead`` planner (``policies.lookahead``) in the live scheduler: each ask of the
decision core's round builds a snapshot of the scheduler's own record (``envs.snapshot``) and
plans on it.

The snapshot, in model seconds (wall seconds / ``time_scale``): the alive servers with their
estimated remaining busy time, and every unfinished task of the workflows that have work queued
or running: running tasks on their servers, finished parents' outputs where they were produced.
A task that chose to wait for a busy server keeps it reserved in the rollouts for the rest of
the round; the next round plans again, unless nothing it plans on changed since the task's last
ask (the same task on each server, the same ready tasks, the same choices earlier in the round):
then the answer is the same one, not planned again. The scheduler's loop runs a round at least
every ``wait_s``, while the simulator (and the twin) decides again only at the next event; only
the time has moved, and re-planning every 10 ms cost CPU and flipped near-even choices. Not a
learned policy: no guard; it waits only for a busy server that would finish the task before
the best idle server. Should planning raise (a bug), EFT decides that task, the error is logged
and counted (``counters["planner_errors"]``), and the scheduler thread goes on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from envs.config import EnvConfig, FeatureConfig
from envs.snapshot import ServerState, workflow_state
from policies.heuristics import EarliestFinish
from policies.lookahead import RoundChoices

from .tasks import DONE, READY, RUNNING

if TYPE_CHECKING:
    from policies.lookahead import Lookahead

    from .placement import LivePlacement
    from .tasks import LiveTask, LiveWorkflow


class LivePlanner:
    """Answers the live round's asks with ``planner`` (one per scheduler thread)."""

    def __init__(self, planner: "Lookahead", env: EnvConfig, features: FeatureConfig,
                 head_of_line_blocking: bool, time_scale: float):
        mdp = replace(env.mdp, mask_infeasible=True, ask_only_startable=True,
                      head_of_line_blocking=head_of_line_blocking)
        self.env = replace(env, mdp=mdp, features=features)
        self.planner = planner.fresh()
        self._ts = time_scale if time_scale > 0 else 1.0
        self.round = RoundChoices()  # this round's waits and defers, by task gid
        self._memo: dict[int, tuple[tuple, int, bool]] = {}  # gid -> (state, answer, deferred)
        self.reused = 0  # answers given again without planning (nothing had changed)
        self.fallback = EarliestFinish(features, env.mdp.transfer_delays_start)  # when planning raised

    @property
    def waiting(self) -> dict[int, int]:
        """Task gid -> position of the busy server it waits for, this round."""
        return self.round.waiting

    @property
    def deferred(self) -> list[int]:
        """Task gids the planner deferred this round (``first_k``)."""
        return self.round.deferred

    def new_round(self) -> None:
        self.round.clear()

    def ask(self, t: "LiveTask", placement: "LivePlacement", running: Iterable["LiveTask"],
            now: float) -> int:
        """The server position for ready task ``t`` at wall time ``now``."""
        state = self._state(placement)
        memo = self._memo.get(t.gid)
        if memo is not None and memo[0] == state:  # nothing changed: the same wait or defer
            _, choice, deferred = memo
            self.reused += 1
            self.round.record(t.gid, choice, deferred, True)
            return choice
        servers = [ServerState(s.node.compute, s.node.memory_gb,
                               0.0 if s.task is None else max((s.busy_until - now) / self._ts, 1e-3),
                               s.node.idle_w, s.node.busy_w, s.offered)
                   for s in placement.alive]
        graph = _LiveTasks(placement)
        states, where = [], {}
        for w, wf in enumerate(_active(placement, running)):
            listed = [x for x in wf.tasks if x.state != DONE]
            for j, x in enumerate(listed):
                where[x.gid] = (w, j)
            age = max((now - wf.arrival_wall) / self._ts, 0.0)
            states.append(workflow_state(listed, graph, age, len(wf.tasks)))
        waiting, deferred = self.round.for_snapshot(where)
        choice = self.planner.decide(servers, states, where[t.gid], waiting, env=self.env,
                                     deferred=deferred)
        deferred = bool(self.planner.last_deferred)
        busy = placement.alive[choice].task is not None
        self.round.record(t.gid, choice, deferred, busy)
        if deferred or busy:  # it waits: remembered until something changes
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[t.gid] = (state, choice, deferred)
        else:
            self._memo.pop(t.gid, None)
        return choice

    def _state(self, placement: "LivePlacement") -> tuple:
        """What a plan depends on besides the clock: the task on each server (and whether it
        accepts work), the number of ready tasks, this round's earlier waits and defers."""
        q = placement.queue
        ready = sum(1 for e in q.heap if e[2].state == READY)
        return (tuple((-1 if s.task is None else s.task.gid, s.offered) for s in placement.alive),
                ready, len(q.deferred), tuple(self.round.waiting.items()),
                tuple(self.round.deferred))


class _LiveTasks:
    """The scheduler's task records as an ``envs.snapshot.TaskGraph``."""

    def __init__(self, placement: "LivePlacement"):
        self.placement = placement

    def sizes(self, t: "LiveTask") -> tuple[float, float, float]:
        p = t.prim
        return p.compute_gflop, p.memory_gb, p.output_gb

    def parents(self, t: "LiveTask") -> list["LiveTask"]:
        return t.parents

    def first_parent(self, t: "LiveTask") -> "LiveTask | None":
        return t.first_parent

    def done(self, t: "LiveTask") -> bool:
        return t.state == DONE

    def finish(self, t: "LiveTask") -> float:
        return t.wf.handle.task_finish_wall[t.idx] or 0.0

    def held_at(self, t: "LiveTask") -> int:
        p = self.placement.position(t.last_server)
        return -1 if p is None else p

    def running_on(self, t: "LiveTask") -> int | None:
        return self.placement.position(t.server) if t.state == RUNNING else None


def _active(placement: "LivePlacement", running: Iterable["LiveTask"]) -> list["LiveWorkflow"]:
    """Workflows with a ready (queued, deferred or set aside) or running task, by arrival."""
    q = placement.queue
    seen: dict[int, "LiveWorkflow"] = {}
    for entries in (q.heap, q.deferred, q.blocked):
        for e in entries:
            t = e[2]
            if t.state == READY and not t.wf.failed:
                seen.setdefault(id(t.wf), t.wf)
    for t in running:
        if not t.wf.failed:
            seen.setdefault(id(t.wf), t.wf)
    return sorted(seen.values(), key=lambda wf: wf.arrival_wall)
