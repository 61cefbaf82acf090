"""Service trust, round two (issue 43): audit lines reach the replica's log (and never a token),
per-tenant metrics are labelled by a hash unless the operator opts into names, ``GET
/v1/cluster`` shows an HTTP tenant counts only. Fast tests without Ray; the slow one sends the
hostile ids and headers to a real service (its own local cluster, as tests/test_service.py)."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import pytest

from serve_apps.tenants import audit, audit_counts, tenant_label

TOK = "s3cret-token-" + "z" * 24


@pytest.fixture
def serve_log(tmp_path):
    """Serve's logger configured as in a replica (its file handler in ``tmp_path``); restored
    afterwards. Yields a function returning the log file's text."""
    from ray.serve._private.logging_utils import configure_component_logger
    from ray.serve.schema import LoggingConfig

    logger = logging.getLogger("ray.serve")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    configure_component_logger(component_name="replica", component_id="trust-test",
                               logging_config=LoggingConfig(logs_dir=str(tmp_path)),
                               max_bytes=1 << 20, backup_count=1)

    def text() -> str:
        for h in logger.handlers:
            h.flush()
        return "".join(p.read_text() for p in tmp_path.glob("*.log"))
    try:
        yield text
    finally:
        for h in logger.handlers:
            h.close()
        logger.handlers[:] = saved[0]
        logger.propagate, logger.level = saved[1], saved[2]


def test_audit_lines_land_in_the_replica_log_and_never_a_token(serve_log):
    """Issue 43 (d): the audit logger had no handler, so no line reached the operator. It is a
    child of Serve's logger now: submit, cancel, refusal and token failure each write one line
    (tenant, id, reason) to the replica's log file, and each is counted per action and reason."""
    from test_tenants import _Req, _service

    from serve_apps.schemas import RequestError

    before = audit_counts()
    svc = _service({"team-a": TOK})
    for auth in (f"Bearer {TOK}x", f"Basic {TOK}", None):
        with pytest.raises(RequestError):
            svc._tenant(_Req(auth, "10.9.9.9"))
    assert svc._tenant(_Req(f"Bearer {TOK}", "10.9.9.9")) == "team-a"
    svc.registry.inflight = {"team-a": [10 ** 6, 0, 0.0]}
    with pytest.raises(RequestError):
        svc.registry.check_quota("team-a", 1)
    audit("submit", "team-a", "inc-0123-abcd", tasks=3, name="w")
    audit("cancel", "team-a", "inc-0123-abcd", was_running=True)
    audit("refuse", "evil\ntenant", reason="too_large", field="a\nb")  # cannot forge a line
    text = serve_log()
    lines = [ln for ln in text.splitlines() if "audit " in ln]
    assert len(lines) == 7, text
    assert sum("audit refuse tenant=? id=- reason='unauthorized'" in ln for ln in lines) == 3
    assert any("audit refuse tenant=team-a" in ln and "reason='quota" in ln for ln in lines)
    assert any("audit submit tenant=team-a id=inc-0123-abcd" in ln for ln in lines)
    assert any("audit cancel tenant=team-a id=inc-0123-abcd" in ln for ln in lines)
    assert any("tenant='evil\\ntenant'" in ln for ln in lines)
    assert TOK not in text and "s3cret" not in text
    after = audit_counts()
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert grew == {("refuse", "unauthorized"): 3, ("refuse", "quota"): 1, ("submit", ""): 1,
                    ("cancel", ""): 1, ("refuse", "too_large"): 1}


class _Metric:
    def __init__(self, name, doc="", boundaries=None, tag_keys=()):
        self.name, self.tag_keys, self.seen = name, tuple(tag_keys), []

    def _rec(self, v, tags):
        assert set(tags or {}) == set(self.tag_keys), (self.name, tags)
        self.seen.append((v, dict(tags or {})))

    def set(self, v, tags=None):
        self._rec(v, tags)

    def inc(self, v=1, tags=None):
        self._rec(v, tags)

    def observe(self, v, tags=None):
        self._rec(v, tags)


