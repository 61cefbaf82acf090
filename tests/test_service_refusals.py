"""The scheduler service's HTTP API without Ray (issue 71 items 3, 6): the real FastAPI app of
serve_apps.scheduler (routes, middleware, error handlers) served by Starlette's test client,
its replica a SchedulerService whose LiveScheduler is a stand-in that accepts, holds and
cancels workflows. Every refusal kind is audited once and counted; a redirect's ``Location`` is
relative; a DELETE of an agent program's first step cancels its appended steps; concurrent
HTTP submits cannot overshoot a quota together."""

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
from serve_apps.tenants import IdSigner, Tenants, audit_counts
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

    from serve_apps.scheduler import SchedulerCore, SchedulerTuning, local_door

    svc = object.__new__(SchedulerCore)
    svc.tenants = Tenants({t: "sha256:" + hashlib.sha256(k.encode()).hexdigest()
                           for t, k in (("a", TOK_A), ("b", TOK_B))})
    svc.tuning = SchedulerTuning(max_body_bytes=10_000, max_queued_work_s_per_tenant=1e7)
    svc.metrics = _Metrics()
    svc.sched = _Sched()
    svc.allow, svc._doc = AllowList(()), (None, 0.0)
    svc._pool = ThreadPoolExecutor(4)
    svc.registry = Workflows(svc.sched, lambda: svc.tuning, IdSigner("inc1", b"k" * 32),
                             svc.metrics, svc._pool, "inc1")
    door = local_door(svc, svc.tenants)
    monkeypatch.setattr(serve, "get_replica_context",
                        lambda: SimpleNamespace(servable_object=door))
    monkeypatch.setattr(errors.LIMITS, "max_body_bytes", 10_000)
    from serve_apps.scheduler import api

    with TestClient(api, base_url="http://127.0.0.1") as client:
        yield client, svc
    svc._pool.shutdown()


def _grew(before: dict) -> dict:
    after = audit_counts()
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def test_every_refusal_kind_is_audited_once_and_counted(service):
    """Issue 71 (7): cross-tenant 404, schema 422, ``not_allowed`` 422, 413, a bad
    Idempotency-Key and 409 had no audit line and no counter. Each is one ``audit refuse`` line
    now (counted per reason: ``ray_scale_scheduler_audit_total``) and one ``rejected`` count
    for its tenant (``?`` before authentication); none is counted twice."""
    http, svc = service
    theirs = http.post("/v1/workflows", json=ONE, headers=B).json()["id"]
    mine = http.post("/v1/workflows", json=ONE, headers=A).json()["id"]
    assert http.post(f"/v1/workflows/{mine}/tasks", json={"close": True}, headers=A
                     ).status_code == 200
    cases = [  # (request, status, reason, tenant of the count: ? before authentication)
        (lambda: http.get(f"/v1/workflows/{theirs}", headers=A), 404, "not_found", "a"),
        (lambda: http.delete(f"/v1/workflows/{theirs}", headers=A), 404, "not_found", "a"),
        (lambda: http.post("/v1/workflows", json={"tasks": [ONE["tasks"][0], {}]}, headers=A),
         422, "schema", "a"),
        (lambda: http.post("/v1/workflows", json={"tasks": [
            {"name": "a", "compute_gflop": 1, "primitive": "os:system"}]}, headers=A),
         422, "not_allowed", "a"),
        (lambda: http.post("/v1/workflows", content=b"x" * 20_000, headers=A), 413,
         "body_too_large", "?"),
        (lambda: http.post("/v1/workflows", json=ONE, headers={**A, "Idempotency-Key": "a\tb"}),
         422, "bad_key", "a"),
        (lambda: http.post(f"/v1/workflows/{mine}/tasks", json=ONE, headers=A), 409,
         "program_closed", "a"),
        (lambda: http.post("/v1/workflows", json={**ONE, "program": mine}, headers=A), 409,
         "program_closed", "a"),
        (lambda: http.get(f"/v1/workflows/{mine}?wait_s=abc", headers=A), 422, "schema", "?"),
        (lambda: http.get("/v1/cluster"), 401, "unauthorized", "?"),
    ]
    for send, status, reason, tenant in cases:
        before, seen = audit_counts(), len(svc.metrics.seen)
        r = send()
        assert r.status_code == status, (reason, r.text)
        assert _grew(before) == {("refuse", reason): 1}, (reason, _grew(before))
        assert svc.metrics.seen[seen:] == [(tenant, reason)], reason


