"""Test helper: the real LiveScheduler thread over a stand-in for Ray's client calls, so that
submit -> place -> run is driven through the scheduler's own loop without a cluster.

What is stood in (``monkeypatch``, undone when the test ends): ``ray.nodes`` (the cluster's
nodes, as Ray reports them), ``ray.wait`` / ``ray.get`` / ``ray.cancel`` / ``ray.put`` /
``ray.kill``, and the last step of a run's submission: the scheduler builds the run's Ray
function and calls Ray's own ``.options()`` on it (Ray's option validation, no cluster needed),
then ``.remote()`` runs the primitive's body at once in this process and returns stand-in refs.
Only ``executor: task`` runs (server actors need a cluster)."""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import ray

from scale_ray.live import LiveConfig, LiveScheduler
from scale_ray.live.executors import RemoteCache


def node_id(i: int) -> str:
    """A node id Ray's NodeAffinitySchedulingStrategy takes (56 hex digits)."""
    return f"{i + 1:056x}"


def raw_node(i: int, resources: dict[str, float], labels: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """One alive node as ``ray.nodes()`` reports it."""
    return {"NodeID": node_id(i), "Alive": True, "Resources": dict(resources),
            "Labels": dict(labels or {})}


class Ref:
    """A stand-in ObjectRef: its value, or the error ``ray.get`` raises."""
    _ids = itertools.count()

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.id, self.value, self.error = next(self._ids), value, error

    def __repr__(self) -> str:
        return f"Ref({self.id})"


def _get(ref: Any, timeout: float | None = None) -> Any:
    if isinstance(ref, list):
        return [_get(r) for r in ref]
    if ref.error is not None:
        raise ref.error
    return ref.value


def _wait(refs: list, num_returns: int = 1, timeout: float | None = None,
          fetch_local: bool = True) -> tuple[list, list]:
    # every stand-in run has returned: the first ones come back
    return list(refs[:num_returns]), list(refs[num_returns:])


class _Submitted:
    """``.remote()`` of a run: the body runs now; (value ref, status ref) as Ray returns them."""

    def __init__(self, fn: Callable[..., Any], node: str, log: list):
        self.fn, self.node, self.log = fn, node, log

    def remote(self, meta: tuple, *args: Any, **kwargs: Any) -> tuple[Ref, Ref]:
        args = [_get(a) if isinstance(a, Ref) else a for a in args]
        kwargs = {k: _get(v) if isinstance(v, Ref) else v for k, v in kwargs.items()}
        self.log.append(self.node)
        try:
            value = self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the primitive raised: ray.get raises it
            return Ref(error=e), Ref(error=e)
        return Ref(value), Ref((self.node, 0.0))


def install(monkeypatch: Any, nodes: list[dict[str, Any]]) -> list[str]:
    """Stand in for Ray's client calls (module docstring) on a cluster of ``nodes``; returns the
    list each run's node id is appended to."""
    runs: list[str] = []
    real_pinned = RemoteCache.pinned

    def pinned(self, fn, node, name, options=None):
        real_pinned(self, fn, node, name, options)  # Ray's .options() validates the options
        return _Submitted(fn, node, runs)

    monkeypatch.setattr(RemoteCache, "pinned", pinned)
    monkeypatch.setattr(ray, "nodes", lambda: [dict(n) for n in nodes])
    monkeypatch.setattr(ray, "wait", _wait)
    monkeypatch.setattr(ray, "get", _get)
    monkeypatch.setattr(ray, "put", lambda v: Ref(v))
    monkeypatch.setattr(ray, "cancel", lambda *a, **k: None)
    monkeypatch.setattr(ray, "kill", lambda *a, **k: None)
    return runs


def scheduler(monkeypatch: Any, nodes: list[dict[str, Any]], policy: str = "eft",
              **live: Any) -> tuple[LiveScheduler, list[str]]:
    """A started LiveScheduler (``executor: task``) on the stand-in cluster ``nodes``; the
    caller shuts it down. Returns it and the run log (:func:`install`)."""
    from policies import get_policy
    from scale_ray.config import load_env

    runs = install(monkeypatch, nodes)
    env = load_env(None, servers=4)
    cfg = LiveConfig(**({"executor": "task", "time_scale": 0.0, "wait_s": 0.002} | live))
    return LiveScheduler(get_policy(policy, env), env, cfg).start(), runs


class Crash(BaseException):
    """What no guard of the scheduler catches (a crash nothing foresaw)."""


def crash_on(monkeypatch: Any, name: str) -> None:
    """Admitting a workflow named ``name`` kills the scheduler thread (:class:`Crash`)."""
    from scale_ray.live.admission import Admission

    admit = Admission.admit

    def crashing(self, h):
        if h.workflow.spec.name == name:
            raise Crash(f"{name} stops the scheduler")
        return admit(self, h)

    monkeypatch.setattr(Admission, "admit", crashing)


def wait_dead(sched: LiveScheduler, timeout: float = 10.0) -> None:
    """Wait until the scheduler thread has died."""
    deadline = time.monotonic() + timeout
    while sched.thread_error is None:
        assert time.monotonic() < deadline, "the scheduler thread is still alive"
        time.sleep(0.005)


def wait_done(handles: list, timeout: float = 30.0) -> bool:
    """Wait until every handle is done; False on timeout."""
    deadline = time.monotonic() + timeout
    while not all(h.done() for h in handles):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True
