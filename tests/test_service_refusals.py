"""The scheduler service's HTTP API without Ray (issue 71 items 3, 6): the real FastAPI app of
serve_apps.scheduler (routes, middleware, error handlers) served by Starlette's test client,
its replica a SchedulerService whose LiveScheduler is a stand-in that accepts, holds and
cancels workflows. A redirect's ``Location`` is relative."""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from scale_ray.live.handles import WorkflowHandle
from serve_apps import errors
from serve_apps.errors import relative_location
from serve_apps.registry import Workflows
from serve_apps.tenants import IdSigner, Tenants
from serve_apps.workflow_api import AllowList

TOK_A, TOK_B = "tokA" + "a" * 28, "tokB" + "b" * 28
A = {"Authorization": f"Bearer {TOK_A}"}
B = {"Authorization": f"Bearer {TOK_B}"}
ONE = {"tasks": [{"name": "a", "compute_gflop": 1}]}


class _Sched:
    """What the service asks of its LiveScheduler: submits are held (never run) until
    cancelled; a submit takes ``submit_s`` (the journal's write)."""

    def __init__(self, submit_s: float = 0.0):
        self.submit_s = submit_s
        self.cfg = SimpleNamespace(time_scale=1.0)
        self.alive_servers = [SimpleNamespace(node=SimpleNamespace(compute=1.0))]
        self.closes: list[str] = []
        self.durable = SimpleNamespace(known=lambda t, k: None, journal=None,
                                       close_program=lambda h: self.closes.append(h.jid))
        self.admission = SimpleNamespace(work_s=lambda wf: [ts.compute_gflop
                                                            for ts in wf.spec.tasks])
        self.policy = SimpleNamespace(name="eft")

    def submit(self, wf, tenant, key, record, program):
        time.sleep(self.submit_s)
        h = WorkflowHandle(0, wf, time.perf_counter())
        h.jid, h.tenant = record.id, tenant
        if program is not None:
            program.add(h)
        return h

    def program(self, name, tenant, started_wall=None):
        from scale_ray.live.programs import Program

        return Program(self, name, tenant, 0.0, started_wall)

    def cancel(self, h: WorkflowHandle) -> Future:
        fut: Future = Future()
        was = not h.done()
        if was:
            h.record_completion(time.perf_counter(), RuntimeError("cancelled"))
        fut.set_result(was)
        return fut


class _Metrics:
    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def refused(self, tenant: str, reason: str) -> None:
        self.seen.append((tenant, reason))

    def finished(self, *a) -> None:
        pass

    def program_finished(self, *a) -> None:
        pass


@pytest.fixture
def service(monkeypatch):
    """(test client, the service instance, its metrics): tenants a and b by their tokens'
    hashes, 10 KB bodies at most."""
    from ray import serve

    from serve_apps.scheduler import SchedulerService, SchedulerTuning

    svc = object.__new__(SchedulerService.func_or_class)
    svc.tenants = Tenants({t: "sha256:" + hashlib.sha256(k.encode()).hexdigest()
                           for t, k in (("a", TOK_A), ("b", TOK_B))})
    svc.tuning = SchedulerTuning(max_body_bytes=10_000, max_queued_work_s_per_tenant=1e7)
    svc.metrics = _Metrics()
    svc.sched = _Sched()
    svc.allow, svc._doc = AllowList(()), (None, 0.0)
    svc._pool = ThreadPoolExecutor(4)
    svc.registry = Workflows(svc.sched, lambda: svc.tuning, IdSigner("inc1", b"k" * 32),
                             svc.metrics, svc._pool, "inc1")
    monkeypatch.setattr(serve, "get_replica_context",
                        lambda: SimpleNamespace(servable_object=svc))
    monkeypatch.setattr(errors.LIMITS, "max_body_bytes", 10_000)
    from serve_apps.scheduler import api

    with TestClient(api, base_url="http://127.0.0.1") as client:
        yield client, svc
    svc._pool.shutdown()


def test_a_redirect_never_names_the_host_the_client_sent(service):
    """Issue 71 (9): ``/v1/workflows/`` redirected to ``http://<Host header>/v1/workflows``.
    The ``Location`` is the path (and query) alone now."""
    http, _ = service
    for path, where in (("/v1/workflows/?x=1", "/v1/workflows?x=1"), ("/v1/cluster/",
                                                                       "/v1/cluster")):
        r = http.get(path, headers={**A, "Host": "evil.example"}, follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == where, r.headers
    assert relative_location(b"http://evil.example//other/x?q=1") == b"/other/x?q=1"
    assert relative_location(b"/v1/workflows") == b"/v1/workflows"