def _fake_service(names: bool):
    class H:
        def __init__(self, done):
            self._done, self.task_finish_wall = done, [None, 1.0]

        def done(self):
            return self._done

    sched = SimpleNamespace(counters={"decisions": 4}, guard_overrides=lambda: 0,
                            take_decision_latencies=lambda: [1.0],
                            load=lambda: {"ready_tasks": 1, "running_tasks": 1, "servers": 2})
    handles = {"w1": H(False), "w2": H(False)}
    registry = SimpleNamespace(items=lambda: list(handles.items()),
                               owner={"w1": "team-secret", "w2": "other-team"})
    return SimpleNamespace(sched=sched, registry=registry,
                           journal=SimpleNamespace(cached_size=lambda: None),
                           args=SimpleNamespace(metrics_tenant_names=names))


@pytest.mark.parametrize("names", [False, True])
def test_metrics_label_tenants_by_hash_unless_the_operator_opts_in(monkeypatch, names):
    """Issue 43 (e): Ray's metrics port carried tenant names; now ``t-`` + 8 hex of the name's
    SHA-256 unless ``metrics_tenant_names: true``. The audit counter is there too."""
    from ray.util import metrics as m

    from serve_apps.metrics import ServiceMetrics
    from serve_apps.scheduler_config import parse_args

    assert parse_args({}).metrics_tenant_names is False
    assert parse_args({"metrics_tenant_names": True}).metrics_tenant_names is True
    for cls in ("Gauge", "Counter", "Histogram"):
        monkeypatch.setattr(m, cls, _Metric)
    svc = _fake_service(names)
    sm = ServiceMetrics(svc)
    sm.refused("team-secret", "quota")
    sm.refused("?", "unauthorized")
    sm.finished("team-secret", "eft", SimpleNamespace(response_s=2.0))
    audit("refuse", "team-secret", reason="quota: unfinished workflows of this tenant")
    sm.update()
    tagged = [(name, tags) for name, metric in {**sm.gauges, **sm.counters}.items()
              for _, tags in metric.seen] + [("response", t) for _, t in sm.response.seen]
    tenants = {tags["tenant"] for _, tags in tagged if "tenant" in tags}
    if names:
        assert tenants == {"team-secret", "other-team", "?"}
    else:
        assert tenants == {tenant_label("team-secret"), tenant_label("other-team"), "?"}
        assert "secret" not in json.dumps(tagged) and "other-team" not in json.dumps(tagged)
    audited = {(t["action"], t["reason"]): v for v, t in sm.counters["audit"].seen}
    assert audited[("refuse", "quota")] >= 1  # (a reason's text after the colon is not a label)
    sm.counters["audit"].seen.clear()
    sm.update()  # counted once: only what was audited since
    assert sm.counters["audit"].seen == []


def _snapshot() -> dict:
    return {"servers": [
        {"server": 0, "node": "node-id-aaaa", "slot": 0, "tier": "small", "compute": 10.0,
         "memory_gb": 8.0, "accepting": True, "busy": True,
         "task": {"workflow": 1, "task": 0, "name": "secret-task-of-b"}},
        {"server": 1, "node": "node-id-bbbb", "slot": 0, "tier": "large", "compute": 40.0,
         "memory_gb": 64.0, "accepting": True, "busy": True,
         "task": {"workflow": 2, "task": 3, "name": "my-task"}},
        {"server": 2, "node": "node-id-bbbb", "slot": 1, "tier": "large", "compute": 40.0,
         "memory_gb": 64.0, "accepting": False, "busy": False, "task": None}],
        "policy": "eft", "estimator": {"observations": 3, "kinds": {"secret-kind": {}}},
        "ready_tasks": 5, "set_aside_tasks": 1, "running_tasks": 2, "workflows_pending": 4,
        "counters": {"decisions": 9},
        "sizing": {"policy": "model", "apply": "ray", "turns": 4, "t": 40.0,
                   "nodes": {"small": 1, "large": 1}, "wanted": {"small": 1, "large": 0},
                   "launch": {}, "drain": [{"node": "node-id-bbbb", "tier": "large"}],
                   "why": "need cpu 1.0 gpu 0.00", "decide_ms": 0.4, "cost": 0.5,
                   "node_hours": {"small": 0.1, "large": 0.1}, "budget_per_hour": None,
                   "slo": {"p95_s": 60, "window_s": 300, "target": 0.99, "windows": 0,
                           "attainment": None}}}