def test_refusals_write_their_audit_line(service, caplog):
    http, _ = service
    theirs = http.post("/v1/workflows", json=ONE, headers=B).json()["id"]
    with caplog.at_level("INFO", logger="ray.serve.scale_audit"):
        assert http.get(f"/v1/workflows/{theirs}", headers=A).status_code == 404
        assert http.post("/v1/workflows", content=b"x" * 20_000, headers=A).status_code == 413
    lines = [r.getMessage() for r in caplog.records if r.name == "ray.serve.scale_audit"]
    assert f"audit refuse tenant=a id={theirs} reason='not_found' status='404' " \
           "field='path.id'" in lines, lines
    assert any("tenant=? id=- reason='body_too_large' status='413'" in ln for ln in lines), lines
    assert TOK_A not in "".join(lines)


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


def test_deleting_a_programs_first_step_cancels_its_appended_steps(service):
    """Issue 71 (6): a DELETE of an agent program's first step left its appended steps
    running. It cancels every step now (``steps_cancelled``: those still running besides the
    first), closes the program (journaled), and a later append or ``program`` naming it is a
    409; a DELETE of a later step cancels that step only."""
    http, svc = service
    first = http.post("/v1/workflows", json={"tasks": [{"name": "think", "compute_gflop": 1}]},
                      headers=A).json()["id"]
    steps = [http.post(f"/v1/workflows/{first}/tasks", json={"tasks": [
        {"name": f"tool{i}", "compute_gflop": 1, "parents": ["think"] if i == 0 else []}]},
        headers=A).json()["id"] for i in range(2)]
    step3 = http.post("/v1/workflows", json={**ONE, "program": first}, headers=A).json()["id"]
    handles = [svc.registry.handles[w] for w in (first, *steps, step3)]
    r = http.delete(f"/v1/workflows/{step3}", headers=A)  # a later step: itself only
    assert r.json() == {"id": step3, "cancelled": True, "state": "failed"}
    assert [h.done() for h in handles] == [False, False, False, True]
    r = http.delete(f"/v1/workflows/{first}", headers=A)
    assert r.status_code == 200 and r.json()["cancelled"] is True
    assert r.json()["steps_cancelled"] == 2  # (step3 had ended)
    assert all(h.done() for h in handles) and handles[0].program.closed
    assert svc.sched.closes == [first]
    assert http.post(f"/v1/workflows/{first}/tasks", json=ONE, headers=A).status_code == 409
    r = http.post("/v1/workflows", json={**ONE, "program": steps[0]}, headers=A)
    assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["body", "program"]
    assert http.delete(f"/v1/workflows/{first}", headers=A).json()["steps_cancelled"] == 0
    # a workflow on its own is cancelled as before
    alone = http.post("/v1/workflows", json=ONE, headers=A).json()["id"]
    assert http.delete(f"/v1/workflows/{alone}", headers=A).json() == {
        "id": alone, "cancelled": True, "state": "failed"}


def test_concurrent_http_submits_cannot_overshoot_a_quota(service):
    """Issue 71 (3) over HTTP: three concurrent 2,000-task submits of 7.2e6 resource-seconds
    each (3,600 s per task) against a 1e7 cap: one 201, two 429s, in every trial."""
    http, svc = service
    svc.tuning = type(svc.tuning)(max_queued_work_s_per_tenant=1e7, max_body_bytes=1 << 20)
    errors.LIMITS.max_body_bytes = 1 << 20
    svc.sched.submit_s = 0.01
    big = {"tasks": [{"name": f"t{i}", "compute_gflop": 3600} for i in range(2000)]}
    for trial in range(3):
        go, codes = threading.Barrier(3), []

        def post() -> None:
            go.wait()
            codes.append(http.post("/v1/workflows", json=big, headers=A).status_code)
        threads = [threading.Thread(target=post) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [201, 429, 429], (trial, codes)
        assert svc.registry.inflight["a"][2] == pytest.approx(7.2e6)
        for wid, h in svc.registry.items():
            svc.sched.cancel(h)
        assert svc.registry.inflight["a"][2] == pytest.approx(0.0)
