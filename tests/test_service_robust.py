"""Nothing a request carries stops the scheduler (issue 71 item 1): the scheduler service's real
FastAPI app over a real LiveScheduler whose thread runs on a stand-in for Ray's client calls
(tests/fake_ray.py: Ray's own ``.options()`` validates every run's options; bodies run in this
process). The issue's three bodies, generated Ray options thrown at submit -> place -> run, and
failures at placement or at Ray's ``.options()`` that fail their workflow, never the thread."""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from fake_ray import crash_on, raw_node, scheduler, wait_dead
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from serve_apps import errors
from serve_apps.durable import rebuild
from serve_apps.registry import Workflows
from serve_apps.tenants import IdSigner, Tenants
from serve_apps.workflow_api import AllowList

TOK_A, TOK_B = "tokA" + "a" * 28, "tokB" + "b" * 28
A = {"Authorization": f"Bearer {TOK_A}"}
B = {"Authorization": f"Bearer {TOK_B}"}
ONE = {"tasks": [{"name": "a", "compute_gflop": 1}]}
#: the issue's bodies: each was accepted with 201 and killed the scheduler thread
ZERO_CPUS = {"tasks": [{"name": "a", "compute_gflop": 0.01, "num_cpus": 0}]}
FINE_CPUS = {"tasks": [{"name": "a", "compute_gflop": 0.01, "num_cpus": 0.00005, "memory_gb": 1}]}
LONG_PREFIX = {"tasks": [{"name": "a", "compute_gflop": 0.01,
                          "label_selector": {"a" * 100 + "/k": "!v"}}]}

#: a plain-node cluster (Ray's resource model): CPUs, a GPU node with an accelerator type, a
#: custom resource and labels
PLAIN = [raw_node(0, {"CPU": 4, "memory": 16e9}, {"zone": "z1"}),
         raw_node(1, {"CPU": 8, "GPU": 2, "accelerator_type:A100": 1, "memory": 64e9,
                      "tok": 4}, {"zone": "z2", "ray.io/market": "spot"})]
#: scale server nodes (the paper's servers, one task each)
SLOTS = [raw_node(0, {"CPU": 4, "scale_slot": 2, "scale_compute": 2.0, "scale_memory_gb": 8.0,
                      "memory": 16e9}),
         raw_node(1, {"CPU": 4, "GPU": 1, "scale_slot": 1, "scale_compute": 4.0,
                      "scale_memory_gb": 32.0, "memory": 32e9, "tok": 2})]


class _Metrics:
    def refused(self, tenant: str, reason: str) -> None:
        pass

    def finished(self, *a) -> None:
        pass

    def program_finished(self, *a) -> None:
        pass


def _service(monkeypatch, nodes, storage=None):
    """(test client, service, scheduler): the real app and registry over a LiveScheduler on the
    stand-in cluster ``nodes``; tenants a and b; with a journal at ``storage``, what it holds
    resumed as the service resumes it."""
    from ray import serve

    from serve_apps.scheduler import SchedulerCore, SchedulerTuning, api, local_door

    sched, _ = scheduler(monkeypatch, nodes, storage=storage)
    svc = object.__new__(SchedulerCore)
    svc.tenants = Tenants({t: "sha256:" + hashlib.sha256(k.encode()).hexdigest()
                           for t, k in (("a", TOK_A), ("b", TOK_B))})
    svc.tuning = SchedulerTuning(max_queued_work_s_per_tenant=1e12)
    svc.metrics = _Metrics()
    svc.sched = sched
    svc.t0, svc.epoch = sched.clock_origin, 0.0
    svc.allow, svc._doc = AllowList(()), (None, 0.0)
    svc._pool = ThreadPoolExecutor(4)
    svc.registry = Workflows(sched, lambda: svc.tuning, IdSigner("inc1", b"k" * 32),
                             svc.metrics, svc._pool, "inc1")
    for h in sched.resume(lambda sub: rebuild(sub, svc.allow, svc.tuning, *svc._doc)):
        svc.registry.register(h.jid, h, h.tenant)
    door = local_door(svc, svc.tenants)
    monkeypatch.setattr(serve, "get_replica_context",
                        lambda: SimpleNamespace(servable_object=door))
    monkeypatch.setattr(errors.LIMITS, "max_body_bytes", svc.tuning.max_body_bytes)
    return TestClient(api, base_url="http://127.0.0.1"), svc, sched


@pytest.fixture(params=["nodes", "slots"])
def service(request, monkeypatch):
    client, svc, sched = _service(monkeypatch, PLAIN if request.param == "nodes" else SLOTS)
    try:
        with client:
            yield client, svc, sched
    finally:
        sched.shutdown(timeout=5)
        svc._pool.shutdown()