def test_cluster_view_shows_an_http_tenant_counts_only():
    """Issue 43 (f): ``GET /v1/cluster`` showed any tenant the journal's path, node, worker and
    actor ids. An HTTP tenant now gets counts, its own workflows' and its own running tasks;
    nothing else of the snapshot passes."""
    from serve_apps.registry import mask_tasks, tenant_view

    other, mine = SimpleNamespace(id=1), SimpleNamespace(id=2)
    snap = _snapshot()
    servers = mask_tasks(snap["servers"], {id(mine): "inc-mine-mac"}, [other, mine])
    assert [s["task"] for s in servers] == [
        {"tenant": "other"}, {"workflow": "inc-mine-mac", "task": 3, "name": "my-task"}, None]
    view = tenant_view(snap, servers, "team-a", {"running": 1, "completed": 2}, 7, 3,
                       {"name": "eft", "version": "2", "swaps": 1, "last_swap_failed": True,
                        "spec": "/secret/artifact/path"},
                       {"on": True, "workflows": 3, "unrestorable": 0, "problems": 0}, 1, 12.5)
    assert view["servers"] == {"count": 3, "busy": 2, "accepting": 2, "by_tier": {
        "small": {"servers": 1, "busy": 1}, "large": {"servers": 2, "busy": 1}}}
    assert view["ready_tasks"] == 5 and view["workflows_pending"] == 4
    assert view["policy"] == "eft" and view["policy_version"] == "2" and view["swaps"] == 1
    assert view["workflows"] == {"running": 1, "completed": 2} and view["queued_tasks"] == 7
    assert view["running"] == [{"workflow": "inc-mine-mac", "task": 3, "name": "my-task"}]
    assert view["other_tenants"] == {"unfinished_workflows": 3}
    # the sizer's plan (issue 72 item 7): per tier, no node id
    assert view["sizing"]["wanted"] == {"small": 1, "large": 0}
    assert view["sizing"]["drain"] == {"large": 1} and view["sizing"]["cost"] == 0.5
    text = json.dumps(view)
    for secret in ("node-id", "secret-task-of-b", "secret-kind", "/secret", "replica", "worker",
                   "actor", "storage"):
        assert secret not in text, secret


def test_the_journal_counts_an_http_tenant_sees_are_its_own():
    from serve_apps.durable import JournalView

    durable = SimpleNamespace(journal=object(), unrestorable={"a-1-x": "gone", "b-2-y": "gone"},
                              journal_problems=["workflow a-3-z: task 1's result unreadable",
                                                "workflow b-4-w: end entry unreadable",
                                                "something else"])
    got = JournalView(SimpleNamespace(durable=durable)).tenant_counts(
        5, lambda wid: wid.startswith("a-"))
    assert got == {"on": True, "workflows": 5, "unrestorable": 1, "problems": 1}
    off = SimpleNamespace(durable=SimpleNamespace(journal=None))
    assert JournalView(off).tenant_counts(0, bool) == {"on": False}


# ------------------------------------------------------------------------------- real service
from test_service import service  # noqa: E402,F401 - the module fixture (its own local cluster)


def _scheduler_log(client) -> str:
    """The scheduler actor's log file (``GET /v1/cluster`` as a Ray job sees it)."""
    return client.cluster()["scheduler_log"]


