"""What a submission returns: :class:`WorkflowHandle` (wait for a workflow, read its results and
response times), shared by the live scheduler and the Ray-default runner, and the statistics over
handles (:func:`summarize`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from .workflow import Call, CollectedWorkflow

log = logging.getLogger(__name__)


class WorkflowFailed(RuntimeError):
    """The workflow did not complete; ``__cause__`` is the task's error."""


class WorkflowHandle:
    """A submitted workflow: wait for it, read its results and response times.

    ``result()`` returns the output's value (a list for several outputs); ``get(call)`` the value
    of any call of the workflow (a per-result handle); ``ref(call)`` its ObjectRef.
    """

    def __init__(self, wid: int, wf: CollectedWorkflow, submitted_wall: float):
        self.id = wid
        self.name = wf.spec.name
        self.workflow = wf
        self.submitted_wall = submitted_wall
        self.finished_wall: float | None = None
        self.error: BaseException | None = None
        self.task_finish_wall: list[float | None] = [None] * len(wf.calls)
        self.task_start_wall: list[float | None] = [None] * len(wf.calls)  # its latest run's
        self.task_nodes: list[str | None] = [None] * len(wf.calls)
        self.task_attempts: list[int] = [0] * len(wf.calls)
        self.result_refs: list[Any] = [None] * len(wf.calls)
        self._index = {id(c): i for i, c in enumerate(wf.calls)}
        self._done = threading.Event()
        self._cb_lock = threading.Lock()
        self._callbacks: list[Callable[[WorkflowHandle], None]] = []
        self.live_record: Any = None  # the scheduler's record of it (scale_ray.live.tasks.LiveWorkflow)
        self.tenant = ""  # whose it is, for the fair share (LiveScheduler.submit(tenant=...))
        self.key: str | None = None  # its idempotency key (LiveScheduler.submit(key=...))
        self.jid: str | None = None  # its journal id (scale_ray.live.journal)
        self.journal_fmt = "pickle"
        self.resumed_tasks: dict[int, tuple[Any, str, float]] | None = None  # done before a restart
        self.prior_runs: dict[int, int] = {}  # task -> runs started before a restart
        self.program: Any = None  # the agent program it is a step of (scale_ray.live.programs)
        self.pins = 0  # held steps waiting on its results: the journal keeps them (programs.hold)

    # -- set by the scheduler thread
    def record_task_start(self, i: int, node: str, now: float) -> None:
        """A run of task ``i`` started on ``node`` (its latest run: a run again after a loss
        moves both); a finished task keeps its record."""
        if self.task_finish_wall[i] is None:
            self.task_start_wall[i] = now
            self.task_nodes[i] = node

    def record_task_done(self, i: int, ref: Any, node: str, now: float) -> None:
        if self.task_finish_wall[i] is not None:
            raise AssertionError(f"workflow {self.id} task {i} completed twice")  # invariant
        self.result_refs[i] = ref
        self.task_nodes[i] = node
        self.task_finish_wall[i] = now

    def record_completion(self, now: float, error: BaseException | None = None) -> None:
        self.finished_wall = now
        self.error = error
        with self._cb_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:  # run on the scheduler thread: one that raises must not stop it
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - e.g. a waiter whose event loop has closed
                log.exception("workflow %s: a done callback raised", self.id)

    def add_done_callback(self, fn: Callable[["WorkflowHandle"], None]) -> None:
        """Call ``fn(handle)`` once the workflow is done (at once if it is; else on the
        scheduler thread: keep it short, e.g. ``loop.call_soon_threadsafe``)."""
        with self._cb_lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    # -- public
    def index(self, call: Call | int) -> int | None:
        """The position of ``call`` (a call of this workflow, or an index) in its calls."""
        if isinstance(call, int):
            return call if 0 <= call < len(self.workflow.calls) else None
        return self._index.get(id(call))

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the workflow completed or failed; False on timeout."""
        return self._done.wait(timeout)

    def _check(self, timeout: float | None) -> None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"workflow {self.id} ({self.name!r}) not done after {timeout} s")
        if self.error is not None:
            raise WorkflowFailed(f"workflow {self.id} ({self.name!r}) failed: {self.error}") \
                from self.error

    def ref(self, call: Call | int) -> Any:
        """ObjectRef of one call's result (after the workflow completed)."""
        self._check(None if self.done() else 0)
        i = call if isinstance(call, int) else self._index.get(id(call))
        if i is None:
            raise KeyError(f"{call!r} is not part of workflow {self.id}")
        return self.result_refs[i]

    def get(self, call: Call | int, timeout: float | None = None) -> Any:
        """Value of one call's result."""
        import ray

        self._check(timeout)
        return ray.get(self.ref(call))

    def result(self, timeout: float | None = None) -> Any:
        """Value of the output (a list when the workflow has several outputs)."""
        import ray

        self._check(timeout)
        vals = ray.get([self.result_refs[i] for i in self.workflow.outputs])
        return vals[0] if len(vals) == 1 else vals

    @property
    def response_s(self) -> float | None:
        """Wall seconds from submission to the last task's completion."""
        if self.finished_wall is None or self.error is not None:
            return None
        return self.finished_wall - self.submitted_wall

    def task_response_s(self) -> list[float | None]:
        """Per task: wall seconds from the workflow's submission to the task's completion."""
        return [None if f is None else f - self.submitted_wall for f in self.task_finish_wall]