def _finished(http, wid: str, headers=A) -> dict:
    r = http.get(f"/v1/workflows/{wid}?wait_s=10", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _up_for_everyone(http, sched) -> None:
    """Another tenant's plain workflow still runs, and the scheduler thread lives."""
    r = http.post("/v1/workflows", json=ONE, headers=B)
    assert r.status_code == 201, r.text
    assert _finished(http, r.json()["id"], B)["state"] == "completed"
    assert sched.thread_error is None


def test_a_zero_cpu_task_runs(service):
    """Issue 71 (1), ``num_cpus: 0``: accepted and killed the thread (``AttributeError`` in the
    decision core). It runs now: a task that holds no CPU, in both models."""
    http, _, sched = service
    r = http.post("/v1/workflows", json=ZERO_CPUS, headers=A)
    assert r.status_code == 201, r.text
    rec = _finished(http, r.json()["id"])
    assert rec["state"] == "completed" and rec["result"] == 1, rec
    _up_for_everyone(http, sched)


@pytest.mark.parametrize("body, field", [(FINE_CPUS, "num_cpus"),
                                         (LONG_PREFIX, "label_selector")])
def test_options_ray_refuses_are_a_422_naming_the_field(service, body, field):
    """Issue 71 (1): ``num_cpus: 0.00005`` (finer than Ray's 0.0001) and a label key whose
    prefix is 100 characters (a DNS label is at most 63) were accepted and raised in Ray's
    ``.options()`` on the scheduler thread. Both are a 422 at submit now, naming the field."""
    http, _, sched = service
    r = http.post("/v1/workflows", json=body, headers=A)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "tasks", 0, field], item
    assert field in item["msg"] and "Ray" in item["msg"], item
    _up_for_everyone(http, sched)


def test_a_request_that_stops_every_replica_is_quarantined_for_its_owner(monkeypatch,
                                                                         tmp_path):
    """Issue 71 (1): a journaled request that crashed the scheduler was resumed by every new
    replica, which crashed again (17 replicas in 150 s; DELETE could not remove it). After
    ``live.resume_attempts`` (3) failed resumes the next replica quarantines it: its owner
    reads it as failed with the reason, another tenant sees nothing of it, a DELETE deletes
    it, and the service runs everyone else's work."""
    crash_on(monkeypatch, "crasher")
    store = str(tmp_path / "journal")

    def replica():
        return _service(monkeypatch, PLAIN, store)

    http, svc, sched = replica()
    with http:
        r = http.post("/v1/workflows", json={"name": "crasher", **ONE}, headers=A)
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        wait_dead(sched)
    for k in range(4):  # Serve replaces the replica; three resume it and die of it
        sched.shutdown(timeout=5)
        svc._pool.shutdown()
        http, svc, sched = replica()
        if k < 3:
            wait_dead(sched)
    try:
        with http:
            rec = _finished(http, wid)
            assert rec["state"] == "failed", rec
            assert rec["error"].startswith("WorkflowQuarantined: workflow") and \
                "quarantined" in rec["error"] and "resume_attempts=3" in rec["error"], rec
            # (GET /v1/cluster counts it among its owner's journal problems)
            assert [p.split(":", 1)[0] for p in sched.durable.journal_problems] == [
                f"workflow {wid}"]
            assert http.get(f"/v1/workflows/{wid}", headers=B).status_code == 404
            _up_for_everyone(http, sched)
            r = http.delete(f"/v1/workflows/{wid}", headers=A)
            assert r.status_code == 200 and r.json() == {
                "id": wid, "cancelled": False, "state": "failed", "deleted": True}, r.text
            assert http.get(f"/v1/workflows/{wid}", headers=A).status_code in (404, 410)
    finally:
        sched.shutdown(timeout=5)
        svc._pool.shutdown()
    assert sched.durable.size()["workflows"] == 1  # only B's (the deleted one is gone)


# ----------------------------------------------------------------------------- the fuzz
AMOUNTS = st.one_of(st.sampled_from([0, 0.0, 1e-4, 5e-5, 1e-5, 0.25, 0.5, 1, 1.5, 2, 3, 4, 8,
                                     64, 1e3, 1e4, 0.33333333, 0.00015, 0.99999]),
                    st.floats(0, 16, allow_nan=False), st.integers(0, 16))
RES_NAMES = st.one_of(st.sampled_from(["tok", "custom", "é-tpu", "CPU", "GPU", "memory",
                                       "node:1.2.3.4", "accelerator_type:A100", "label:x",
                                       "slot", "a\nb", "x" * 200, "my.res/2", " ", "scale_slot"]),
                      st.text(min_size=1, max_size=12))
