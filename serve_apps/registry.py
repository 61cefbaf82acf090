"""The scheduler service's workflows: accepting one (quotas, idempotency keys, the journal
record), registering it for its tenant, releasing finished ones, and looking an id up (404 for
anything not this tenant's, 410 for what an earlier replica accepted and the journal could not
restore), and what ``GET /v1/cluster`` shows a tenant (:func:`tenant_view`: counts only).

:class:`Workflows` is a part of :class:`serve_apps.scheduler.SchedulerService`
(``svc.registry``): it owns the accepted handles, their tenants and the per-tenant in-flight
counts, and reaches the rest of the service only through what its constructor names.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable, Iterable, Mapping

from fastapi import Request
from fastapi.responses import JSONResponse

from envs import order as orders
from envs.workflow import WorkflowError
from scale_ray.live.config import NoServers, WorkflowQuarantined
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.journal import Submission
from scale_ray.live.programs import StepResult, program_of

from . import errors
from .refusals import refused
from .schemas import RequestError
from .tenants import audit
from .workflow_api import state

log = logging.getLogger("ray.serve")

__all__ = ["Workflows", "UnknownWorkflow", "refusal", "quarantined", "unknown_handler",
           "mask_tasks", "tenant_view"]



def mask_tasks(servers: Iterable[dict], ids: Mapping[int, str],
               handles: Iterable[WorkflowHandle]) -> list[dict]:
    """The snapshot's servers with each running task shown to its owner only: ``{"workflow":
    <its id>, "task", "name"}`` when its handle's ``id()`` is in ``ids`` (handle -> workflow
    id of this tenant), else ``{"tenant": "other"}``."""
    by_id = {h.id: h for h in handles}
    out = []
    for srv in servers:
        task = srv.get("task")
        if task is not None:
            h = by_id.get(task.get("workflow"))
            task = ({"workflow": ids[id(h)], "task": task["task"], "name": task["name"]}
                    if h is not None and id(h) in ids else {"tenant": "other"})
        out.append({**srv, "task": task})
    return out


def tenant_view(snap: Mapping[str, Any], servers: list[dict], tenant: str,
                workflows: Mapping[str, int], queued_tasks: int, others: int,
                policy: Mapping[str, Any], journal: Mapping[str, Any], resumed: int,
                uptime_s: float) -> dict[str, Any]:
    """``GET /v1/cluster`` for an HTTP tenant: counts only, built field by field (nothing of the
    snapshot passes unnamed): servers (count, busy, accepting, per tier), the queue, the policy's
    name and version, this tenant's workflows per state, its queued tasks and running tasks
    (``servers`` as :func:`mask_tasks` made them), other tenants' unfinished workflows as one
    count, this tenant's journal counts. Never a path, a node, worker or actor id, or another
    tenant's task."""
    tiers: dict[str, dict[str, int]] = {}
    for s in servers:
        t = tiers.setdefault(str(s.get("tier")), {"servers": 0, "busy": 0})
        t["servers"] += 1
        t["busy"] += bool(s.get("busy"))
    return {
        "tenant": tenant,
        "servers": {"count": len(servers), "busy": sum(bool(s.get("busy")) for s in servers),
                    "accepting": sum(bool(s.get("accepting")) for s in servers),
                    "by_tier": tiers},
        **{k: int(snap.get(k) or 0) for k in ("ready_tasks", "set_aside_tasks", "running_tasks",
                                               "workflows_pending")},
        "policy": str(policy.get("name")), "policy_version": str(policy.get("version") or "0"),
        "swaps": int(policy.get("swaps") or 0),
        "last_swap_failed": bool(policy.get("last_swap_failed")),
        "workflows": {str(k): int(v) for k, v in workflows.items()},
        "queued_tasks": int(queued_tasks),
        "running": [dict(s["task"]) for s in servers
                    if s.get("task") is not None and "workflow" in s["task"]],
        "other_tenants": {"unfinished_workflows": int(others)},
        "journal": {k: (v if isinstance(v, bool) else int(v)) for k, v in journal.items()},
        "resumed_workflows": int(resumed),
        "uptime_s": float(uptime_s),
        "sizing": sizing_view(snap.get("sizing")),
    }