def _late_body_status(url: str) -> str:
    """A POST announcing 1,000 body bytes and sending 10: the first response line, or
    'closed' when the connection closes without one."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        s.sendall(b"POST /v1/workflows HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"tasks\":")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return "closed"
            data += chunk
        return data.split(b"\r\n", 1)[0].decode()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hostile_strings_bodies_and_views_over_http(service):
    """Issue 43 end to end: any id or header is a 4xx, never a 5xx; ``GET /v1/cluster`` over
    HTTP shows counts only (the handle still shows the operator the replica); audit lines are
    in the replica's log without a token; a completed workflow's journal directory is folded;
    a body that stops arriving is a 408 (or a closed connection) within the read timeout."""
    from urllib.parse import quote

    import httpx

    from scale_ray import client
    from test_tenants import _hostile_strings

    ok = {"tasks": [{"name": "a", "compute_gflop": 1}]}
    statuses = []
    with httpx.Client(base_url=service.url, timeout=60) as http:
        ids = ["a-b-%C3%A9", "%C3%A9-%C3%A9-%C3%A9", "a-%FF-%00", "x-y-%E2%80%AE"] + [
            quote(s.encode("utf-8", "surrogatepass")[:3000], safe="")
            for s in _hostile_strings(60) if s]
        for wid in ids:
            statuses.append(("get", wid[:40], http.get(f"/v1/workflows/{wid}").status_code))
            statuses.append(("del", wid[:40], http.delete(f"/v1/workflows/{wid}").status_code))
            statuses.append(("append", wid[:40], http.post(f"/v1/workflows/{wid}/tasks",
                                                           json={"close": True}).status_code))
        for name, value in (("authorization", b"Bearer \xc3\xa9\xff\x01"),
                            ("idempotency-key", b"\xc3\xa9"), ("idempotency-key", b"\xff" * 300),
                            ("content-type", b"application/json; x=\xff")):
            r = http.post("/v1/workflows", json=ok, headers=[(name.encode(), value)])
            statuses.append(("post", name, r.status_code))
        bad = [s for s in statuses if s[2] >= 500]
        assert not bad, bad
        assert all(s[2] in (404, 422) for s in statuses if s[0] in ("get", "del", "append")), \
            statuses

        wid = http.post("/v1/workflows", json=ok).json()["id"]
        polled = http.get(f"/v1/workflows/{wid}", params={"wait_s": 30, "result": False}).json()
        assert polled["state"] == "completed"
        view = http.get("/v1/cluster").json()
        r = http.post("/v1/workflows", json={"tasks": [{"name": "a", "compute_gflop": 5000}]})
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "too_large", r.text
    op = client.cluster(tenant="local")
    secrets = {op["scheduler_actor"], op["scheduler_worker_id"], op["scheduler_node"],
               op["door_actor"], op["door_worker_id"],
               op["journal"]["storage"], *(s["node"] for s in op["servers"])}
    text = json.dumps(view)
    assert view["servers"]["count"] == len(op["servers"]) and view["workflows"]["completed"] >= 1
    assert not [s for s in secrets if s and s in text], view
    root = op["journal"]["storage"]
    from pathlib import Path
    deadline = time.time() + 30
    while (Path(root) / "wf" / wid).exists() and time.time() < deadline:
        time.sleep(0.2)  # (folded off the scheduler thread when it completed)
    assert not (Path(root) / "wf" / wid).exists() and any((Path(root) / "done").iterdir())

    log_text = Path(_scheduler_log(client)).read_text()
    assert f"audit submit tenant=local id={wid}" in log_text, log_text[-3000:]
    assert "audit refuse tenant=local id=- reason='too_large'" in log_text
    t = time.time()
    status = _late_body_status(service.url)
    assert status == "closed" or " 408 " in status, status
    assert time.time() - t < 40
