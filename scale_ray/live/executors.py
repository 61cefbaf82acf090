"""How a primitive runs on Ray: the task body around it (placement check, emulated run time) and
the remote functions and server actors that run that body.

With ``executor="actor"`` (default) every server has one actor hard-pinned to its node
(``NodeAffinitySchedulingStrategy(soft=False)``, ``max_concurrency=1``, no restarts) and a task
is a call of that actor, so successive runs reuse its leased worker. With ``executor="task"``
every task is a plain Ray task hard-pinned to the chosen node (a worker lease per run: about half
the throughput on a small machine). A primitive with Ray options (``num_gpus``, ``resources``,
``runtime_env``...: a Ray DAG node's ``.options()``) always runs as such a pinned Ray task, asking
Ray for what its options name, so that Ray gives it its GPUs and its runtime env. Ray's own retries are off (``max_retries=0``): a primitive
runs only when the scheduler says so.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from . import journal
from .cluster import COMPUTE_LABEL, GPU_COMPUTE_LABEL
from .config import PlacementError


# Ray errors that mean "the run was lost, not the primitive's fault": retried by the scheduler.
@functools.cache
def system_errors() -> tuple[type, ...]:
    import ray.exceptions as rex

    names = ("NodeDiedError", "WorkerCrashedError", "TaskUnschedulableError", "ObjectLostError",
             "LocalRayletDiedError", "RaySystemError", "ObjectFetchTimedOutError",
             "OwnerDiedError", "ReferenceCountingAssertionError", "OutOfMemoryError",
             # executor=actor: the server's actor died (node gone, worker crashed) or could
             # not be placed (its node left before the actor started)
             "RayActorError", "ActorUnschedulableError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


def is_lost_output(err: BaseException) -> bool:
    import ray.exceptions as rex

    return isinstance(err, getattr(rex, "ObjectLostError", ()))


class RunCancelled(Exception):
    """A run the scheduler cancelled (its workflow was cancelled or failed, or the other run of
    a hedged task finished first) stopped before its body."""


CANCEL_POLL_S = 0.02  # how often an emulated run checks whether it was cancelled


def _sleep(seconds: float, ctx: Any) -> bool:
    """Sleep ``seconds`` (the emulated run time), checking every :data:`CANCEL_POLL_S` whether
    ``ray.cancel`` was called on this run (a hedged task's loser); True if it was. A plain Ray
    task gets a KeyboardInterrupt from ``ray.cancel`` instead; an actor call only a flag."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, CANCEL_POLL_S))
        try:
            if ctx.is_canceled():
                return True
        except RuntimeError:  # not a worker (a local call): nothing can cancel it
            pass


def _ray_placed_sleep(ray: Any, ctx: Any, node: str, gflop_scaled: float,
                      inputs: tuple | None) -> float:
    """An emulated run placed by Ray (``wrap_body``): its compute at the speed label of the node
    it landed on (a GPU run at the GPU speed, if the node has one), plus the largest emulated
    transfer of ``inputs`` whose parent ran on another node."""
    labels = ctx.get_node_labels()
    key = GPU_COMPUTE_LABEL if GPU_COMPUTE_LABEL in labels and \
        ctx.get_assigned_resources().get("GPU") else COMPUTE_LABEL
    sleep_s = gflop_scaled / float(labels[key])
    if inputs:
        ran_on = ray.get([r for r, _ in inputs])
        sleep_s += max((tr for (nd, _), (_, tr) in zip(ran_on, inputs) if nd != node),
                       default=0.0)
    return sleep_s


def wrap_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Ray task body around a primitive: placement check, emulated run time, the call.

    ``meta = (expected_node_id | None, sleep_s, gflop_scaled[, attempt, journal_target,
    cancellable[, inputs[, step]]])``: with ``gflop_scaled`` > 0 (Ray's own placement) the sleep is
    computed from the capacity label of the node it landed on, plus the largest transfer
    (wall s) of ``inputs`` = ``((parent status ref, transfer_s), ...)`` whose parent ran on
    another node; ``attempt`` is what
    :func:`scale_ray.live.journal.attempt` reads in the body; with a ``journal_target`` the run
    writes its start marker first and its result before it returns
    (:mod:`scale_ray.live.journal`); a ``cancellable`` run (every run the live scheduler
    starts) checks during its emulated sleep whether it was cancelled (others, Ray's own
    placement's, sleep in one piece); ``step`` is what :func:`scale_ray.live.journal.current_step`
    returns in the body (the scheduler service's workflow id, tenant and app). Returns ``(value,
    (node_id, run_s))``, ``run_s`` the seconds the run took in the worker (emulated sleep and
    body: what the run-time estimator learns, without dispatch and polling delays); the
    scheduler waits on the small second part only.
    """
    # positional-only: a primitive's own keyword arguments may be named meta (or key)
    def run(meta: tuple, /, *args: Any, **kwargs: Any) -> tuple[Any, tuple[str, float]]:
        import ray

        t0 = time.perf_counter()
        expected, sleep_s, gflop_scaled = meta[:3]
        n, target = meta[3:5] if len(meta) > 3 else (0, None)
        cancellable = len(meta) > 5 and meta[5]  # the scheduler may ray.cancel it
        ctx = ray.get_runtime_context()
        node = ctx.get_node_id()
        if expected is not None and node != expected:
            raise PlacementError(f"pinned to node {expected} but running on {node}")
        if target is not None:
            journal.record_start(target)
        if gflop_scaled > 0:
            sleep_s = _ray_placed_sleep(ray, ctx, node, gflop_scaled, meta[6] if len(meta) > 6
                                        else None)
        if sleep_s > 0:
            if not cancellable:
                time.sleep(sleep_s)
            elif _sleep(sleep_s, ctx):
                raise RunCancelled("cancelled by the scheduler (its workflow is over, or a "
                                   "hedged copy finished first)")
        journal.set_attempt(n)
        journal.set_step(meta[7] if len(meta) > 7 else None)
        try:
            value = fn(*args, **kwargs)
        finally:
            journal.set_attempt(0)
            journal.set_step(None)
        run_s = time.perf_counter() - t0
        if target is not None:
            journal.record_result(target, value, node)
        return value, (node, run_s)

    run.__name__ = getattr(fn, "__name__", "primitive")
    run.__qualname__ = run.__name__
    return run


def _server_actor_class() -> Any:
    """The Ray actor class of one server (``executor=actor``): it holds the server's primitive
    bodies (sent once per body with ``register``) and runs them one at a time with ``run``; being
    an actor, it keeps its leased worker, so a run costs an actor call instead of a lease."""
    import ray

    class ScaleServer:
        def __init__(self) -> None:
            # Every body imports this package (wrap_body's globals): import it while start()
            # waits for the actor, not in the server's first run (measured live: the first run
            # on each server took 0.6 model s = 150 ms wall longer, results/live_twin/README.md).
            import scale_ray.live.executors  # noqa: F401

            self._bodies: dict[int, Callable[..., Any]] = {}

        def register(self, key: int, body: Callable[..., Any]) -> None:
            self._bodies[key] = body

        @ray.method(num_returns=2)
        def run(self, key: int, meta: tuple, /, *args: Any, **kwargs: Any) -> tuple[Any, tuple]:
            return self._bodies[key](meta, *args, **kwargs)

    return ray.remote(ScaleServer)


PINNED_MAX = 4096  # pinned variants kept (RemoteCache.pinned), the oldest dropped first


def node_task_options(prim: Any) -> dict[str, Any]:
    """Ray's resource model (``LiveConfig.model: nodes``): the options of the Ray task that runs
    ``prim``, asking Ray for exactly the demands the scheduler tracks (``Primitive.ray_demands``:
    CPUs, GPUs, memory, custom resources, accelerator type, label selector), so Ray never queues
    it on a node the scheduler thought free."""
    d = dict(prim.ray_demands)
    out: dict[str, Any] = {"num_cpus": d.pop("CPU", 0.0), "num_gpus": d.pop("GPU", 0.0)}
    mem = d.pop("memory", 0.0)
    if mem > 0:
        out["memory"] = int(round(mem * 1e9))
    custom = {k: v for k, v in d.items() if not k.startswith(("accelerator_type:", "label:"))}
    if custom:
        out["resources"] = custom
    for k in ("accelerator_type", "label_selector", "runtime_env"):
        if k in prim.ray_options:
            out[k] = prim.ray_options[k]
    return out


class RemoteCache:
    """One ``ray.remote`` function per primitive body (Ray exports each once), and its pinned
    variants: ``.options()`` validates every option on each call (it cost about as much as the
    submission itself here), so the scheduler builds one per (body, node, name) and reuses it."""

    def __init__(self, num_cpus: float, blank_env: tuple[str, ...] = ()) -> None:
        self.num_cpus = num_cpus
        # variables every worker it starts sees as "" (LiveConfig.worker_env_blank): a
        # runtime_env's env_vars, merged into a primitive's own runtime_env
        self.runtime_env = {"env_vars": {k: "" for k in blank_env}} if blank_env else None
        self._fns: dict[int, Any] = {}
        self._bodies: dict[int, Callable[..., Any]] = {}
        self._keep: list[Any] = []
        self._pinned: dict[tuple[int, str, str], Any] = {}
        self._actor_cls: Any = None

    def actor(self, node_id: str) -> Any:
        """A new server actor hard-pinned to ``node_id``; Ray never restarts or retries it (a
        lost run is the scheduler's to place again)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = _server_actor_class()
        extra = {"runtime_env": self.runtime_env} if self.runtime_env else {}
        return self._actor_cls.options(
            num_cpus=self.num_cpus, max_concurrency=1, max_restarts=0, max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **extra).remote()

    def body(self, fn: Callable[..., Any]) -> tuple[int, Callable[..., Any]]:
        """(key, task body) of a primitive, for a server actor's ``register``."""
        key = id(fn)
        b = self._bodies.get(key)
        if b is None:
            b = self._bodies[key] = wrap_body(fn)
            self._keep.append(fn)
        return key, b

    def pinned(self, fn: Callable[..., Any], node_id: str, name: str,
               options: dict[str, Any] | None = None) -> Any:
        """``get(fn)`` hard-pinned to ``node_id`` (NodeAffinitySchedulingStrategy, soft=False),
        with the primitive's Ray ``options`` (:meth:`ray_task_options`) when it has any."""
        key = (id(fn), node_id, name, repr(sorted(options.items())) if options else "")
        rf = self._pinned.get(key)
        if rf is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            rf = self.get(fn).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), name=name,
                **(options or {}))
            if len(self._pinned) >= PINNED_MAX:  # tasks' own demands vary (memory): bounded
                del self._pinned[next(iter(self._pinned))]
            self._pinned[key] = rf
        return rf

    def ray_task_options(self, ray_options: dict[str, Any], actors: bool) -> dict[str, Any]:
        """The options of the Ray task that runs a primitive with Ray options: its GPUs, memory,
        resources, accelerator type and runtime env as asked; CPUs: none with server actors (the
        server's actor holds its CPU and the server runs one task at a time), else the task's
        ``num_cpus`` (default ``task_num_cpus``)."""
        out = {k: v for k, v in ray_options.items() if k != "num_cpus"}
        out["num_cpus"] = 0 if actors else ray_options.get("num_cpus", self.num_cpus)
        if self.runtime_env:  # its own runtime env, with the blanked variables on top
            own = dict(out.get("runtime_env") or {})
            own["env_vars"] = {**(own.get("env_vars") or {}), **self.runtime_env["env_vars"]}
            out["runtime_env"] = own
        return out

    def node_task_options(self, prim: Any) -> dict[str, Any]:
        """Ray's resource model: :func:`node_task_options`, with the blanked variables of
        ``worker_env_blank`` in its runtime env."""
        out = node_task_options(prim)
        if self.runtime_env:  # its own runtime env, with the blanked variables on top
            own = dict(out.get("runtime_env") or {})
            own["env_vars"] = {**(own.get("env_vars") or {}), **self.runtime_env["env_vars"]}
            out["runtime_env"] = own
        return out

    def forget_node(self, node_id: str) -> None:
        """Drop the pinned variants of a node that left the cluster."""
        for key in [k for k in self._pinned if k[1] == node_id]:
            del self._pinned[key]

    def get(self, fn: Callable[..., Any]) -> Any:
        key = id(fn)
        rf = self._fns.get(key)
        if rf is None:
            import ray

            extra = {"runtime_env": self.runtime_env} if self.runtime_env else {}
            rf = ray.remote(num_returns=2, max_retries=0, num_cpus=self.num_cpus,
                            **extra)(wrap_body(fn))
            self._fns[key] = rf
            self._keep.append(fn)  # keep id() stable
        return rf