class NothingToRun:
    """What ``submit`` returns for a Ray DAG with no task in it (``MultiOutputNode([])``): done
    at once, its ``result()`` is ``[]``, as ``ray.get(MultiOutputNode([]).execute())``."""

    id = None
    error = None
    response_s = 0.0
    submit_latency_s = 0.0

    def __init__(self, name: str = ""):
        self.name = name

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def result(self, timeout: float | None = None) -> list:
        return []

    def status(self, wait_s: float = 0.0) -> dict:
        return {"state": "completed", "name": self.name, "tasks": [], "response_s": 0.0}

    def cancel(self) -> bool:
        return False

    def task_response_s(self) -> list[float | None]:
        return []


def root_cause(err: BaseException) -> BaseException:
    """The primitive's own exception inside Ray's wrappers (``RayTaskError.cause``)."""
    seen = 0
    while seen < 8 and getattr(err, "cause", None) is not None and err.cause is not err:
        err, seen = err.cause, seen + 1
    return err


def _percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else math.nan


def summarize(handles: Sequence[WorkflowHandle], time_scale: float) -> dict[str, Any]:
    """Response-time statistics over ``handles`` (the ``--json`` keys of run-workflows)."""
    done = [h for h in handles if h.done() and h.error is None]
    failed = [h for h in handles if h.done() and h.error is not None]
    wresp = [h.response_s for h in done]
    tresp = [r for h in done for r in h.task_response_s() if r is not None]
    ts = time_scale if time_scale > 0 else 1.0
    out = {
        "workflows_submitted": len(handles),
        "workflows_completed": len(done),
        "workflows_failed": len(failed),
        "tasks_completed": len(tresp),
        "mean_workflow_response_s": float(np.mean(wresp)) if wresp else math.nan,
        "p95_workflow_response_s": _percentile(wresp, 95),
        "p99_workflow_response_s": _percentile(wresp, 99),
        "mean_task_response_s": float(np.mean(tresp)) if tresp else math.nan,
        "p95_task_response_s": _percentile(tresp, 95),
    }
    for k in ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s",
              "mean_task_response_s", "p95_task_response_s"):
        out[k[:-2] + "_model_s"] = out[k] / ts
    return out


def drain_handles(runner: Any, what: str, timeout: float | None,
           progress: Callable[[int, int], None] | None) -> bool:
    """Poll ``runner.handles()`` until all are done (True) or ``timeout`` passes (False); raise
    if the runner's thread died (``runner.thread_error``)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    while True:
        if runner.thread_error is not None:
            raise RuntimeError(f"{what} died") from runner.thread_error
        hs = runner.handles()
        left = sum(1 for h in hs if not h.done())
        if progress:
            progress(len(hs) - left, len(hs))
        if left == 0:
            return True
        if deadline is not None and time.perf_counter() > deadline:
            return False
        time.sleep(0.05)
