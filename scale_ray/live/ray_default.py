"""Ray's own placement, for comparison: the same workflows as plain Ray tasks placed by Ray's
default scheduler (:class:`RayDefaultRunner`), with the live scheduler's handles and statistics."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

from envs.config import EnvConfig, build
from envs.workload import WorkflowError, WorkflowSpec

from .cluster import SLOT_RESOURCE, TIER_LABEL
from .config import LiveConfig
from .executors import node_task_options, wrap_body
from .handles import NothingToRun, WorkflowHandle, drain_handles, summarize
from .raydag import accept, nothing_to_run
from .workflow import Call, CollectedWorkflow

log = logging.getLogger(__name__)


class RayDefaultRunner:
    """The same workflows as plain Ray tasks placed by Ray's default scheduler.

    In Ray's resource model (``LiveConfig.model: nodes``, the default on plain Ray nodes) each
    task asks Ray for exactly what the scheduler's own Ray task would (its Ray demands:
    ``executors.node_task_options``) and Ray places it. In the slot model, for a fair
    comparison each task asks for what the model requires of a server: one
    ``scale_slot`` (so a server runs one primitive at a time, as under the scheduler), the same
    ``task_num_cpus`` as the scheduler's tasks, and, through a label selector on ``scale.tier``,
    only tiers whose memory fits the task. A workflow's tasks are
    all submitted on arrival with parents' results as object refs (Ray orders them); the emulated
    run time is its true compute (``run_gflop``: with noise, not the declared) / compute *
    ``time_scale`` with the compute of the node Ray chose.
    Ray retries a lost task up to ``max_retries`` times. Same handles and statistics as
    :class:`LiveScheduler`.
    """

    name = "ray-default"

    def __init__(self, env: EnvConfig | None = None, config: LiveConfig | dict | None = None):
        self.env = env or EnvConfig()
        self.cfg: LiveConfig = build(LiveConfig, config, "live") if not isinstance(
            config, LiveConfig) else config
        self._tiers = tuple(self.env.cluster.tiers)
        self._fns: dict[int, Any] = {}
        self._keep: list[Any] = []
        self._lock = threading.Lock()
        self._handles: list[WorkflowHandle] = []
        self._running: dict[Any, tuple[WorkflowHandle, int, Any]] = {}
        self._done_count: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.thread_error: BaseException | None = None
        self.node_tasks: dict[str, int] = {}
        self._model: str | None = None  # slots or nodes (_slotted)
        self.thread_cpu_s = 0.0  # CPU of the runner's thread (ray.wait, ray.get of every run)

    def _remote(self, fn: Callable[..., Any]) -> Any:
        rf = self._fns.get(id(fn))
        if rf is None:
            import ray

            rf = ray.remote(num_returns=2, num_cpus=self.cfg.task_num_cpus,
                            max_retries=self.cfg.max_retries)(wrap_body(fn))
            self._fns[id(fn)] = rf
            self._keep.append(fn)
        return rf

    def start(self) -> "RayDefaultRunner":
        self._thread = threading.Thread(target=self._loop, name="scale-ray-default", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "RayDefaultRunner":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def handles(self) -> list[WorkflowHandle]:
        with self._lock:
            return list(self._handles)

    def submit(self, workflow: Call | Sequence[Call] | WorkflowSpec | CollectedWorkflow | Any,
               *inputs: Any, name: str = "", **kw_inputs: Any) -> WorkflowHandle | NothingToRun:
        """As :meth:`scale_ray.live.LiveScheduler.submit`, placed by Ray."""
        if nothing_to_run(workflow):
            return NothingToRun(name)
        wf = accept(workflow, inputs, kw_inputs, name)
        slotted = self._slotted()
        selectors = []
        for i, t in enumerate(wf.spec.tasks):
            if not slotted:  # whole Ray nodes: the task's own demands, nothing else
                continue
            fit = [tier.name for tier in self._tiers if tier.memory_gb >= t.memory_gb]
            if not fit:
                raise WorkflowError(f"workflow {wf.spec.name!r}: task {i} ({t.name!r}) needs "
                                    f"memory_gb={t.memory_gb:g}, which fits no configured tier")
            selectors.append({TIER_LABEL: f"in({','.join(fit)})"})
        ts = self.cfg.time_scale
        with self._lock:
            h = WorkflowHandle(len(self._handles), wf, time.perf_counter())
            self._handles.append(h)
            value_refs: list[Any] = []
            status_refs: list[Any] = []
            for i, call in enumerate(wf.calls):
                ref_of = {id(wf.calls[p]): value_refs[p] for p in wf.spec.tasks[i].parents}
                args = [ref_of[id(a)] if isinstance(a, Call) else a for a in call.args]
                kwargs = {k: ref_of[id(v)] if isinstance(v, Call) else v
                          for k, v in call.kwargs.items()}
                prim = call.primitive
                if not slotted:  # what the scheduler's own Ray task asks for (model nodes)
                    opts = node_task_options(prim)
                else:
                    opts = dict(prim.ray_options)  # a Ray DAG node's options: Ray honours them
                    opts["resources"] = {**opts.get("resources", {}), SLOT_RESOURCE: 1.0}
                    opts["label_selector"] = {**opts.get("label_selector", {}), **selectors[i]}
                gflop = prim.run_gflop * ts if prim.emulate else 0.0  # its true compute
                meta: tuple = (None, 0.0, gflop)
                inputs = self._inputs(wf, i, status_refs) if gflop > 0 else ()
                if inputs:
                    meta = (None, 0.0, gflop, 0, None, False, inputs)
                v, s = self._remote(prim.fn).options(name=prim.name, **opts).remote(
                        meta, *args, **kwargs)
                value_refs.append(v)
                status_refs.append(s)
                self._running[s] = (h, i, v)
            self._done_count[h.id] = 0
        return h

    def _slotted(self) -> bool:
        """Servers of one slot (``LiveConfig.model``; ``auto``: when an alive node has
        ``scale_slot`` servers), read once."""
        if self._model is None:
            model = self.cfg.model
            if model == "auto":
                import ray

                model = "slots" if any((n.get("Resources") or {}).get(SLOT_RESOURCE, 0) >= 1
                                       for n in ray.nodes() if n.get("Alive")) else "nodes"
            self._model = model
        return self._model != "nodes"

    def _inputs(self, wf: CollectedWorkflow, i: int, status_refs: list[Any]) -> tuple:
        """Task ``i``'s emulated inputs, as the live scheduler emulates them (env
        ``mdp.transfer_delays_start``): per parent, its run's status ref (where it ran; nested,
        so Ray does not resolve it) and its output's transfer time in wall s. The body sleeps the
        largest transfer among parents that ran on another node (same node: the object store
        shares it; the scheduler, finer, charges any other server)."""
        if not self.env.mdp.transfer_delays_start:
            return ()
        net, ts = self.env.cluster.network, self.cfg.time_scale
        return tuple((status_refs[p], net.transfer_s(wf.calls[p].primitive.output_gb) * ts)
                     for p in wf.spec.tasks[i].parents)

    def _loop(self) -> None:
        import ray

        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set():
                self.thread_cpu_s = time.thread_time() - cpu0
                with self._lock:
                    refs = list(self._running)
                if not refs:
                    time.sleep(self.cfg.wait_s)
                    continue
                done, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.wait_s)
                if not done:
                    continue
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                now = time.perf_counter()
                for ref in done:
                    with self._lock:
                        h, i, v = self._running.pop(ref)
                    if h.done():
                        continue
                    try:
                        node = ray.get(ref)[0]  # (node, run_s)
                    except Exception as e:
                        h.record_completion(now, e)
                        continue
                    h.record_task_done(i, v, node, now)
                    self.node_tasks[node] = self.node_tasks.get(node, 0) + 1
                    self._done_count[h.id] += 1
                    if self._done_count[h.id] == len(h.workflow.calls):
                        h.record_completion(now)
        except BaseException as e:
            log.exception("ray-default runner thread failed")
            self.thread_error = e
        finally:  # the last round's CPU too (summary() is read after shutdown)
            self.thread_cpu_s = time.thread_time() - cpu0

    def drain(self, timeout: float | None = None, progress: Callable[[int, int], None] | None = None
              ) -> bool:
        """Wait until every submitted workflow finished; False on timeout."""
        return drain_handles(self, "the ray-default runner thread", timeout, progress)

    def summary(self) -> dict[str, Any]:
        out = summarize(self.handles(), self.cfg.time_scale)
        out["policy"] = self.name
        out["tasks_per_node"] = dict(self.node_tasks)
        out["thread_cpu_s"] = self.thread_cpu_s
        return out
