"""Who asks the scheduler service (issue 28, serve_apps/tenants.py): tokens from the environment,
loopback-only without them, ids bound to their tenant, quotas answered 429."""

from __future__ import annotations

import pytest

from serve_apps.tenants import LOCAL_TENANT, IdSigner, Tenants, load_tokens

TOK_A, TOK_B = "a" * 32, "b" * 32


def test_tokens_come_from_the_environment_and_are_validated(tmp_path):
    assert load_tokens({}) == {}
    f = tmp_path / "tokens"
    f.write_text(f"# tenants\nteam-b={TOK_B}\n")
    got = load_tokens({"SCALE_SCHEDULER_TOKENS": f"team-a={TOK_A}",
                       "SCALE_SCHEDULER_TOKENS_FILE": str(f)})
    assert got == {"team-a": TOK_A, "team-b": TOK_B}
    for bad, what in [({"SCALE_SCHEDULER_TOKENS": "a=short"}, "16 characters"),
                      ({"SCALE_SCHEDULER_TOKENS": f"a={TOK_A},a={TOK_B}"}, "twice"),
                      ({"SCALE_SCHEDULER_TOKENS_FILE": str(tmp_path / "none")}, "cannot read")]:
        with pytest.raises(ValueError, match=what):
            load_tokens(bad)


def test_bearer_tokens_or_loopback_only():
    open_ = Tenants({})
    assert open_.authenticate(None, "127.0.0.1") == (LOCAL_TENANT, 0, "")
    assert open_.authenticate(None, "::1")[0] == LOCAL_TENANT
    assert open_.authenticate(f"Bearer {TOK_A}", "10.0.0.7")[1] == 403
    t = Tenants({"team-a": TOK_A, "team-b": TOK_B})
    assert t.authenticate(f"Bearer {TOK_B}", "10.0.0.7") == ("team-b", 0, "")
    assert t.authenticate(f"bearer {TOK_A}", None)[0] == "team-a"
    assert t.authenticate(None, "127.0.0.1")[1] == 401  # with tokens, loopback needs one too
    assert t.authenticate("Bearer nope", "127.0.0.1")[1] == 401
    assert t.authenticate(f"Basic {TOK_A}", "127.0.0.1")[1] == 401


def test_ids_are_unguessable_and_bound_to_their_tenant():
    key = b"k" * 32
    now, before = IdSigner("inc2", key), IdSigner("inc1", key)
    wid = now.new("team-a")
    assert now.check(wid, "team-a") == "ours"
    assert now.check(wid, "team-b") == "unknown"  # another tenant's id: a 404
    assert now.new("team-a") != wid and len(wid.split("-")[1]) == 16
    old = before.new("team-a")
    assert now.check(old, "team-a") == "gone" and now.check(old, "team-b") == "unknown"
    for bad in ("deadbeef-1", "x", "", "inc2--", f"{wid}0", wid.replace("inc2", "inc9")):
        assert now.check(bad, "team-a") == "unknown"
    assert IdSigner("inc2", b"other" * 8).check(wid, "team-a") == "unknown"


class _Req:
    def __init__(self, auth, host):
        self.headers = {} if auth is None else {"authorization": auth}
        self.client = type("C", (), {"host": host})()


def _service(tokens, **tuning):
    from serve_apps.scheduler import SchedulerService, SchedulerTuning

    cls = SchedulerService.func_or_class
    svc = object.__new__(cls)
    svc.tenants = Tenants(tokens)
    svc.tuning = SchedulerTuning(**tuning)
    svc._inflight = {}
    import threading
    svc._load_lock = threading.Lock()
    svc._reg_lock = threading.Lock()
    svc.metrics = type("M", (), {"refused": lambda self, t, r: None,
                                 "finished": lambda self, t, p, h: None})()
    return svc


def test_the_service_answers_401_403_and_429():
    from serve_apps.schemas import RequestError

    svc = _service({"team-a": TOK_A}, max_inflight_per_tenant=2, max_queued_tasks=10)
    assert svc._tenant(_Req(f"Bearer {TOK_A}", "10.1.1.1")) == "team-a"
    with pytest.raises(RequestError) as e:
        svc._tenant(_Req(None, "10.1.1.1"))
    assert e.value.status == 401
    with pytest.raises(RequestError) as e:
        _service({})._tenant(_Req(None, "10.1.1.1"))
    assert e.value.status == 403
    svc._inflight = {"team-a": [2, 4]}
    with pytest.raises(RequestError) as e:
        svc._check_quota("team-a", 1)
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "5"}
    assert "unfinished workflows of this tenant" in e.value.msg
    svc._check_quota("team-b", 5)  # another tenant is not held back by team-a's count
    with pytest.raises(RequestError, match="tasks of all unfinished workflows"):
        svc._check_quota("team-b", 7)


def test_finished_workflows_keep_only_their_outputs_and_expire():
    import time as _time

    class H:
        def __init__(self):
            self.result_refs = ["r0", "r1", "r2"]
            self.workflow = type("W", (), {"outputs": (2,)})()
            self.finished_wall = _time.perf_counter() - 10.0

        def done(self):
            return True

    svc = _service({}, result_ttl_s=5.0, retain_finished=100)
    svc.workflows, svc.owner = {}, {}
    compacted = []
    svc.sched = type("S", (), {"forget": lambda self, hs: None,
                               "compact": lambda self, h: compacted.append(h)})()
    h = H()
    svc._inflight = {"t": [1, 3]}
    svc._done("t", 3, h)
    assert h.result_refs == [None, None, "r2"] and svc._inflight["t"] == [0, 0]
    svc.workflows["x"] = h
    svc._prune()  # finished 10 s ago, TTL 5 s: its result is released, its record stays
    assert h.result_refs == [None, None, None] and "x" in svc.workflows
    assert compacted == [h]  # the journal drops its results too (once)
    svc._prune()
    assert compacted == [h]
