"""What the live scheduler does when a run ends: a result (the task is done, its children may
become ready), a primitive that raised (the workflow fails with its error), a lost run (placed
again, or its lost parents first, at most ``max_retries`` times), a cancel.

:class:`Completions` is a part of :class:`scale_ray.live.scheduler.LiveScheduler`
(``sched.completions``), used on its scheduler thread only; what it needs of the rest comes in
through its constructor.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from envs.order import Order

from .admission import Admission
from .config import SchedulingError, TaskLostError, WorkflowCancelled
from .context import LiveContext
from .durability import Durability
from .executors import is_lost_output, system_errors
from .handles import WorkflowHandle
from .nodes import LiveServer, NodeSet
from .placement import LivePlacement
from .ray_cpu import RayCalls
from .runs import Runs
from .tasks import DONE, READY, RUNNING, WAITING, LiveTask, LiveWorkflow

log = logging.getLogger(__name__)

#: what a stage of :meth:`Completions.unrunnable` could not do to a task
STAGES = {"admit": "admitted", "place": "placed", "start": "started", "settle": "settled"}


class Completions:
    """Completions, losses, failures and cancels (scheduler thread only).

    Args:
        ctx: the scheduler's settings (``max_retries``, ``time_scale``, the cancel settings),
            clock, trace, counters and estimator (learns run times; None: off).
        order: the ready-task order now (a callable: a policy swap may change it).
        admission: the tasks' keys and the servers' mean speed (a dynamic order's re-key).
        placement: the placement round (``push``, ``rekey``, ``release``; its servers).
        nodes: the node set (its server actors); runs: the runs in flight and their copies.
        durable: the journal part (a failed workflow is recorded).
        refresh: re-read the node set (``NodeEvents.refresh``).

    Owns ``stopping`` (runs of finished workflows being cancelled: status ref -> (task,
    server, deadline)), ``node_tasks`` (tasks finished per node) and ``run_lag`` (per node: the
    sum, count and largest of each run's wall s from its submission to its return that it did
    not spend in its worker: Ray's lease, a worker's start, the return and this thread's poll).
    """

    def __init__(self, ctx: LiveContext, order: Callable[[], Order], admission: Admission,
                 placement: LivePlacement, nodes: NodeSet, runs: Runs, durable: Durability,
                 refresh: Callable[..., None]) -> None:
        self.cfg, self._order, self._admission = ctx.cfg, order, admission
        self.placement, self._nodes, self.runs = placement, nodes, runs
        self._running, self.counters = runs.running, ctx.counters
        self._ray_calls = RayCalls(ctx.counters)  # ray.wait / ray.get CPU (ray_cpu)
        self.estimator, self.durable, self._refresh = ctx.estimator, durable, refresh
        self._now_model, self._emit = ctx.now_model, ctx.emit
        self.stopping: dict[Any, tuple[LiveTask, LiveServer, float]] = {}
        self.node_tasks: dict[str, int] = {}
        self.run_lag: dict[str, list[float]] = {}

    def collect(self, ray: Any, timeout: float) -> None:
        """Wait up to ``timeout`` s for one run to return, and settle what returned."""
        if not self._running and not self.runs.losers:
            return
        # One wait per round: other runs that finished meanwhile come back on the next rounds
        # at once (a second zero-timeout wait over every running ref cost ~0.3 ms per task on a
        # busy machine). The status refs are tiny and live in this process's memory store, so
        # there is nothing to fetch.
        refs = list(self._running)
        if self.runs.losers:  # cancelled runs of hedged tasks: their servers are busy until they return
            refs += list(self.runs.losers)
        with self._ray_calls:
            done, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
        errors = system_errors()
        for ref in done:
            if ref in self.runs.losers:
                self.runs.loser_returned(ray, ref)
                continue
            t, token = self._running.pop(ref)
            if token != t.token or t.state != RUNNING:
                continue  # stale: the run was already declared lost
            try:
                self._settle(ray, t, ref, errors)
            except Exception as e:  # noqa: BLE001 - this task's trouble, not the thread's
                self._free(t)
                self.unrunnable(t, "settle", e)

    def _settle(self, ray: Any, t: LiveTask, ref: Any, errors: tuple[type, ...]) -> None:
        """``ref``, a run of ``t``, returned: its result, the primitive's error, or a loss."""
        self.runs.ended(t, ref)  # a hedged task's copy returned: it is the task's run now
        try:
            with self._ray_calls:
                node, run_s = ray.get(ref)
        except errors as e:
            srv = t.server
            if self._nodes.actors and srv is not None and not is_lost_output(e):
                self._nodes.drop_actor(srv)  # dead or suspect
            self._refresh(force=True)
            if self._nodes.actors and srv is not None and srv.alive and srv.actor is None:
                # offered again once a new actor answers: the node may be dying while
                # the GCS still lists it
                self._nodes.start_actor(srv, probe=True)
            if t.state == RUNNING and t.server is srv:  # the refresh did not already
                if t.copy is not None:  # its other run goes on (hedging)
                    self.runs.drop_run(t)
                else:
                    self.lose(t, f"{type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}",
                               lost_output=is_lost_output(e))
            return
        except Exception as e:  # the primitive raised (or a placement check failed)
            self.runs.settle(ray, t)
            self._free(t)
            self.fail(t.wf, e)
            return
        self.runs.settle(ray, t)  # a hedged task: the other run is cancelled
        self.finish(t, node, run_s)

    def _free(self, t: LiveTask) -> LiveServer | None:
        srv = t.server
        if srv is not None:
            now = time.perf_counter()
            self.counters["run_s"] += now - t.started
            self.placement.release(srv, t, now)
        t.server = None
        return srv

    def finish(self, t: LiveTask, node: str, run_s: float) -> None:
        """``t``'s run on ``node`` returned its result (it took ``run_s`` wall s in its worker):
        it is done, its children may become ready."""
        srv = self._free(t)
        now = time.perf_counter()
        if self.estimator is not None and srv is not None:  # learn what the run took (in its
            # worker, so Ray's dispatch and this thread's polling are not counted)
            self.estimator.observe(t.prim.kind, srv.node.tier, run_s - t.transfer_wall,
                                   t.expected)
        t.state = DONE
        t.last_server = srv
        wf = t.wf
        wf.done += 1
        self.node_tasks[node] = self.node_tasks.get(node, 0) + 1
        lag = self.run_lag.setdefault(node, [0.0, 0, 0.0])
        gap = max(0.0, now - t.started - run_s)
        lag[0], lag[1], lag[2] = lag[0] + gap, lag[1] + 1, max(lag[2], gap)
        first_time = wf.handle.task_finish_wall[t.idx] is None
        ev = {"t": self._now_model(), "event": "finish", "task": t.gid,
              "server": srv.sid if srv else -1, "node": node}
        if self.estimator is not None and self.cfg.time_scale > 0:  # the run, in its worker
            ev["run_s"] = run_s / self.cfg.time_scale  # (model s, as the start's estimate_s)
        if not first_time:
            ev["rerun"] = True  # its earlier output was lost with its node
        self._emit(ev)
        if wf.failed:
            return
        if first_time:
            wf.handle.record_task_done(t.idx, t.value_ref, node, now)
            self.durable.progressed(wf.handle)  # (a resumed workflow: its resume did not fail)
            if wf.handle.program is not None:  # the service its program attained (las)
                wf.handle.program.ran((now - t.started) / (self.cfg.time_scale or 1.0))
            if self._order().dynamic and wf.done < len(wf.tasks):
                self.rekey(wf, t, now)
        else:  # a re-run of a task whose output was lost: only its ref changes
            wf.handle.result_refs[t.idx] = t.value_ref
            wf.handle.task_nodes[t.idx] = node
            wf.done -= 1  # it was counted already
        for c in t.children:
            if c.first_parent is None:
                c.first_parent = t
            c.waiting_for.discard(t.idx)
            if c.state == WAITING and not c.waiting_for:
                self.placement.push(c)
        if wf.done == len(wf.tasks):
            wf.handle.record_completion(now)

    def rekey(self, wf: LiveWorkflow, t: LiveTask, now: float) -> None:
        """A dynamic order (``srpt``, ``las``): ``t`` finished, so its workflow's level moves;
        its unfinished tasks get new keys and the ready ones are pushed again (the queue drops
        the older entries)."""
        ts = self.cfg.time_scale if self.cfg.time_scale > 0 else 1.0
        work = self._admission.costs.work_s(t.prim.compute_gflop, t.gpu)
        wf.level = self._order().on_finish(wf.level, work, (now - t.started) / ts)
        for tk in wf.tasks:
            if tk.state == DONE:
                continue
            tk.key = self._admission.key(tk)
            if tk.state == READY:
                self.placement.rekey(tk)

    def lose(self, t: LiveTask, why: str, lost_output: bool = False) -> None:
        """``t``'s run was lost (``why``): placed again (a lost parent's output first), or its
        workflow fails after ``max_retries``."""
        srv = self._free(t)
        self.counters["lost"] += 1
        t.attempts += 1
        t.wf.handle.task_attempts[t.idx] = t.attempts
        self._emit({"t": self._now_model(), "event": "lost", "task": t.gid,
                    "server": srv.sid if srv else -1, "node": srv.node.node_id if srv else None,
                    "reason": why})
        if t.attempts > self.cfg.max_retries:
            self.fail(t.wf, TaskLostError(
                f"task {t.idx} ({t.prim.name!r}) of workflow {t.wf.handle.id} was lost "
                f"{t.attempts} times (max_retries={self.cfg.max_retries}); last: {why}"))
            return
        if lost_output:  # a parent's result died with its node: run those parents again
            alive = {s.node.node_id for s in self.placement.alive}
            for p in t.parents:
                if p.state in (READY, RUNNING):  # already running again for another child
                    t.waiting_for.add(p.idx)
                elif p.state == DONE and (p.last_server is None
                                          or p.last_server.node.node_id not in alive):
                    self.counters["rerun_parents"] += 1
                    self._emit({"t": self._now_model(), "event": "output_lost", "task": p.gid,
                                "node": p.last_server.node.node_id if p.last_server else None})
                    t.waiting_for.add(p.idx)
                    self.placement.push(p)
            if t.waiting_for:
                t.state = WAITING
                return
        self.placement.push(t)

    def unrunnable(self, t: LiveTask, stage: str, err: Exception) -> None:
        """``t`` could not be admitted, placed, started or settled (``stage``, a key of
        :data:`STAGES`): its workflow fails with a :class:`SchedulingError` naming the task
        and the cause (counted: ``scheduling_errors``); the scheduler goes on."""
        self.counters["scheduling_errors"] += 1
        wf = t.wf
        log.warning("live scheduler: task %d (%r) of workflow %s could not be %s; its workflow "
                    "fails", t.idx, t.prim.name, wf.handle.id, STAGES[stage], exc_info=err)
        self.fail(wf, SchedulingError(
            f"task {t.idx} ({t.prim.name!r}) of workflow {wf.handle.id} could not be "
            f"{STAGES[stage]}: {type(err).__name__}: {str(err)[:1000]}"))

    def fail(self, wf: LiveWorkflow, err: BaseException) -> None:
        """``wf`` failed (a primitive raised, a task was lost too often) or was cancelled: its
        ready tasks never start and its running runs are stopped (:meth:`_stop_runs`)."""
        if wf.failed:
            return
        wf.failed = True
        for t in wf.tasks:
            if t.state == READY:
                t.state = WAITING  # skipped when popped
            elif t.state == RUNNING and t.server is not None:
                self._stop_runs(t)
        wf.handle.record_completion(time.perf_counter(), err)
        self.durable.failed(wf.handle)

    # ------------------------------------------------------------------ stopping runs
    def _stop_runs(self, t: LiveTask) -> None:
        """Cancel the run(s) of ``t``, whose workflow is over: ``ray.cancel`` (an emulated run
        stops within ``CANCEL_POLL_S``; a real body when it polls ``is_canceled()``, or at once
        for a plain Ray task with ``cancel_force``). Its server is free when the run returns;
        one still running ``cancel_grace_s`` later is replaced (:meth:`_check_stopping`)."""
        import ray

        deadline = time.perf_counter() + self.cfg.cancel_grace_s
        runs = [(t.status, t.server)]
        if t.copy is not None:
            runs.append((t.copy.status, t.copy.server))
        force = self.cfg.cancel_force and not self._actor_run(t)
        for ref, srv in runs:
            self.stopping[ref] = (t, srv, deadline)
            self.counters["runs_cancelled"] += 1
            try:
                ray.cancel(ref, force=force)
            except Exception:  # noqa: BLE001 - it just returned: its return frees the server
                pass

    def _actor_run(self, t: LiveTask) -> bool:
        """``t`` runs as a call of its server's actor (else as a plain Ray task)."""
        return self._nodes.actors and not t.prim.ray_options

    def check_stopping(self) -> None:
        """Runs cancelled more than ``cancel_grace_s`` ago that still run: their server is
        replaced (its actor killed and a new one asked for, offered at once: its next run
        queues behind the new actor's start; a plain Ray task's worker killed with
        ``ray.cancel(force=True)``) and free at once."""
        import ray

        now = time.perf_counter()
        for ref, (t, srv, deadline) in list(self.stopping.items()):
            if ref not in self._running and ref not in self.runs.losers:
                del self.stopping[ref]  # it returned: its server was freed then
                continue
            if now < deadline:
                continue
            del self.stopping[ref]
            self._running.pop(ref, None)
            loser = self.runs.losers.pop(ref, None)
            self.counters["servers_replaced"] += 1
            if self._actor_run(t):
                self._nodes.drop_actor(srv)
                if srv.alive:  # free once its replacement is asked for: its next run waits
                    self._nodes.start_actor(srv)  # for the new actor, not the server for it
            else:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - ended meanwhile
                    pass
            if loser is not None:
                self.runs.end_loser(t, loser[1], "cancel_timeout")
                continue
            if t.copy is not None and t.copy.status == ref:
                t.copy = None
            elif t.status == ref:
                t.server = None
            self.placement.release(srv, t, now)
            self._emit({"t": self._now_model(), "event": "cancel", "task": t.gid,
                        "server": srv.sid, "node": srv.node.node_id, "reason": "cancel_timeout"})

    def cancel(self, h: WorkflowHandle) -> bool:
        """Cancel ``h`` (False: it had ended)."""
        if h.done():
            return False
        self._emit({"t": self._now_model(), "event": "cancel", "workflow": h.id})
        self.fail_held(h, WorkflowCancelled(f"workflow {h.id} ({h.name!r}) was cancelled"))
        return True

    def fail_held(self, h: WorkflowHandle, err: BaseException) -> None:
        """Fail ``h``, admitted or not yet (a held step: ``programs.hold``)."""
        if h.live_record is not None:
            return self.fail(h.live_record, err)
        if not h.done():
            h.record_completion(time.perf_counter(), err)
            self.durable.failed(h)