def sizing_view(plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The sizer's last plan (``scale_ray.live.sizing``) for an HTTP tenant, field by field:
    nodes now and wanted per tier, launches and drains per tier (no node id), why, the cost so
    far and the SLO's attainment; None when nobody sizes the cluster."""
    if not plan:
        return None
    drains: dict[str, int] = {}
    for d in plan.get("drain") or ():
        drains[str(d.get("tier"))] = drains.get(str(d.get("tier")), 0) + 1
    ints = lambda m: {str(k): int(v) for k, v in (m or {}).items()}  # noqa: E731
    slo = plan.get("slo") or {}
    return {"policy": str(plan.get("policy")), "apply": str(plan.get("apply")),
            "turns": int(plan.get("turns") or 0), "nodes": ints(plan.get("nodes")),
            "launching": ints(plan.get("launching")),
            "wanted": ints(plan.get("wanted")), "launch": ints(plan.get("launch")),
            "drain": drains, "why": str(plan.get("why") or ""),
            "cost": float(plan.get("cost") or 0.0),
            "node_hours": {str(k): float(v) for k, v in (plan.get("node_hours") or {}).items()},
            "budget_per_hour": plan.get("budget_per_hour"),
            "slo": {"p95_s": slo.get("p95_s"), "window_s": slo.get("window_s"),
                    "target": slo.get("target"), "windows": int(slo.get("windows") or 0),
                    "attainment": slo.get("attainment")}}


def quarantined(h: WorkflowHandle) -> bool:
    """Whether ``h`` is a journaled workflow that failed every resume and is not run again
    (``LiveConfig.resume_attempts``; ``scale_ray.live.durability``)."""
    return isinstance(h.error, WorkflowQuarantined)


def refusal(e: WorkflowError) -> RequestError:
    """A submit the scheduler refused, as HTTP: no server at all (``NoServers``) is a 503
    ``no_servers``; a task no server could ever run (``Unschedulable``, any other
    ``WorkflowError``) a 422 ``does_not_fit``."""
    if isinstance(e, NoServers):
        return RequestError(("body", "tasks"), str(e), "no_servers", status=503)
    return RequestError(("body", "tasks"), str(e), "does_not_fit")


class UnknownWorkflow(KeyError):
    """An id that is not the tenant's (404 ``not_found``), or its own lost with an earlier
    replica (410 ``workflow_lost``)."""
    loc = ("path", "id")

    def __init__(self, msg: str, gone: bool):
        super().__init__(msg)
        self.msg, self.gone = msg, gone
        self.status, self.kind = (410, "workflow_lost") if gone else (404, "not_found")

    def __reduce__(self):  # (it crosses from the scheduler actor to a door)
        return (type(self), (self.msg, self.gone), self.__dict__)


async def unknown_handler(_: Request, exc: UnknownWorkflow) -> JSONResponse:
    return errors.error(exc.status, list(exc.loc), exc.msg, exc.kind)


class Workflows:
    """Accept, register, release and look up workflows (see the module docstring).

    ``sched``: the LiveScheduler; ``tuning``: returns the current ``SchedulerTuning`` (a
    reconfigure swaps it); ``ids``: the replica's ``IdSigner``; ``metrics``: ``refused`` and
    ``finished`` counters; ``pool``: where the journal folds finished workflows;
    ``incarnation``: this replica's id (named in a 410)."""

    def __init__(self, sched: Any, tuning: Callable[[], Any], ids: Any, metrics: Any,
                 pool: Executor | None, incarnation: str) -> None:
        self.sched, self._tuning, self.ids, self.metrics = sched, tuning, ids, metrics
        self._pool, self.incarnation = pool, incarnation
        self.handles: dict[str, WorkflowHandle] = {}  # workflow id -> handle
        self.owner: dict[str, str] = {}  # workflow id -> tenant
        # tenant -> [workflows, tasks, resource-seconds] unfinished (check_quota)
        self.inflight: dict[str, list] = {}
        self._load_lock = threading.Lock()  # in-flight counts (done callbacks: scheduler thread)
        self._reg_lock = threading.Lock()  # handles / owner: accepts run in the pool
        # a program's steps, close and cancel (re-entered: an append's accept takes it again)
        self._append_lock = threading.RLock()

    @property
    def tuning(self) -> Any:
        return self._tuning()

    def items(self) -> list[tuple[str, WorkflowHandle]]:
        """(id, handle) of every workflow held, a copy (safe while accepts run)."""
        with self._reg_lock:
            return list(self.handles.items())

    def work_s(self, wf: Any) -> float:
        """A workflow's charge in resource-seconds: each task's work (``Admission.work_s``, what
        the fair share counts) but at least its run at the offered servers' mean speed times
        ``min_task_share``, so a task that holds next to nothing of a node (``num_cpus: 0``,
        ``memory: 1``) still counts."""
        work = self.sched.admission.work_s(wf)
        speed = orders.mean_compute(s.node.compute for s in list(self.sched.alive_servers))
        floor = self.tuning.min_task_share / speed
        return float(sum(max(w, ts.compute_gflop * floor)
                         for w, ts in zip(work, wf.spec.tasks)))

    def _over_quota(self, tenant: str, tasks: int, work_s: float) -> RequestError | None:
        """The 429 a workflow of ``tasks`` tasks and ``work_s`` resource-seconds gets from the
        caps of ``SchedulerTuning`` now (caller holds ``_load_lock``); None when it fits."""
        t = self.tuning
        mine = self.inflight.get(tenant, [0, 0, 0.0])
        total = [sum(v[k] for v in self.inflight.values()) for k in range(3)]
        for have, cap, what in (
                (mine[0] + 1, t.max_inflight_per_tenant, "unfinished workflows of this tenant"),
                (mine[1] + tasks, t.max_queued_tasks_per_tenant,
                 "tasks of this tenant's unfinished workflows"),
                (mine[2] + work_s, t.max_queued_work_s_per_tenant,
                 "resource-seconds of this tenant's unfinished workflows"),
                (total[0] + 1, t.max_inflight_workflows, "unfinished workflows of all tenants"),
                (total[1] + tasks, t.max_queued_tasks, "tasks of all unfinished workflows"),
                (total[2] + work_s, t.max_queued_work_s,
                 "resource-seconds of all unfinished workflows")):
            if have > cap:
                return RequestError(("body", "tasks"), f"quota: {have:.6g} {what} would exceed "
                                    f"the cap of {cap:.6g}; retry after {t.retry_after_s} s",
                                    "quota", status=429,
                                    headers={"Retry-After": str(t.retry_after_s)})
        return None

    def check_quota(self, tenant: str, tasks: int, work_s: float = 0.0) -> None:
        """Refuse (429, audited) a workflow of ``tasks`` tasks and ``work_s`` resource-seconds
        that would take ``tenant``, or all tenants, past a cap of ``SchedulerTuning``; counts
        nothing (:meth:`reserve` checks and counts at once)."""
        with self._load_lock:
            err = self._over_quota(tenant, tasks, work_s)
        if err is not None:
            raise self._refused(tenant, err, tasks=tasks)

    def reserve(self, tenant: str, tasks: int, work_s: float) -> None:
        """:meth:`check_quota` and count the workflow as in flight in one step (under the lock
        the done callbacks take), so concurrent submits cannot together pass a cap; a submit
        that then fails gives it back (:meth:`unreserve`)."""
        with self._load_lock:
            err = self._over_quota(tenant, tasks, work_s)
            if err is None:
                self._add_load(tenant, 1, tasks, work_s)
        if err is not None:
            raise self._refused(tenant, err, tasks=tasks)

    def unreserve(self, tenant: str, tasks: int, work_s: float) -> None:
        with self._load_lock:
            self._add_load(tenant, -1, -tasks, -work_s)

    def _add_load(self, tenant: str, workflows: int, tasks: int, work_s: float) -> None:
        load = self.inflight.setdefault(tenant, [0, 0, 0.0])
        load[0] += workflows
        load[1] += tasks
        load[2] += work_s

    def _refused(self, tenant: str, err: BaseException, **fields: Any) -> BaseException:
        return refused(self.metrics, tenant, err, **fields)

    def accept(self, wf: Any, tenant: str, fmt: str, payload: bytes, key: str | None = None,
                meta: dict | None = None, program: str | None = None) -> dict:
        """Queue (and journal) an accepted workflow; a known ``key`` returns its workflow.
        ``program``: the id of the tenant's earlier workflow whose agent program this one
        continues (404 / 410 as :meth:`lookup`, 409 once closed). Its charge (:meth:`work_s`)
        is counted against the quotas before it is submitted, atomically (:meth:`reserve`).
        Every refusal is audited and counted (serve_apps.refusals)."""
        n = len(wf.calls)
        known = self.sched.durable.known(tenant, key)
        if known is not None and known.jid in self.handles:
            return self._duplicate(known, tenant)
        work = self.work_s(wf)
        self.reserve(tenant, n, work)  # counted from here on; given back unless registered
        try:
            wid, h = self._submit(wf, tenant, fmt, payload, key, meta, program)
        except RequestError as e:
            self.unreserve(tenant, n, work)
            raise self._refused(tenant, e) from None
        except BaseException:
            self.unreserve(tenant, n, work)
            raise
        if h.jid != wid:  # the same key raced in
            self.unreserve(tenant, n, work)
            return self._duplicate(h, tenant)
        self.register(wid, h, tenant, reserved_s=work)
        audit("submit", tenant, wid, tasks=n, name=h.name)
        if len(self.handles) % 100 == 99:
            self._prune()
        return {"id": wid, "name": h.name, "tasks": n, "state": state(h)}

    def _submit(self, wf: Any, tenant: str, fmt: str, payload: bytes, key: str | None,
                meta: dict | None, program: str | None) -> tuple[str, WorkflowHandle]:
        """:meth:`accept`'s part after the quota: the scheduler's submit (journaled), as the
        next step of ``program`` (404 / 410 as :meth:`lookup`; 409 once it is closed or
        cancelled; no close or cancel meanwhile); (the id issued, the handle: another id when
        the same key raced in)."""
        if program is None:
            return self._submit_now(wf, tenant, fmt, payload, key, meta, None, None)
        with self._append_lock:
            prog = program_of(self.sched, self._earlier(program, tenant))
            if prog.closed:
                raise _closed(program, ("body", "program"))
            have, cap = sum(len(h.workflow.calls) for h in prog.handles), self.tuning.max_tasks
            if have + len(wf.calls) > cap:  # (a program's steps together: as one workflow)
                raise RequestError(("body", "tasks"), f"the program would hold "
                                   f"{have + len(wf.calls)} tasks in all; this service accepts "
                                   f"at most max_tasks={cap} per agent program (its steps "
                                   f"together)", "too_long")
            return self._submit_now(wf, tenant, fmt, payload, key, meta, program, prog)

    def _submit_now(self, wf: Any, tenant: str, fmt: str, payload: bytes, key: str | None,
                    meta: dict | None, program: str | None, prog: Any
                    ) -> tuple[str, WorkflowHandle]:
        wid = self.ids.new(tenant)
        sub = Submission(id=wid, fmt=fmt, payload=payload, name=wf.spec.name, tenant=tenant,
                         key=key, meta=(meta or {}) | ({} if program is None else
                                                        {"program": program}))
        try:
            return wid, self.sched.submit(wf, tenant=tenant, key=key, record=sub, program=prog)
        except WorkflowError as e:
            raise self._refused(tenant, refusal(e)) from None

    def cancel(self, wid: str, tenant: str) -> list[WorkflowHandle]:
        """``DELETE /v1/workflows/{wid}``: what to cancel (404 / 410 as :meth:`lookup`): the
        workflow, or, when it is the first step of an agent program, the program: closed
        (journaled; a later append or ``program`` naming it is a 409) and every step it has
        (in their order). No step is added meanwhile. A quarantined workflow
        (:func:`quarantined`) is deleted: forgotten here and in the journal."""
        with self._append_lock:
            h = self.lookup(wid, tenant)
            if quarantined(h):  # it ended; deleting it is all its owner can do
                with self._reg_lock:
                    self.handles.pop(wid, None)
                    self.owner.pop(wid, None)
                self.sched.forget([h])
                audit("delete", tenant, wid, reason="quarantined")
                return [h]
            prog = h.program
            if prog is None or prog.handles[0] is not h:
                return [h]
            if not prog.closed:
                prog.close()
                audit("close", tenant, wid, reason="cancel")
            return list(prog.handles)

    def append(self, wid: str, tenant: str, req: Any, payload: bytes, key: str | None,
               meta: dict, build: Callable[[dict[str, StepResult]], Any]) -> dict:
        """``POST /v1/workflows/{wid}/tasks``: the request's tasks as the next step of the
        program ``wid`` is a step of (``build(earlier)`` makes its calls; ``earlier``: the
        parents it names in earlier steps), journaled with those references before it is
        acknowledged; ``req.close`` closes the program. 404 / 410 for ``wid`` as
        :meth:`lookup`, 409 for a closed program or a failed parent, 422 naming the field for
        a name the program has, a parent it lacks or one that is not its step's output; each
        audited."""
        try:
            return self._append(wid, tenant, req, payload, key, meta, build)
        except RequestError as e:
            raise self._refused(tenant, e) from None

    def _append(self, wid: str, tenant: str, req: Any, payload: bytes, key: str | None,
                meta: dict, build: Callable[[dict[str, StepResult]], Any]) -> dict:
        if not req.tasks and not req.close:
            raise RequestError(("body", "tasks"), "an append needs tasks, or close: true", "empty")
        known = self.sched.durable.known(tenant, key)
        if known is not None and known.jid in self.handles:  # a retried append
            return self._duplicate(known, tenant)
        with self._append_lock:  # (names unique in a program: one append at a time)
            prog = program_of(self.sched, self.lookup(wid, tenant))
            pid = prog.handles[0].jid
            if prog.closed:
                raise _closed(wid, ("path", "id"))
            out: dict[str, Any] = {"program": pid, "closed": bool(req.close)}
            if req.tasks:
                earlier = _earlier_tasks(prog, req.tasks)
                refs = {k: [r.jid, r.index] for k, r in earlier.items()}
                out |= self.accept(build(earlier), tenant, "json", payload, key,
                                   meta | {"append": True, "earlier": refs}, wid)
                out["waiting_for"] = sorted({r.jid for r in earlier.values()
                                             if not r.handle.done()})
            if req.close:
                prog.close()
                audit("close", tenant, pid)
                self._program_done(tenant, prog)
            return out

    def _program_done(self, tenant: str, prog: Any) -> None:
        """A closed program whose steps are all done counts once in ``program_response_s``."""
        if prog is None or prog.response_s is None:
            return
        with self._load_lock:
            if prog.reported:
                return
            prog.reported = True
        self.metrics.program_finished(tenant, self.sched.policy.name, prog.response_s)

    def _earlier(self, wid: str, tenant: str) -> WorkflowHandle:
        """The workflow a new one names as its ``program``: 404 / 410 on ``body.program``."""
        try:
            return self.lookup(wid, tenant)
        except UnknownWorkflow as e:  # (audited as it was raised)
            err = RequestError(("body", "program"), f"program: {e.msg}", e.kind, status=e.status)
            err.audited = True
            raise err from None

    @staticmethod
    def _duplicate(h: WorkflowHandle, tenant: str) -> dict:
        """A submit with the idempotency key of a workflow the service holds: that workflow."""
        audit("submit", tenant, h.jid, duplicate_key=h.key)
        return {"id": h.jid, "name": h.name, "tasks": len(h.workflow.calls), "state": state(h),
                "duplicate": True}

    def register(self, wid: str, h: WorkflowHandle, tenant: str,
                 reserved_s: float | None = None) -> None:
        """Hold ``h`` as ``tenant``'s workflow ``wid``, counted in flight until it is done
        (``reserved_s``: :meth:`reserve` counted it already, with this charge)."""
        n = len(h.workflow.calls)
        work = self.work_s(h.workflow) if reserved_s is None else reserved_s
        with self._reg_lock:
            self.handles[wid] = h
            self.owner[wid] = tenant
        if reserved_s is None:
            with self._load_lock:
                self._add_load(tenant, 1, n, work)
        if not h.done():  # (a resumed workflow that finished before the restart: counted then)
            h.add_done_callback(lambda _h: self.metrics.finished(tenant, self.sched.policy.name,
                                                                 _h))
        h.add_done_callback(lambda _h: self._done(tenant, n, _h, work))

    def _done(self, tenant: str, tasks: int, h: WorkflowHandle, work_s: float = 0.0) -> None:
        # only the outputs' results are kept (GET returns those): the others are released now
        keep = set(h.workflow.outputs)
        for i in range(len(h.result_refs)):
            if i not in keep:
                h.result_refs[i] = None
        with self._load_lock:
            load = self.inflight.get(tenant)
            if load is not None:
                load[0] -= 1
                load[1] -= tasks
                load[2] -= work_s
        self._program_done(tenant, h.program)
        journal = self.sched.durable.journal
        if journal is not None and h.jid is not None and h.error is None:
            # the journal keeps the outputs' results only, folded with the others (a failed or
            # cancelled one the scheduler folds itself): its files stop counting per task
            self._pool.submit(self._fold, journal, h.jid, keep)

    @staticmethod
    def _fold(journal: Any, wid: str, keep: set[int]) -> None:
        try:
            journal.finish(wid, keep)
        except Exception:  # noqa: BLE001 - storage trouble must not stop the service
            log.exception("journal: folding finished workflow %s failed", wid)

    def _prune(self) -> None:
        with self._reg_lock:
            self._prune_locked()

    def _prune_locked(self) -> None:
        now = time.perf_counter()
        ttl = self.tuning.result_ttl_s
        for h in self.handles.values():  # results past their TTL are released
            if h.done() and h.finished_wall is not None and now - h.finished_wall > ttl \
                    and not h.pins and any(r is not None for r in h.result_refs):
                h.result_refs = [None] * len(h.result_refs)
                self.sched.durable.compact(h)
        done = [k for k, h in self.handles.items() if h.done()]
        extra = len(done) - self.tuning.retain_finished
        if extra > 0:
            old = [self.handles.pop(k) for k in done[:extra]]
            for k in done[:extra]:
                self.owner.pop(k, None)
            self.sched.forget(old)

    def lookup(self, wid: str, tenant: str) -> WorkflowHandle:
        """The tenant's workflow ``wid``; 404 for any other id (another tenant's, malformed,
        never issued, forgotten, any string), 410 for its own from an earlier replica."""
        h = self.handles.get(wid)
        if h is not None and self.owner.get(wid) == tenant:
            return h
        raise self._refused(tenant, self._unknown(wid, tenant), wid=wid)

    def _unknown(self, wid: str, tenant: str) -> UnknownWorkflow:
        shown = repr(wid[:100] + ("..." if len(wid) > 100 else ""))
        if self.ids.check(wid, tenant) == "gone":
            why = self.sched.durable.unrestorable.get(wid) or (
                "the journal does not hold it (live.storage is off, or it was forgotten after "
                f"retain_finished={self.tuning.retain_finished})")
            return UnknownWorkflow(
                f"workflow {shown} was accepted by an earlier scheduler replica (this is replica "
                f"{self.incarnation}) and was not resumed: {why}; submit it again", gone=True)
        return UnknownWorkflow(f"no workflow {shown} of this tenant (unknown, or finished and "
                               f"forgotten after retain_finished={self.tuning.retain_finished})",
                               gone=False)


def _closed(wid: str, loc: tuple) -> RequestError:
    return RequestError(loc, f"the program of workflow {wid[:100]!r} is closed (an append with "
                             f"close: true ended it, or a DELETE of its first step cancelled "
                             f"it)", "program_closed", status=409)


def _earlier_tasks(prog: Any, tasks: list[Any]) -> dict[str, StepResult]:
    """The parents ``tasks`` (an append's) name outside themselves: each an output of one earlier
    step of ``prog`` (see :meth:`Workflows.append` for the errors)."""
    have: dict[str, list[tuple[WorkflowHandle, int]]] = {}
    for h in prog.handles:
        for i, t in enumerate(h.workflow.spec.tasks):
            have.setdefault(t.name, []).append((h, i))
    mine = {t.name for t in tasks}
    out: dict[str, StepResult] = {}
    for k, t in enumerate(tasks):
        if t.name in have:
            raise RequestError(("body", "tasks", k, "name"), f"the program already has a task "
                               f"{t.name!r} (workflow {have[t.name][0][0].jid}); names are "
                               f"unique in a program", "duplicate_name")
        for p in t.parents:
            if p in mine or p in out:
                continue
            where = have.get(p, [])
            loc = ("body", "tasks", k, "parents")
            if len(where) != 1:
                raise RequestError(loc, f"parent {p[:200]!r} is " + (
                    "neither a task of this body nor of the program's earlier steps" if not where
                    else f"a task of {len(where)} earlier steps; name it in one"),
                    "unknown_parent" if not where else "ambiguous_parent")
            h, i = where[0]
            if i not in h.workflow.outputs:
                raise RequestError(loc, f"parent {p!r} has children in its step (workflow "
                                   f"{h.jid}): only a step's outputs can be an append's "
                                   f"parents", "not_an_output")
            if h.done() and (h.error is not None or h.result_refs[i] is None):
                raise RequestError(loc, f"parent {p!r} (workflow {h.jid}) " + (
                    f"did not complete ({state(h)})" if h.error is not None
                    else "completed and its result is no longer held (result_ttl_s)"),
                    "parent_failed", status=409)
            out[p] = StepResult(h, i)
    return out
