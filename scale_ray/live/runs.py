"""Runs of primitives, and backup copies of stragglers (The Tail at Scale; MapReduce's backup
tasks) in the live scheduler: the twin of :mod:`envs.hedging`.

``LiveConfig.hedge`` (``marked``, default: primitives that say ``hedge=True``, a DAG
document's ``hedge`` field; ``all``: every task; ``off``) and ``hedge_quantile`` q. At its start a
hedgeable run is armed at the q-quantile of its estimated run time
(:func:`envs.run_model.quantile_s`: the estimator's, else a LogNormal around the declared
compute). Once past it, the run is a *straggler*: after a placement round (every ready task that
could start has started) a copy starts on the fastest other offered server where it fits now
(the simulator's rule, ``envs.hedging``), where the copy holds its demands until it ends or is
cancelled. The first run to finish completes the task; the other is cancelled
(``ray.cancel``: an emulated run stops within ``CANCEL_POLL_S``; a real body stops only if it
polls ``ray.get_runtime_context().is_canceled()``, else it runs to its end and its result is
dropped) and its server stays busy until that run returns. A run that is lost (node gone, actor
died) while the other goes on is dropped: the other carries the task. At most one copy per run;
a primitive that is not hedgeable never runs twice at once.

Counted (``summary()``): ``hedge_copies``, ``hedge_wins`` (the copy finished first),
``hedge_copy_s`` (wall s the copies ran, cancelled ones until they returned),
``hedge_waste_s`` (wall s of the cancelled runs, whichever they were) and ``run_s`` (wall s of
every run, copies included). Traced: the copy's ``start`` has ``"hedge": true``; the cancelled
run ends with ``cancel`` when its server is free again (``"reason": "server_fail"`` for a
dropped lost run).

:class:`Runs` is a part of :class:`scale_ray.live.scheduler.LiveScheduler` (``sched.runs``),
used on its scheduler thread only; what it needs of the rest comes in through its constructor.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any, Callable

from envs.run_model import quantile_s

from .cluster import emulated_speed, run_speed
from .context import LiveContext
from .durability import Durability
from .nodes import LiveServer, NodeSet
from .placement import LivePlacement
from .ray_cpu import RayCalls
from .tasks import RUNNING, LiveTask
from .workflow import Call

__all__ = ["Runs"]

log = logging.getLogger(__name__)


class _Run:
    """One run of a task: where, its refs, and what the estimator compares it with."""
    __slots__ = ("server", "value_ref", "status", "started", "expected", "transfer_wall", "busy")

    def __init__(self, server: LiveServer, value_ref: Any, status: Any, started: float,
                 expected: float, transfer_wall: float, busy: float):
        self.server, self.value_ref, self.status = server, value_ref, status
        self.started, self.expected, self.transfer_wall = started, expected, transfer_wall
        self.busy = busy  # wall s the server looks busy from the start (estimate + transfer)


class Runs:
    """Starting runs, hedging them, settling the two runs of a hedged task (scheduler thread).

    Args:
        ctx: the scheduler's settings, clock, trace, counters and estimator.
        durable: the journal part (what a run is recorded as: ``run_target``).
        nodes: the node set (``run`` starts a call on a server).
        placement: the placement round's state (its table and servers; ``release`` frees a
            server).

    Owns ``running`` (the runs in flight: status ref -> (task, token)), the stragglers and
    the cancelled runs (``losers``) until they return.
    """

    def __init__(self, ctx: LiveContext, durable: Durability, nodes: NodeSet,
                 placement: LivePlacement) -> None:
        self.ctx, self.cfg, self.env, self.estimator = ctx, ctx.cfg, ctx.env, ctx.estimator
        self.durable, self._nodes, self.placement = durable, nodes, placement
        self.counters = ctx.counters
        self._ray_calls = RayCalls(ctx.counters)  # submissions' CPU (scale_ray.live.ray_cpu)
        self._now_model, self._emit = ctx.now_model, ctx.emit
        self.running: dict[Any, tuple[LiveTask, int]] = {}
        self.stragglers: list[tuple[float, int, int, LiveTask]] = []  # heap: (due wall s, gid, token, t)
        self.due: list[tuple[int, LiveTask]] = []  # past due, waiting for an idle fitting server
        self.losers: dict[Any, tuple[LiveTask, _Run]] = {}  # cancelled runs, until they return
        #: what a run's body reads as its step (``executors.wrap_body``, ``client.program()``):
        #: ``step_context(handle)``; set by the scheduler service
        self.step_context: Callable[[Any], tuple] | None = None

    # ------------------------------------------------------------------ starting runs
    def launch(self, t: LiveTask, srv: LiveServer, now: float, copy: bool) -> tuple[_Run, dict]:
        """Start a run of ``t`` on ``srv`` (its parents' results passed as object refs); returns
        the run and its trace event."""
        call = t.call
        parent_ref = {id(p.call): p.value_ref for p in t.parents}
        args = [parent_ref[id(a)] if isinstance(a, Call) else a for a in call.args]
        kwargs = {k: parent_ref[id(v)] if isinstance(v, Call) else v for k, v in call.kwargs.items()}
        node = srv.node
        ts = self.cfg.time_scale
        # the estimated run (wall s): the declared compute, or the estimator's; an emulated
        # primitive sleeps its true compute (run_gflop: with noise, not the declared) first
        prim = t.prim
        speed = run_speed(node, t.demands)  # GPU work at the node's GPU speed (model nodes)
        expected = prim.compute_gflop / speed * ts if ts > 0 else 0.0
        estimate = expected if self.estimator is None else self.estimator.duration(
            prim.kind, node.tier, expected)
        true_gflop = prim.copy_gflop if copy else prim.run_gflop
        sleep_s = true_gflop / emulated_speed(node, t.demands) * ts if ts > 0 and prim.emulate \
            else 0.0
        transfer = 0.0
        if ts > 0 and prim.emulate and self.env.mdp.transfer_delays_start and t.parents:
            # emulated inputs, as the simulator's transfer_delays_start (envs.timing)
            transfer = self.env.cluster.network.start_delay(
                ((id(p.last_server), p.prim.output_gb) for p in t.parents), id(srv))
            sleep_s += transfer * ts
        attempt = t.runs
        # every emulated run polls for ray.cancel (a hedged loser, a cancelled workflow)
        step = self.step_context(t.wf.handle) if self.step_context is not None else None
        meta = (node.node_id, sleep_s, 0.0, attempt, self.durable.run_target(t), True, None, step)
        t.runs += 1
        with self._ray_calls:
            value_ref, status_ref = self._nodes.run(srv, prim, meta, args, kwargs)
        # what the policy sees: the estimate plus the emulated transfer, never the true run
        run = _Run(srv, value_ref, status_ref, now, expected, transfer * ts,
                   estimate + transfer * ts)
        srv.take(t, now + run.busy)
        self.counters["tasks_started"] += 1
        ev = {"t": self._now_model(), "event": "start", "task": t.gid, "server": srv.sid,
              "node": node.node_id}
        if transfer:
            ev["transfer_s"] = transfer
        if self.estimator is not None and ts > 0:  # model s (the actual: the finish's run_s)
            ev["estimate_s"] = estimate / ts
        if copy:
            ev["hedge"] = True
        if attempt:  # a run again (lost, a copy, or its scheduler restarted): which task, which run
            ev.update(attempt=attempt, workflow_id=t.wf.handle.jid or t.wf.handle.id, index=t.idx)
        return run, ev

    def submit(self, t: LiveTask, srv: LiveServer, now: float) -> None:
        """Run ``t`` on ``srv`` (the policy's pick)."""
        run, ev = self.launch(t, srv, now, copy=False)
        t.value_ref, t.status, t.server, t.started = run.value_ref, run.status, srv, now
        t.wf.handle.record_task_start(t.idx, srv.node.node_id, now)
        t.expected = run.expected  # what the estimator compares the run (less its transfer) with
        t.transfer_wall = run.transfer_wall
        t.state = RUNNING
        t.token += 1
        t.is_copy = False
        self.running[run.status] = (t, t.token)
        self._emit(ev)
        self.arm(t, run)

    # ------------------------------------------------------------------ hedging
    def hedgeable(self, t: LiveTask) -> bool:
        mode = self.cfg.hedge
        return mode == "all" or (mode == "marked" and t.prim.hedge)

    def arm(self, t: LiveTask, run: _Run) -> None:
        """At a hedgeable run's start: when it becomes a straggler."""
        if not self.hedgeable(t) or run.expected <= 0:
            return
        q = quantile_s(self.estimator, t.prim.kind, run.server.node.tier, run.expected,
                       self.cfg.hedge_quantile)
        heapq.heappush(self.stragglers, (run.started + run.transfer_wall + q, t.gid, t.token, t))

    def launch_copies(self, now: float) -> None:
        """After a placement round: copies of stragglers on idle fitting servers."""
        heap = self.stragglers
        while heap and heap[0][0] <= now:
            _, _, token, t = heapq.heappop(heap)
            self.due.append((token, t))
        if not self.due:
            return
        keep = []
        for token, t in self.due:
            if t.token != token or t.state != RUNNING or t.copy is not None or t.wf.failed:
                continue  # finished, lost, cancelled or already copied
            srv = self.copy_server(t)
            if srv is None:
                keep.append((token, t))  # no idle server fits it now: later
                continue
            try:
                run, ev = self.launch(t, srv, now, copy=True)
            except Exception:  # noqa: BLE001 - no copy then: the task's own run goes on
                self.counters["scheduling_errors"] += 1
                log.warning("live scheduler: a hedged copy of task %d could not start", t.gid,
                            exc_info=True)
                continue
            self.placement.hold(srv, t)  # Ray's resource model: its demands, on that node
            t.copy = run
            self.running[run.status] = (t, t.token)
            self.counters["hedge_copies"] += 1
            self._emit(ev)
        self.due = keep

    def copy_server(self, t: LiveTask) -> LiveServer | None:
        """The fastest other offered server (for ``t``'s kind of work) where ``t`` fits now,
        the first on a tie (the simulator's rule, ``envs.hedging``)."""
        placement = self.placement
        table, best, speed = placement.table, None, 0.0
        for i in table.fitting(t.demands):
            s = placement.alive[i]
            if s is not t.server:
                v = table.speed(i, t.demands)
                if v > speed:
                    best, speed = s, v
        return best

    # ------------------------------------------------------------------ the two runs
    def swap(self, t: LiveTask) -> None:
        """Make ``t.copy`` the task's run (the run it replaces becomes ``t.copy``)."""
        c = t.copy
        old = _Run(t.server, t.value_ref, t.status, t.started, t.expected, t.transfer_wall, 0.0)
        t.server, t.value_ref, t.status, t.started = c.server, c.value_ref, c.status, c.started
        t.expected, t.transfer_wall = c.expected, c.transfer_wall
        t.copy = old
        t.is_copy = not t.is_copy

    def ended(self, t: LiveTask, ref: Any) -> None:
        """``ref`` (a run of ``t``) returned: make it the task's run."""
        if t.copy is not None and ref == t.copy.status:
            self.swap(t)

    def settle(self, ray: Any, t: LiveTask) -> None:
        """``t``'s run finished (or raised) first: cancel the other, whose server stays busy
        until it returns."""
        other = t.copy
        if other is None:
            return
        t.copy = None
        self.counters["hedge_wins"] += t.is_copy
        now = time.perf_counter()
        if t.is_copy:  # the finished copy's time; a cancelled copy's when it returns
            self.counters["hedge_copy_s"] += now - t.started
            if self.estimator is not None:  # the straggler ran at least this long: without it
                # the estimator would learn from the runs that won only, and estimate too low
                self.estimator.observe(t.prim.kind, other.server.node.tier,
                                       now - other.started - other.transfer_wall, other.expected)
        self.running.pop(other.status, None)
        self.losers[other.status] = (t, other)
        try:
            ray.cancel(other.status)
        except Exception:  # noqa: BLE001 - already finished: its return frees the server
            pass

    def loser_returned(self, ray: Any, ref: Any) -> None:
        """A cancelled run returned: its server is free. Its outcome is read (and dropped), so
        that Ray does not report a cancelled run's error as unhandled."""
        t, run = self.losers.pop(ref)
        try:
            ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - RunCancelled, TaskCancelledError, a lost node...
            try:
                ray.get(run.value_ref, timeout=0)
            except Exception:  # noqa: BLE001 - the same error: read, so not reported
                pass
        self.end_loser(t, run, None)

    def end_loser(self, t: LiveTask, run: _Run, reason: str | None) -> None:
        now = time.perf_counter()
        srv = run.server
        wasted = now - run.started
        self.counters["hedge_waste_s"] += wasted
        self.counters["run_s"] += wasted
        if not t.is_copy:  # the cancelled run was the copy
            self.counters["hedge_copy_s"] += wasted
        self.placement.release(srv, t, now)
        ev = {"t": self._now_model(), "event": "cancel", "task": t.gid, "server": srv.sid,
              "node": srv.node.node_id}
        if reason:
            ev["reason"] = reason
        self._emit(ev)

    def drop_run(self, t: LiveTask) -> None:
        """``t``'s run was lost while its other run goes on: that one carries the task."""
        srv = t.server
        now = time.perf_counter()
        self.counters["run_s"] += now - t.started
        if t.is_copy:
            self.counters["hedge_copy_s"] += now - t.started
        if srv is not None:
            self.placement.release(srv, t, now)
        self.swap(t)
        t.copy = None
        self._emit({"t": self._now_model(), "event": "cancel", "task": t.gid,
                    "server": srv.sid if srv else -1, "reason": "server_fail"})

    def server_gone(self, srv: LiveServer) -> list[LiveTask]:
        """``srv`` left the cluster: a cancelled run there is forgotten, a run whose task's
        other run goes on is dropped; returns the tasks whose only run was there (lost: the
        caller places them again)."""
        lost = []
        for ref, (lt, run) in list(self.losers.items()):
            if run.server is srv:
                del self.losers[ref]
                self.end_loser(lt, run, "server_fail")
        for t in list(srv.running):  # one in the slot model; every run of the node's in Ray's
            if t.state != RUNNING:
                continue
            if t.copy is not None:
                if t.copy.server is srv:
                    self.running.pop(t.copy.status, None)
                    self.swap(t)
                else:
                    self.running.pop(t.status, None)
                self.drop_run(t)
                continue
            lost.append(t)
        return lost
