"""Submit workflows to the cluster's scheduler service from any Ray job (docs/live.md)::

    import ray
    from scale_ray import client
    from scale_ray.live import primitive

    @primitive(compute_gflop=2.0, memory_gb=4.0)
    def fetch(url): ...

    client.connect()                         # ray.init(address="auto"), token checked
    h = client.submit(summarize.bind(fetch.bind("a"), fetch.bind("b")))
    print(h.result(), h.response_s)

A Ray DAG works too: ``client.submit(f.bind(f.bind(1)))`` for ``@ray.remote`` functions, with
their Ray options as demands (``scale_ray.live.raydag``). A workflow no server could ever run is
refused at submit: :class:`Unschedulable` (or :class:`NoServers`: the service has none).

The service (``serve_apps.scheduler``, Serve application ``scheduler`` by default) places every
primitive as a Ray task on the server its policy chooses, sharing the servers with every other
job that submits to it. The job's own primitive functions travel **by value** (cloudpickle: the
service need not import the job's modules); functions of installed packages (site-packages) and
of this project travel by reference, as usual. Results come back as Python objects.

If the service's replica restarts (or is redeployed), it resumes the workflows it had accepted
from its journal (docs/serving.md, "Durability"): :meth:`ServiceWorkflow.result` keeps waiting,
and a submit that was cut off is retried with the same idempotency key, so it never makes a
second workflow. :class:`WorkflowLost` is raised only for a workflow the journal cannot restore.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from envs.workload import WorkflowError
from scale_ray.connect import AuthNeeded, connect, quiet_serve_logs
from scale_ray.live.config import NoServers, Unschedulable
from scale_ray.live.handles import NothingToRun, WorkflowFailed
from scale_ray.live.journal import current_step
from scale_ray.live.raydag import ACCEPTED, accept, nothing_to_run
from scale_ray.live.workflow import Call, CollectedWorkflow, WorkflowTypeError

DEFAULT_APP = "scheduler"
_OURS = ("scale_ray", "envs", "policies", "serve_apps")
_handles: dict[tuple[str, str, str], Any] = {}
_lock = threading.Lock()
RETRY_S = 120.0  # how long a call keeps retrying while a door or the scheduler actor restarts


def _restarting(e: BaseException) -> bool:
    """A door's 503 while the scheduler actor restarts (``kind`` ``restarting``)."""
    return getattr(getattr(e, "cause", None) or e, "kind", None) == "restarting"


def _retrying(app: str, method: str, *args: Any, attempts_s: float = RETRY_S, **kwargs: Any) -> Any:
    """A handle call, retried while a door (a Serve replica) is replaced (its actor died or is
    not reachable yet) or the scheduler actor restarts (the door's 503); :class:`WorkflowLost`
    after ``attempts_s``."""
    import ray.exceptions as rex
    from ray.serve.exceptions import DeploymentUnavailableError

    deadline = time.monotonic() + attempts_s
    while True:
        try:
            return getattr(_handle(app), method).remote(*args, **kwargs).result()
        except Exception as e:  # noqa: BLE001 - only the kinds below are retried
            if not (isinstance(e, (rex.RayActorError, rex.ActorUnavailableError,
                                   DeploymentUnavailableError)) or _restarting(e)):
                raise
            if time.monotonic() > deadline:
                raise WorkflowLost(f"the scheduler service did not answer {method} for "
                                   f"{attempts_s:g} s ({type(e).__name__})") from e
            if isinstance(e, DeploymentUnavailableError):  # redeployed (or Serve restarted):
                _forget_handle(app)                         # ask for a fresh handle
            time.sleep(0.5)


def _forget_handle(app: str) -> None:
    with _lock:
        for key in [k for k in _handles if k[0] == app]:
            del _handles[key]


class WorkflowLost(RuntimeError):
    """The service replica that accepted the workflow is gone and its successor could not
    resume it (no journal, an unreadable journal entry, primitives it no longer has), or the
    service did not answer for ``RETRY_S``."""


