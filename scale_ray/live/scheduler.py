"""The live scheduler: workflow primitives as real Ray tasks, each placed by a Policy.

One scheduler thread owns all state (ready set, what runs where, handles). Each round it takes
new submissions, collects finished tasks (``ray.wait``), reads the node set (``ray.nodes()``, at
most every ``node_refresh_s``, at once after a lost task) and runs one placement round of the
decision core (:mod:`scale_ray.live.placement`) over the one table of nodes (servers of one slot
or whole Ray nodes): ready tasks in the order (``envs.order``), the policy asked (any of
``policies.get_policy``'s: a heuristic, Ray's placement, a trained network behind its guard, the
lookahead planner), each run with its parents' results as object refs. Executors:
:mod:`scale_ray.live.executors`.

A pick of a busy server is a *wait*: with ``head_of_line_blocking`` (the paper's semantics) the
whole ready set waits for the next completion or ``wait_s``; without it (default here) only that
task waits and the next ready task is placed. When no accepting idle server fits a task every
pick would be a wait, so the policy is not asked (the simulator's ``ask_only_startable``).

Elasticity and failures: a node that appears is used from the next decision; a node that
disappears (dead, removed) is never chosen again and its running tasks are *lost* (so is a run
whose server actor died; that server is offered again once a new actor answers): they become
ready again and are placed elsewhere, at most ``max_retries`` times, then the workflow fails with
:class:`TaskLostError`. Ray's own retries are off (``max_retries=0``) so a primitive runs only when
this scheduler says so; a stale result of a lost run is ignored, so no task completes twice.
Results of primitives themselves raising propagate to the workflow's handle unchanged.

Times: traces and ``*_model_s`` metrics are model seconds (wall s / ``time_scale``), others
wall s. Parts: ``self.durable`` (:mod:`scale_ray.live.durability`), ``self.runs`` (runs and
copies), ``self.placement``, ``self.nodes``, ``self.admission`` and ``self.node_events``
(:mod:`scale_ray.live.admission`), ``self.completions``, ``self.gateway`` (steps from inside
primitives, :mod:`scale_ray.live.gateway`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable, Sequence

from envs import order as orders
from envs.config import EnvConfig, build
from envs.episode import episode_event
from envs.programs import require_dag
from envs.workload import WorkflowSpec
from policies.base import ObservationPolicy, Policy, is_planner
from policies.guard import guard_summary, make_guard
from policies.heuristics import eft_pick
from policies.sizing import make_sizer

from .admission import Admission, NodeEvents
from .completions import Completions
from .durability import Durability, Loader
from .journal import Submission
from .config import LiveConfig, SchedulingError
from .context import LiveContext
from .executors import RemoteCache
from .gateway import GatewayPump
from .handles import NothingToRun, WorkflowHandle, drain_handles, summarize
from .runs import Runs
from .sizing import LiveSizing
from .hints import AutoscaleHints
from .nodes import NodeSet, LiveServer
from .refusals import check_fits
from .placement import LivePlacement, LiveState
from .planning import LivePlanner
from .programs import Program, hold, program_of, step_inputs
from .tasks import READY, LiveTask
from .raydag import accept, nothing_to_run
from .workflow import Call, CollectedWorkflow

log = logging.getLogger(__name__)

TraceSink = Callable[[dict[str, Any]], None]


class LiveScheduler:
    """Places workflow primitives as Ray tasks with ``policy`` (see the module docstring).

    Args:
        policy: any :class:`policies.Policy` (heuristic, artifact, Serve client adapter).
        env: supplies the feature constants, bandwidth/latency and the tier table (power draw,
            trace header); default: ``EnvConfig()``.
        config: :class:`LiveConfig` (or a mapping validated into one).
        trace: optional sink receiving the simulator's JSONL trace events plus ``node`` ids.

    Requires ``ray.init`` (connected to a cluster with scale server nodes). Use ``start()``,
    ``submit(...)`` any number of times from any thread, then ``shutdown()`` (or ``with``).
    """

    def __init__(self, policy: Policy, env: EnvConfig | None = None,
                 config: LiveConfig | dict | None = None, trace: TraceSink | None = None):
        self.env = require_dag(env or EnvConfig(), "the live scheduler")
        self.cfg = config if isinstance(config, LiveConfig) else build(LiveConfig, config, "live")
        #: what the parts share: settings, model clock, trace, counters, the estimator
        self.ctx = ctx = LiveContext(self.cfg, self.env, trace)
        self._bind_policy(policy)
        self._tiers = tuple(self.env.cluster.tiers)
        self._remote = RemoteCache(self.cfg.task_num_cpus, self.cfg.worker_env_blank)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._handles: list[WorkflowHandle] = []
        self.thread_error: BaseException | None = None
        self.gateway: GatewayPump | None = None  # LiveConfig.program_gateway
        # the parts, by what they own: placement (the decision core over the servers), the
        # node set, the journal, the fair share; intake (admission), execution (runs and
        # their completions), node-set events
        self.placement = LivePlacement(ctx, self.features, self.encoder)
        #: the cluster's size (env.sizing.policy; scale_ray.live.sizing); None: static
        sizer = make_sizer(self.env)
        self.sizing = None if sizer is None else LiveSizing(ctx, sizer)
        self.nodes = NodeSet(self.cfg, self._tiers, self._remote, ctx.counters, self._offer)
        self.set_alive([])
        self._hints = AutoscaleHints(self.cfg, ctx.counters)
        #: the journal (LiveConfig.storage) and idempotency keys (scale_ray.live.durability)
        self.durable = Durability(self.cfg.storage, self._adopt, self._queue,
                                  self.cfg.resume_attempts)
        self.runs = Runs(ctx, self.durable, self.nodes, self.placement)
        order = lambda: self.order  # noqa: E731 - a policy swap may change it
        #: what enters: workflows (scale_ray.live.admission) and node-set changes
        self.admission = Admission(ctx, order, self.placement)
        self.node_events = NodeEvents(ctx, self.nodes, self._server_gone, self.set_alive)
        #: what a returned run does (scale_ray.live.completions)
        self.completions = Completions(ctx, order, self.admission, self.placement, self.nodes,
                                       self.runs, self.durable, self.node_events.refresh)
        self._latencies: list[float] = []  # ms of the policy's answers since the last take

    # the shared state, as the scheduler's attributes (read by benches, tests and Serve)
    counters = property(lambda self: self.ctx.counters)
    estimator = property(lambda self: self.ctx.estimator)
    running = property(lambda self: self.runs.running,
                       doc="The runs in flight: status ref -> (task, token).")

    @property
    def trace(self) -> TraceSink | None:
        return self.ctx.trace

    @trace.setter
    def trace(self, sink: TraceSink | None) -> None:
        self.ctx.trace = sink

    @property
    def clock_origin(self) -> float:
        """Wall s (``perf_counter``) of model time 0."""
        return self.ctx.origin

    @clock_origin.setter
    def clock_origin(self, wall: float) -> None:
        self.ctx.origin = wall

    @property
    def alive_servers(self) -> list[LiveServer]:
        """The servers the policy sees, in order."""
        return self.placement.alive

    def _server_gone(self, srv: LiveServer, why: str) -> None:
        """``srv`` left: its runs are settled (``Runs.server_gone``), the tasks whose only run
        was there lost (placed again, ``Completions.lose``)."""
        for t in self.runs.server_gone(srv):
            self.completions.lose(t, why)

    def _bind_policy(self, policy: Policy) -> None:
        # the ready-task order (envs.order): the config's, else what the policy needs, else the
        # serving default; a conflict raises (a swap to such a policy is refused)
        self.order = orders.make(orders.resolve(self.env.mdp.order, policy.order, policy.name,
                                                orders.SERVING_ORDER), self.env.mdp.edf_factor)
        self.policy = policy
        # the encoder and constants the policy was trained with (an artifact records them)
        self.features = getattr(policy, "features", None) or self.env.features
        if self.cfg.workload_scale is not None:
            self.features = replace(self.features, workload_scale=self.cfg.workload_scale)
        self.encoder = getattr(policy, "encoder", "paper")
        self._guard = make_guard(policy, self.cfg.guard)
        self._planner = (LivePlanner(policy, self.env, self.features,
                                     self.cfg.head_of_line_blocking, self.cfg.time_scale)
                         if is_planner(policy) else None)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LiveScheduler":
        """Read the node set, emit the trace header, start the scheduler thread."""
        if self._thread is not None:
            return self
        self.ctx.origin = time.perf_counter()  # model time 0
        self.durable.open()
        self.policy.reset(None)
        self._emit(episode_event(self.env) | {"time_scale": self.cfg.time_scale,
                                               "policy": self.policy.name})
        self.node_events.refresh(force=True)
        nodes = self.nodes
        if nodes.probes:
            import ray

            ray.wait(list(nodes.probes), num_returns=len(nodes.probes),
                     timeout=self.cfg.actor_start_s, fetch_local=False)
            self.node_events.check_probes(ray)
            if nodes.probes:
                log.warning("%d of %d server actors not ready after actor_start_s=%g s (does "
                            "every node have %g CPUs per server?); they are offered once ready",
                            len(nodes.probes), len(nodes.servers), self.cfg.actor_start_s,
                            self.cfg.task_num_cpus)
        if self.cfg.program_gateway:  # steps from inside primitives (scale_ray.live.gateway)
            self.gateway = GatewayPump(self)
            self.gateway.start()
        self._thread = threading.Thread(target=self._loop, name="scale-live-scheduler", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the scheduler thread (running Ray tasks are not cancelled; with
        ``executor=actor`` the server actors are killed, which ends their runs)."""
        self._stop.set()
        if self.gateway is not None:
            self.gateway.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.nodes.stop_actors()
        # the journal's last end records; a thread that died keeps its resumes counted
        self.durable.close(clean=self.thread_error is None)
        self._emit({"t": self._now_model(), "event": "end", "truncated": bool(self.pending()),
                    "metrics": self.summary()})

    def __enter__(self) -> "LiveScheduler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ public API
    def submit(self, workflow: Call | Sequence[Call] | WorkflowSpec | CollectedWorkflow | Any,
               *inputs: Any, name: str = "", tenant: str | None = None, key: str | None = None,
               record: Submission | None = None, program: Program | None = None,
               **kw_inputs: Any) -> WorkflowHandle | NothingToRun:
        """Validate ``workflow`` and queue it; returns its handle at once.

        ``workflow``: calls of primitives, a Ray DAG (``@ray.remote`` functions' ``.bind()``;
        ``inputs``/``kw_inputs`` are its InputNode's values, as ``dag.execute``), a WorkflowSpec
        (emulated bodies) or a collected workflow (:mod:`scale_ray.live.raydag`); for anything
        but a Ray DAG, a single string positional is the name.

        ``key``: an idempotency key: a submit with the ``key`` (and ``tenant``) of a workflow this
        scheduler still holds returns that workflow's handle, running nothing new (also after
        a restart with the same journal, :meth:`resume`). ``record``: what the journal keeps
        of it (a service's document; default: the pickled workflow). ``program``: it is a step of
        that agent program (:meth:`program`; ``Program.submit`` passes it).

        Raises (nothing runs): :class:`~scale_ray.live.workflow.WorkflowTypeError` for anything
        else; :class:`WorkflowError` for a cycle or an unknown parent (DAG files);
        :class:`~scale_ray.live.config.Unschedulable` when no server could ever run one of its
        tasks (:class:`~scale_ray.live.config.NoServers`: the scheduler has no server at all).
        """
        if self.thread_error is not None:
            raise RuntimeError("the scheduler thread died") from self.thread_error
        if self._thread is None:
            raise RuntimeError("LiveScheduler.submit: call start() first (or use `with`)")
        if nothing_to_run(workflow):
            return NothingToRun(name)
        tenant = tenant or ""
        durable = self.durable
        hit = durable.known(tenant, key)
        if hit is not None:
            return hit
        wf = accept(workflow, inputs, kw_inputs, name)
        self._check_fits(wf)
        sub = durable.record_submission(wf, tenant, key, record, program)
        with self._lock:
            h = WorkflowHandle(len(self._handles), wf, time.perf_counter())
            h.tenant = tenant
            hit = durable.register(h, sub, tenant, key)
            if hit is None:
                self._handles.append(h)
                if program is not None:
                    program.add(h)
        if hit is not None:  # the same key raced in: one workflow
            if sub is not None and durable.journal is not None and sub.id != hit.jid:
                durable.safe(durable.journal.remove, sub.id)
            return hit
        self._queue(h)
        return h

    def _queue(self, h: WorkflowHandle) -> None:
        """Admit ``h`` next round, or (a step naming an earlier step's result) once that step
        is done (``programs.hold``)."""
        needs = step_inputs(h.workflow)
        if not needs:
            return self._inbox.put(h)
        hold(h, needs, self.durable.handle, self._inbox.put, lambda h, e: self.call_soon(
            lambda: self.completions.fail_held(h, e)))

    def program(self, name: str = "", tenant: str | None = None,
                started_wall: float | None = None) -> Program:
        """An agent program: steps submitted one at a time (``Program.submit``), each waiting on
        the last one's answer, ordered as one request that arrived now (or at ``started_wall``,
        ``time.perf_counter`` s) (:mod:`scale_ray.live.programs`)."""
        start = time.perf_counter() if started_wall is None else started_wall
        return Program(self, name, tenant, self._model_time(start), start)

    def call_soon(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the scheduler thread between two rounds (after every submission made
        before this call); its return value or exception arrives in the Future."""
        if self.thread_error is not None:
            raise RuntimeError("the scheduler thread died") from self.thread_error
        fut: Future = Future()
        self._inbox.put((fn, fut))
        return fut

    def cancel(self, handle: WorkflowHandle) -> Future:
        """Cancel a workflow: its queued tasks never start, its running primitives finish (Ray
        cannot interrupt a running call) and their results are dropped; the handle fails with
        :class:`WorkflowCancelled`. The Future says whether it was still running."""
        return self.call_soon(lambda: self.completions.cancel(handle))

    def set_policy(self, policy: Policy) -> Future:
        """Decide with ``policy`` from the next round on (its features and guard with it)."""
        def swap() -> None:
            policy.reset(None)
            self._bind_policy(policy)
            self.placement.set_encoder(self.features, self.encoder)
            self.set_alive(self.alive_servers)
        return self.call_soon(swap)

    def status(self) -> Future:
        """A consistent view of the servers, the queue and the counters (a Future of a dict)."""
        return self.call_soon(self._status)

    def _status(self) -> dict[str, Any]:
        """The servers, what they run, the queue and the counters (scheduler thread)."""
        q = self.placement.queue
        servers = []
        for s in self.alive_servers:
            t = s.task
            servers.append({
                "server": s.sid, "node": s.node.node_id, "slot": s.slot, "tier": s.node.tier,
                "compute": s.node.compute, "memory_gb": s.node.memory_gb,
                "accepting": s.offered, "busy": t is not None, "running": len(s.running),
                "draining": self.sizing is not None and not self.sizing.accepting(s),
                "task": None if t is None else {"workflow": t.wf.handle.id, "task": t.idx,
                                                "name": t.prim.name}})
        return {"servers": servers, "policy": self.policy.name,
                "estimator": None if self.estimator is None else self.estimator.summary(),
                "ready_tasks": sum(1 for e in q.entries() if e[2].state == READY)
                - sum(1 for e in q.blocked if e[2].state == READY),
                "set_aside_tasks": sum(1 for e in q.blocked if e[2].state == READY),
                "running_tasks": len(self.running), "workflows_pending": self.pending(),
                "counters": dict(self.counters),
                "sizing": None if self.sizing is None else self.sizing.snapshot()}

    def forget(self, handles: Sequence[WorkflowHandle]) -> None:
        """Drop finished ``handles`` from :meth:`handles` and the summary (a long-running
        service keeps only recent ones)."""
        gone = {id(h) for h in handles if h.done()}
        with self._lock:
            self._handles = [h for h in self._handles if id(h) not in gone]
        self.durable.forget([h for h in handles if id(h) in gone])

    def resume(self, loader: Loader | None = None) -> list[WorkflowHandle]:
        """After ``start()``, before new submits: ``Durability.resume`` (the journal's work)."""
        if self._thread is None:
            raise RuntimeError("LiveScheduler.resume: call start() first")
        return self.durable.resume(loader)

    def _adopt(self, wf: CollectedWorkflow, submitted: float, sub: Submission,
               after: WorkflowHandle | None = None, closed: bool = False) -> WorkflowHandle:
        # a resumed workflow's handle, registered as if submitted again (``after``: the
        # workflow whose agent program it continued; ``closed``: its program was closed)
        with self._lock:
            h = WorkflowHandle(len(self._handles), wf, submitted)
            h.tenant = sub.tenant
            self.durable.register(h, sub, sub.tenant, sub.key)
            self._handles.append(h)
            if after is not None:
                program_of(self, after).add(h)
        if closed:  # (journaled already)
            program_of(self, h).closed = True
        return h

    def take_decision_latencies(self) -> list[float]:
        """The policy's answer times (ms, guard included) since the last call (any thread)."""
        out, self._latencies = self._latencies, []
        return out

    def guard_overrides(self) -> int:
        return guard_summary(self._guard)["guard_overrides"]

    def load(self) -> dict[str, int]:
        """Ready and running tasks and servers now, read without stopping the scheduler thread
        (any thread; a concurrent round may make it one off)."""
        q = self.placement.queue
        ready = sum(1 for e in q.entries() if e[2].state == READY)
        return {"ready_tasks": ready, "running_tasks": len(self.running),
                "servers": len(self.alive_servers)}

    def handles(self) -> list[WorkflowHandle]:
        with self._lock:
            return list(self._handles)

    def pending(self) -> int:
        """Workflows submitted but not finished."""
        return sum(1 for h in self.handles() if not h.done())

    def drain(self, timeout: float | None = None, progress: Callable[[int, int], None] | None = None
              ) -> bool:
        """Wait until every submitted workflow finished; False on timeout."""
        return drain_handles(self, "the scheduler thread", timeout, progress)

    def summary(self) -> dict[str, Any]:
        """Response-time statistics plus the scheduler's counters."""
        out = summarize(self.handles(), self.cfg.time_scale)
        out.update(self.counters)
        out.update(guard_summary(self._guard))
        out["policy"] = self.policy.name
        out["servers_alive"] = len(self.alive_servers)
        out["tasks_per_node"] = dict(self.completions.node_tasks)
        ts = self.cfg.time_scale if self.cfg.time_scale > 0 else 1.0
        lag = self.completions.run_lag
        runs = sum(v[1] for v in lag.values())
        # model s a run spent outside its worker (Completions.run_lag): mean, per node mean/max
        out["run_lag_model_s"] = sum(v[0] for v in lag.values()) / runs / ts if runs else 0.0
        out["run_lag_by_node"] = {n: [v[0] / v[1] / ts, v[2] / ts] for n, v in lag.items()}
        if self.estimator is not None:
            out["estimator"] = self.estimator.summary()
        return out

    # ------------------------------------------------------------------ validation
    def _check_fits(self, wf: CollectedWorkflow) -> None:
        """Refuse a workflow no server could ever run (``refusals.check_fits``)."""
        check_fits(wf, self.alive_servers, self._tiers, self.cfg, self.nodes.source,
                   self.nodes.slotted)

    # ------------------------------------------------------------------ loop
    def _now_model(self) -> float:
        return self.ctx.now_model()

    def _model_time(self, wall: float) -> float:
        """Model seconds since the start (``time_scale`` wall seconds each) at ``wall``."""
        return self.ctx.model_time(wall)

    def _emit(self, ev: dict[str, Any]) -> None:
        self.ctx.emit(ev)

    def _loop(self) -> None:
        import ray

        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set():
                queue = self.placement.queue
                self._take_submissions(block=not self.running and not queue.heap
                                       and not queue.blocked)
                self.node_events.refresh()
                self._dispatch()
                if self.runs.stragglers or self.runs.due:
                    self.runs.launch_copies(time.perf_counter())
                self._hints.update(self.placement, self.alive_servers)
                if self.sizing is not None and self.sizing.due(self.ctx.now_model()):
                    self._size()
                if self.nodes.actors:
                    self.node_events.tend_actors(ray, queue, self.alive_servers)
                if self.completions.stopping:
                    self.completions.check_stopping()
                if self.running or self.runs.losers:
                    self.completions.collect(ray, timeout=self.cfg.wait_s)
                elif queue.heap or queue.blocked:
                    time.sleep(self.cfg.wait_s)
                # CPU the scheduler thread used; ray_client_cpu_s: its Ray calls' part of it
                self.counters["thread_cpu_s"] = time.thread_time() - cpu0
        except BaseException as e:  # surface to submit()/drain() instead of dying silently
            log.exception("live scheduler thread failed")
            self.thread_error = e
            for h in self.handles():
                if not h.done():
                    h.record_completion(time.perf_counter(), e)

    def _offer(self, srv: LiveServer, offered: bool) -> None:
        """``srv``'s actor answered (True) or is starting again: it is offered to the policy
        unless the sizer drains its node (``live.sizing_apply: ray``)."""
        self.placement.set_offered(srv, offered and (self.sizing is None
                                                     or self.sizing.accepting(srv)))

    def _size(self) -> None:
        """A sizer turn (scale_ray.live.sizing); the servers of a node it drains are no longer
        offered. A sizer's error is logged and counted, never the thread's."""
        try:
            self.sizing.turn(self.alive_servers, self.placement.queue)
        except Exception:  # noqa: BLE001 - sizing advises; placement goes on
            self.counters["sizing_errors"] += 1
            log.exception("live scheduler: the sizer's turn failed")
            return
        back, self.sizing.undrained = self.sizing.undrained, set()
        for s in self.alive_servers:
            if s.offered and not self.sizing.accepting(s):
                self.placement.set_offered(s, False)
            elif not s.offered and s.node.node_id in back and s.probe is None and (
                    s.actor is not None or not self.nodes.actors):
                self.placement.set_offered(s, True)  # (a reaped actor: woken when work waits)

    def _take_submissions(self, block: bool) -> None:
        try:
            h = self._inbox.get(timeout=self.cfg.wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(h, tuple):  # call_soon
                fn, fut = h
                try:
                    fut.set_result(fn())
                except Exception as e:  # noqa: BLE001 - the caller gets it
                    fut.set_exception(e)
            else:
                self._admit(h)
            try:
                h = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, h: WorkflowHandle) -> None:
        """Admit ``h``; an error in its admission (its order keys, its fair-share charges) fails
        ``h`` with a :class:`~scale_ray.live.config.SchedulingError`, not the thread."""
        try:
            self.admission.admit(h)
            if self.sizing is not None:
                self.sizing.admitted(h.live_record)
        except Exception as e:  # noqa: BLE001 - this workflow's trouble
            self.counters["scheduling_errors"] += 1
            log.warning("live scheduler: workflow %s could not be admitted; it fails", h.id,
                        exc_info=e)
            self.completions.fail_held(h, SchedulingError(
                f"workflow {h.id} ({h.name!r}) could not be admitted: {type(e).__name__}: "
                f"{str(e)[:1000]}"))

    # ------------------------------------------------------------------ placement
    def set_alive(self, alive: list[LiveServer]) -> None:
        """The servers the policy sees, in order (the scheduler thread's; a bench's by hand)."""
        slotted = self.nodes.slotted
        if slotted != self.placement.slotted:  # the servers' kind follows their source
            log.info("live scheduler: %s; tasks placed by %s", "servers of one slot" if slotted
                     else "whole Ray nodes (live.model: nodes), each task holding its Ray "
                          "request", self.policy.name)
        self.placement.set_alive(alive, slotted)

    def _dispatch(self) -> None:
        """One placement round of the decision core (``envs.decision``; see
        :mod:`scale_ray.live.placement`)."""
        if not self.placement.queue.heap:
            return
        if self._planner is not None:
            self._planner.new_round()
        self.placement.round(time.perf_counter, self.ask,
                             lambda t, srv: self.runs.submit(t, srv, time.perf_counter()),
                             self.completions.unrunnable)
        core = self.placement.core
        self.counters["decisions"], self.counters["waits"] = core.decisions, core.waits
        if self._planner is not None:
            self.counters["planner_reused"] = self._planner.reused

    def ask(self, t: LiveTask, state: LiveState) -> int:
        """The pick for ``t``: the planner's, else the policy's (a trained one's through its
        guard)."""
        if self._planner is not None:  # the lookahead planner: on a snapshot, never guarded
            try:
                a = self._planner.ask(t, self.placement, state.wall)
            except Exception:  # noqa: BLE001 - a planner bug must not stop the scheduler thread
                self.counters["planner_errors"] += 1
                log.exception("lookahead failed on task %d; EFT decides it", t.gid)
                return eft_pick(state)
            if not (0 <= a < state.table.n and state.table.fits_total(a, t.demands)):
                return eft_pick(state)  # a server that could never hold it: EFT decides
            return a
        t0 = time.perf_counter()
        if isinstance(self.policy, ObservationPolicy):  # a trained network, then its guard
            a = int(self.policy.act(state.observe()))
            if self._guard is not None:
                a = self._guarded(t, state, a)
        else:
            a = int(self.policy.decide(state))
        if len(self._latencies) < 100_000:  # bounded if nobody takes them
            self._latencies.append(1e3 * (time.perf_counter() - t0))
        return a

    def _guarded(self, t: LiveTask, state: LiveState, a: int) -> int:
        """The guard's answer for the policy's pick ``a`` (policies.guard); a replacement is
        traced as a ``guard`` event."""
        final, why = self._guard.check(state, a)
        if why is None:
            return a
        alive = self.alive_servers
        self._emit({"t": self._now_model(), "event": "guard", "task": t.gid,
                    "proposed": alive[a].sid if 0 <= a < len(alive) else None,
                    "chosen": alive[final].sid, "reason": why})
        return final
