"""The ``lookahead`` planner (``policies.lookahead``) in the live runtime: each ask of the
decision core's round builds a snapshot of the runtime's own record (``envs.snapshot``) and
plans on it, on servers of one slot and on whole Ray nodes alike.

The snapshot, in model seconds (wall seconds / ``time_scale``): the alive servers (a whole node
with its resources; a run the snapshot lists no task for, ``held``, with what it holds and its
remaining time), and every unfinished task of the workflows that have work queued or running:
running tasks on their servers until their expected ends, finished parents' outputs where they
were produced.
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
from typing import TYPE_CHECKING

from envs.config import EnvConfig, FeatureConfig
from envs.snapshot import ServerState, workflow_state
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

    def ask(self, t: "LiveTask", placement: "LivePlacement", now: float) -> int:
        """The server position for ready task ``t`` at wall time ``now``."""
        state = self._state(placement)
        memo = self._memo.get(t.gid)
        if memo is not None and memo[0] == state:  # nothing changed: the same wait or defer
            _, choice, deferred = memo
            self.reused += 1
            self.round.record(t.gid, choice, deferred, True)
            return choice
        graph = _LiveTasks(placement, now, self._ts)
        states, where = [], {}
        listed_runs: set[int] = set()
        for w, wf in enumerate(_active(placement)):
            listed = [x for x in wf.tasks if x.state != DONE]
            for j, x in enumerate(listed):
                where[x.gid] = (w, j)
                if x.state == RUNNING:
                    listed_runs.add(id(x))
            age = max((now - wf.arrival_wall) / self._ts, 0.0)
            states.append(workflow_state(listed, graph, age, len(wf.tasks)))
        servers = [self._server(placement, i, s, now, listed_runs)
                   for i, s in enumerate(placement.alive)]
        waiting, deferred = self.round.for_snapshot(where)
        choice = self.planner.plan(servers, states, where[t.gid], waiting, env=self.env,
                                     deferred=deferred)
        deferred = bool(self.planner.last_deferred)
        busy = not placement.table.fits_now(choice, t.demands)
        self.round.record(t.gid, choice, deferred, busy)
        if deferred or busy:  # it waits: remembered until something changes
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[t.gid] = (state, choice, deferred)
        else:
            self._memo.pop(t.gid, None)
        return choice

    def _server(self, placement: "LivePlacement", i: int, s, now: float,
                listed: set[int]) -> ServerState:
        """Server ``i`` in the snapshot: a server of one slot with its remaining busy time, or
        a whole node with the runs of tasks the snapshot does not list (``held``)."""
        ts = self._ts
        if placement.slotted:
            rem = 0.0 if not s.running else max((s.busy_until - now) / ts, 1e-3)
            return ServerState(s.node.compute, s.node.memory_gb, rem, s.node.idle_w,
                               s.node.busy_w, s.offered, placement.table.specs[i])
        held = tuple((x.demands, max((until - now) / ts, 1e-3)) for x, until in s.running.items()
                     if id(x) not in listed or x.server is not s)
        return ServerState(s.node.compute, s.node.memory_gb, 0.0, s.node.idle_w, s.node.busy_w,
                           s.offered, placement.table.specs[i], held)

    def _state(self, placement: "LivePlacement") -> tuple:
        """What a plan depends on besides the clock: the tasks on each server (and whether it
        accepts work), the number of ready tasks, this round's earlier waits and defers."""
        q = placement.queue
        ready = sum(1 for e in q.entries() if e[2].state == READY) - sum(
            1 for e in q.blocked if e[2].state == READY)
        return (tuple((tuple(x.gid for x in s.running), s.offered) for s in placement.alive),
                ready, len(q.deferred), tuple(self.round.waiting.items()),
                tuple(self.round.deferred))


class _LiveTasks:
    """The runtime's task records as an ``envs.snapshot.TaskGraph`` at wall time ``now``."""

    def __init__(self, placement: "LivePlacement", now: float, time_scale: float):
        self.placement, self.now, self.ts = placement, now, time_scale

    def sizes(self, t: "LiveTask") -> tuple[float, float, float]:
        p = t.prim
        return p.compute_gflop, p.memory_gb, p.output_gb

    def demands(self, t: "LiveTask") -> tuple:
        return self.placement.demands_of(t)

    def remaining_s(self, t: "LiveTask") -> float | None:
        if t.state != RUNNING or t.server is None or self.placement.slotted:
            return None  # a slot's: its server's remaining time
        until = t.server.running.get(t)
        return None if until is None else max((until - self.now) / self.ts, 1e-3)

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


def _active(placement: "LivePlacement") -> list["LiveWorkflow"]:
    """Workflows with a ready (queued, deferred or set aside) or running task (a run on one of
    the servers), by arrival."""
    q = placement.queue
    seen: dict[int, "LiveWorkflow"] = {}
    for e in q.entries():
        t = e[2]
        if t.state == READY and not t.wf.failed:
            seen.setdefault(id(t.wf), t.wf)
    for srv in placement.alive:
        for t in srv.running:
            if t.state == RUNNING and not t.wf.failed:
                seen.setdefault(id(t.wf), t.wf)
    return sorted(seen.values(), key=lambda wf: wf.arrival_wall)