class QuotaExceeded(RuntimeError):
    """The service is at a cap on unfinished workflows or tasks (this tenant's or everyone's);
    nothing was queued. Submit again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float | None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotConnected(RuntimeError):
    """This process is not connected to a Ray cluster running the scheduler service."""


def _connected() -> Any:
    """Ray, connected: at once :class:`NotConnected` saying what to do when this process has no
    Ray connection (Ray would otherwise start a throwaway local instance, with no service in
    it). A driver run by ``ray job submit`` (``RAY_ADDRESS`` set) connects to its cluster."""
    import ray

    if not ray.is_initialized():
        if not os.environ.get("RAY_ADDRESS"):
            raise NotConnected(
                "scale_ray.client: this process is not connected to Ray. Connect to the cluster "
                "that runs the scheduler service first: client.connect() on one of its nodes "
                "(ray.init(address=\"auto\") with the token checked), "
                "client.connect(\"ray://HEAD:10001\") from elsewhere, or run the driver with "
                "`ray job submit`")
        connect(os.environ["RAY_ADDRESS"])  # the cluster this job was submitted to
    return ray


def job_tenant() -> str:
    """The tenant of this Ray job on the service: ``job:<job id>``."""
    return f"job:{_connected().get_runtime_context().get_job_id()}"


def _handle(app: str) -> Any:
    """The app's DeploymentHandle, cached per Ray connection (a handle of an earlier
    ``ray.init`` in this process would talk to a cluster that is gone)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    ctx = _connected().get_runtime_context()
    key = (app, ctx.get_session_name(), ctx.get_job_id())
    with _lock:
        if key not in _handles:
            try:
                _handles[key] = serve.get_app_handle(app)
            except RayServeException as e:
                raise NotConnected(
                    f"scale_ray.client: no scheduler service {app!r} on this Ray cluster "
                    f"({e}); deploy it: `serve run configs/serve/scheduler.yaml` (docs/serving.md)"
                ) from None
            quiet_serve_logs()  # (Serve configures its logger when imported: after that)
        return _handles[key]