LABEL_KEYS = st.one_of(st.sampled_from(["zone", "ray.io/market", "zoné", "-bad", "a" * 63,
                                        "a" * 64, "k8s.io/x", "a" * 100 + "/k", "bad prefix/x",
                                        "a.b", "/k", "x/", "a..b/k"]),
                       st.text(min_size=1, max_size=20))
EXPRS = st.one_of(st.sampled_from(["z1", "z2", "!z1", "in(z1,z2)", "!in(z1, z2)", "spot",
                                   "(a,b)", "in()", "a b", "é", "notin(a)", "!v", "in(a,)"]),
                  st.text(min_size=1, max_size=12))
ACCEL = st.one_of(st.sampled_from(["A100", "H100-80GB", "weird name", "a" * 64, "TPU-V4"]),
                  st.text(min_size=1, max_size=12))
RAY_OPTIONS = st.fixed_dictionaries({}, optional={
    "num_cpus": AMOUNTS, "num_gpus": AMOUNTS, "memory": st.one_of(AMOUNTS, st.sampled_from(
        [1e9, 2.5e9, 16e9, 1e12])),
    "memory_gb": st.sampled_from([0, 0.5, 1, 8, 31, 100]),
    "resources": st.dictionaries(RES_NAMES, AMOUNTS, max_size=3),
    "accelerator_type": ACCEL,
    "label_selector": st.dictionaries(LABEL_KEYS, EXPRS, max_size=3)})
BODIES = st.lists(RAY_OPTIONS, min_size=1, max_size=6)
SEEN = {"options": 0, "statuses": {}, "states": {}}


def _fuzz_body(opts: list[dict]) -> dict:
    tasks = []
    for i, o in enumerate(opts):
        t = {"name": f"t{i}", "compute_gflop": 1.0, **o}
        if i:  # a chain: a child runs only after its parent
            t["parents"] = [f"t{i - 1}"]
        tasks.append(t)
    return {"tasks": tasks}


@pytest.fixture(scope="module")
def fuzz_services():
    mp = pytest.MonkeyPatch()
    made = [_service(mp, PLAIN), _service(mp, SLOTS)]
    clients = [c.__enter__() for c, _, _ in made]
    yield [(http, svc, sched) for http, (_, svc, sched) in zip(clients, made)]
    for (c, svc, sched) in made:
        c.__exit__(None, None, None)
        sched.shutdown(timeout=5)
        svc._pool.shutdown()
    mp.undo()
    assert SEEN["options"] >= 2000, SEEN  # what was thrown at both services


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(BODIES)
@example([{k: v for k, v in t.items() if k not in ("name", "compute_gflop")}
          for body in (ZERO_CPUS, ZERO_CPUS) for t in body["tasks"]])
@example([{k: v for k, v in t.items() if k not in ("name", "compute_gflop")}
          for body in (FINE_CPUS, LONG_PREFIX) for t in body["tasks"]])
def test_generated_ray_options_never_stop_the_scheduler(fuzz_services, opts):
    """Generated Ray options (amounts at and beyond Ray's precision, reserved and odd resource
    names, label keys and selectors of every shape, accelerator types) in chains of up to six
    tasks, submitted over HTTP to both models: every answer is a 201 or a 4xx naming a field;
    every accepted workflow ends (completed, or failed with its reason); the scheduler thread
    never dies."""
    body = _fuzz_body(opts)
    for http, _, sched in fuzz_services:
        SEEN["options"] += len(opts)
        r = http.post("/v1/workflows", json=body, headers=A)
        SEEN["statuses"][r.status_code] = SEEN["statuses"].get(r.status_code, 0) + 1
        assert r.status_code in (201, 422), (r.status_code, r.text, body)
        if r.status_code == 422:
            for item in r.json()["detail"]:
                assert item["loc"][:2] == ["body", "tasks"], item
                if item["type"] == "invalid_task":  # a Ray option Ray refuses: named
                    _, _, i, field = item["loc"]
                    assert field in body["tasks"][i] and field in item["msg"], item
        else:
            rec = _finished(http, r.json()["id"])
            SEEN["states"][rec["state"]] = SEEN["states"].get(rec["state"], 0) + 1
            assert rec["state"] in ("completed", "failed"), rec
            if rec["state"] == "failed":
                assert rec["error"], rec
            else:
                assert rec["result"] == len(opts) * (len(opts) + 1) // 2, rec
        assert sched.thread_error is None, (sched.thread_error, body)