def _installed_roots() -> tuple[str, ...]:
    roots = set(site.getsitepackages() + [site.getusersitepackages()])
    roots.update(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(str(Path(r).resolve()) for r in roots if r)


def _by_value_modules(wf: CollectedWorkflow) -> list[Any]:
    """The modules of the workflow's primitive bodies that the service may not be able to import:
    neither installed (site-packages, stdlib) nor this project (``__main__`` is by value anyway)."""
    roots = _installed_roots()
    out = {}
    for c in wf.calls:
        mod = sys.modules.get(getattr(c.primitive.fn, "__module__", "") or "")
        if mod is None or mod.__name__ == "__main__" or mod.__name__.split(".")[0] in _OURS:
            continue
        f = getattr(mod, "__file__", None)
        if f and not str(Path(f).resolve()).startswith(roots):
            out[mod.__name__] = mod
    return list(out.values())


def _payload(wf: CollectedWorkflow) -> bytes:
    from ray import cloudpickle

    mods = [m for m in _by_value_modules(wf)
            if m.__name__ not in cloudpickle.list_registry_pickle_by_value()]
    with _lock:  # cloudpickle's by-value registry is process-wide
        for m in mods:
            cloudpickle.register_pickle_by_value(m)
        try:
            return cloudpickle.dumps(wf)
        finally:
            for m in mods:
                cloudpickle.unregister_pickle_by_value(m)


class ServiceWorkflow:
    """A workflow submitted to the service: ``result()``, ``wait()``, ``status()``, ``cancel()``,
    ``response_s`` (the service's measure, submission to the last task's completion)."""

    def __init__(self, app: str, accepted: dict, submit_latency_s: float, tenant: str):
        self.app = app
        self.tenant = tenant
        self.id: str = accepted["id"]
        self.name: str = accepted["name"]
        self.submit_latency_s = submit_latency_s
        self.final_record: dict | None = None

    def _call(self, method: str, *args: Any) -> Any:
        """A handle call; retried while the replica is being replaced (actor errors)."""
        return _retrying(self.app, method, *args, tenant=self.tenant)

    def status(self, wait_s: float = 0.0) -> dict:
        """The service's record (state, per-task node and times, error); ``state`` ``lost``
        raises :class:`WorkflowLost`."""
        rec = self._call("wait", self.id, float(wait_s))
        if rec["state"] in ("lost", "unknown"):
            raise WorkflowLost(rec["error"]) if rec["state"] == "lost" else KeyError(rec["error"])
        if rec["state"] in ("completed", "failed", "cancelled"):
            self.final_record = rec
        return rec

    def done(self) -> bool:
        return self.final_record is not None or self.status()["state"] in ("completed", "failed",
                                                                     "cancelled")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the workflow completed, failed or was cancelled; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.final_record is None:
            left = 30.0 if deadline is None else min(30.0, deadline - time.monotonic())
            if left <= 0:
                return False
            self.status(left)
        return True

    def result(self, timeout: float | None = None) -> Any:
        """The output's value (a list for several outputs); raises the primitive's own exception
        when one raised (as its type, chained from :class:`WorkflowFailed`), else
        :class:`WorkflowFailed` (cancelled), :class:`WorkflowLost`, or ``TimeoutError``."""
        if not self.wait(timeout):
            raise TimeoutError(f"workflow {self.id} ({self.name!r}) not done after {timeout} s")
        rec = self.final_record
        if rec["state"] != "completed":
            failed = WorkflowFailed(f"workflow {self.id} ({self.name!r}) {rec['state']}: "
                                    f"{rec['error']}")
            cause = self._exception() if rec["state"] == "failed" else None
            if cause is not None:  # the primitive's own exception, as its own type
                raise cause from failed
            raise failed
        return self._call("values", self.id)

    def _exception(self) -> BaseException | None:
        from ray import cloudpickle

        try:
            blob = self._call("exception", self.id)
            return cloudpickle.loads(blob) if blob else None
        except Exception:  # noqa: BLE001 - not importable here, or the replica is gone: the text
            return None

    @property
    def response_s(self) -> float | None:
        """Wall seconds from the service's acceptance to the last task's completion (None until
        completed)."""
        return None if self.final_record is None else self.final_record["response_s"]

    def cancel(self) -> bool:
        """Cancel it; True if it was still running (see ``DELETE /v1/workflows/{id}``)."""
        return bool(self._call("cancel", self.id)["cancelled"])

    def __repr__(self) -> str:
        return f"ServiceWorkflow({self.id}, {self.name!r})"


def submit(workflow: Call | Sequence[Call] | Any, *inputs: Any, name: str = "",
           app: str = DEFAULT_APP, tenant: str | None = None, key: str | None = None,
           program: ServiceWorkflow | str | None = None,
           **kw_inputs: Any) -> ServiceWorkflow | NothingToRun:
    """Submit a workflow to the scheduler service ``app``; returns once the service accepted it.

    ``workflow``: calls of ``@primitive`` functions; a Ray DAG (``@ray.remote`` functions'
    ``.bind()``, ``MultiOutputNode``; ``inputs``/``kw_inputs`` are its ``InputNode``'s values, as
    ``dag.execute``); or a WorkflowSpec (emulated bodies). ObjectRefs may be arguments. For
    anything but a Ray DAG a single string positional is the name.

    Raises (nothing runs): ``WorkflowTypeError`` for anything else, ``WorkflowError`` for a bad
    DAG, ``Unschedulable`` when no server could run one of its tasks (its memory or Ray
    options), ``NoServers`` when the service has no server at all, :class:`QuotaExceeded` at a
    cap. ``tenant``: whose workflow it is (default this Ray job's, :func:`job_tenant`); only
    that tenant sees, waits for and cancels it.

    ``key``: an idempotency key (1 to 200 printable ASCII characters; default: a new random
    one): a submit with the key of a workflow the service still holds returns that workflow.
    The call is retried with its key while the service's replica is being replaced, so a
    submit cut off by a restart never makes two workflows.

    ``program``: an earlier workflow of the tenant (or its id) whose agent program this one
    continues: an agent that submits each step as it learns it passes its first step, and the
    service orders the steps as one request (scale_ray/live/programs.py)."""
    if nothing_to_run(workflow):  # MultiOutputNode([]): Ray's [] at once, nothing to send
        return NothingToRun(name)
    t0 = time.perf_counter()
    wf = accept(workflow, inputs, kw_inputs, name)  # validated here first: errors name the call
    payload = _payload(wf)
    tenant = tenant or job_tenant()
    key = key if key is not None else uuid.uuid4().hex
    prog = program.id if isinstance(program, ServiceWorkflow) else program
    accepted = _retrying(app, "submit", payload, wf.spec.name, tenant=tenant, key=key,
                         program=prog)
    if "refused" in accepted:  # the service's typed refusal, raised here as itself
        raise _refusal(accepted)
    return ServiceWorkflow(app, accepted, time.perf_counter() - t0, tenant)


class ServiceProgram:
    """An agent program in the scheduler service (:func:`program`): ``submit`` adds a step,
    ordered as part of the program (``submit(..., program=)``); ``close()`` (or leaving a
    ``with`` block) says no step follows: the program ends when its steps are done. ``first``:
    the first step when :func:`program` submitted it (else None)."""

    def __init__(self, step: str, app: str, tenant: str, first: ServiceWorkflow | None = None):
        self.step, self.app, self.tenant = step, app, tenant
        self.first = first
        self.closed = False

    def close(self) -> None:
        """No more steps (``POST /v1/workflows/{id}/tasks`` with ``close: true``); a second
        call does nothing. Raises ``KeyError`` / :class:`WorkflowLost` for a program the
        service does not hold, ``WorkflowError`` when another client closed it already."""
        if self.closed:
            return
        out = _retrying(self.app, "close_program", self.step, tenant=self.tenant)
        if "refused" in out:
            kind, message = out["refused"], out["message"]
            raise (KeyError if kind == "not_found" else WorkflowLost if kind == "workflow_lost"
                   else WorkflowError)(message)
        self.closed = True

    def __enter__(self) -> "ServiceProgram":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def submit(self, workflow: Any, *inputs: Any, name: str = "", key: str | None = None,
               **kw_inputs: Any) -> ServiceWorkflow | NothingToRun:
        """:func:`submit` of the next step (same tenant and app); its result may name an
        earlier step's output with ``scale_ray.live.StepResult``."""
        return submit(workflow, *inputs, name=name, app=self.app, tenant=self.tenant, key=key,
                      program=self.step, **kw_inputs)

    def __repr__(self) -> str:
        return f"ServiceProgram(step={self.step})"


#: what :func:`program` takes as its first argument (its refusal names them)
PROGRAM_ACCEPTS = ("an earlier workflow (the ServiceWorkflow client.submit returned, or its id), "
                   "or the first step to submit: " + ACCEPTED)


def program(first: ServiceWorkflow | str | Any = None, *inputs: Any, app: str = DEFAULT_APP,
            tenant: str | None = None, name: str = "", **kw_inputs: Any) -> ServiceProgram:
    """An agent program to add steps to, ``with client.program(first) as p: p.submit(call)``.

    ``first``: an earlier workflow (the :class:`ServiceWorkflow` :func:`submit` returned, or its
    id), or the program's first step itself, anything :func:`submit` takes (a call, a Ray DAG
    with ``inputs``/``kw_inputs``, a list of calls): it is submitted now, as ``p.first``.
    Anything else is refused here, before the service is asked (``WorkflowTypeError`` naming
    what is accepted). Inside a primitive the service runs, with no ``first``: the program of
    the workflow it belongs to, its tenant and app included, so a running call can submit the
    calls it decides on::

        @primitive
        def plan(question):
            todo = decide(question)
            steps = [client.program().submit(search.bind(t)) for t in todo]
            return [s.result(timeout=300) for s in steps]
    """
    if first is None:
        ctx = current_step()
        if ctx is None or len(ctx) > 3:  # (len 4: the library's scheduler runs it)
            raise RuntimeError("client.program(): not inside a primitive the scheduler service "
                               "runs; name the step: client.program(handle) (the library's "
                               "scheduler: scale_ray.live.program())")
        jid, tenant, app = ctx
        return ServiceProgram(jid, app, tenant)
    if isinstance(first, (ServiceWorkflow, str)):
        sid = first.id if isinstance(first, ServiceWorkflow) else first
        tenant = tenant or (first.tenant if isinstance(first, ServiceWorkflow) else job_tenant())
        return ServiceProgram(sid, app, tenant)
    try:  # the first step itself: checked on this side before anything is sent
        accept(first, inputs, kw_inputs, name)
    except WorkflowTypeError as e:
        raise WorkflowTypeError(f"client.program(first): {_first_line(e)}; client.program "
                                f"takes {PROGRAM_ACCEPTS}") from None
    if nothing_to_run(first):
        raise WorkflowTypeError("client.program(first): an empty Ray DAG has no step to start "
                                "a program with")
    step = submit(first, *inputs, name=name, app=app, tenant=tenant, **kw_inputs)
    return ServiceProgram(step.id, app, step.tenant, first=step)


def _first_line(e: Exception) -> str:
    """The reason of a refusal without its own list of what is accepted."""
    return str(e).split("; accepted: ")[0].splitlines()[0]


def _refusal(acc: dict) -> Exception:
    kind, message = acc["refused"], acc["message"]
    if kind == "quota":
        return QuotaExceeded(message, acc.get("retry_after_s"))
    return {"no_servers": NoServers, "does_not_fit": Unschedulable}.get(kind, WorkflowError)(
        message)


def cluster(app: str = DEFAULT_APP, tenant: str | None = None) -> dict:
    """``GET /v1/cluster`` as this job's tenant: servers (busy; the task for its own
    workflows), queue, policy, counters, journal."""
    return _retrying(app, "cluster", tenant=tenant or job_tenant())


__all__ = ["connect", "AuthNeeded", "submit", "cluster", "ServiceWorkflow", "WorkflowLost", "WorkflowFailed", "NoServers",
           "Unschedulable", "QuotaExceeded", "job_tenant", "DEFAULT_APP", "program",
           "ServiceProgram"]
