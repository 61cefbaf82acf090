"""Who asks the scheduler service (issues 28 and 43, serve_apps/tenants.py): tokens from the
environment kept as SHA-256 digests (or given as digests), loopback-only without them, ids bound
to their tenant and checked as bytes (no string is a 5xx), quotas answered 429."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys

import pytest

from serve_apps.tenants import (LOCAL_TENANT, IdSigner, Tenants, load_tokens, new_token,
                                tenant_label)

TOK_A, TOK_B = "a" * 32, "b" * 32


def _h(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def test_tokens_come_from_the_environment_and_are_validated(tmp_path):
    assert load_tokens({}) == {}
    f = tmp_path / "tokens"
    f.write_text(f"# tenants\nteam-b={_h(TOK_B)}\nteam-c={_h('c' * 40)}\n")
    got = load_tokens({"SCALE_SCHEDULER_TOKENS": f"team-a={_h(TOK_A)}",
                       "SCALE_SCHEDULER_TOKENS_FILE": str(f)})
    assert got == {"team-a": _h(TOK_A), "team-b": _h(TOK_B), "team-c": _h("c" * 40)}
    for bad, what in [({"SCALE_SCHEDULER_TOKENS": "a=short"}, "16 characters"),
                      ({"SCALE_SCHEDULER_TOKENS": f"a={_h(TOK_A)},a={_h(TOK_B)}"}, "twice"),
                      ({"SCALE_SCHEDULER_TOKENS": "a=sha256:abc"}, "64 hex"),
                      ({"SCALE_SCHEDULER_TOKENS": f"a=sha256:{'g' * 64}"}, "64 hex"),
                      ({"SCALE_SCHEDULER_TOKENS_FILE": str(tmp_path / "none")}, "cannot read")]:
        with pytest.raises(ValueError, match=what):
            load_tokens(bad, plaintext=True)


def test_plaintext_tokens_are_refused_unless_the_operator_opts_in(tmp_path):
    """Issue 71 (4): the plaintext ``SCALE_SCHEDULER_TOKENS`` was in /proc/<pid>/environ of 14
    processes of the user that started Ray (a marked file-reading tool read another tenant's
    token there). A plaintext entry, in the variable or the file, is refused naming the entry
    and what to give instead, unless ``plaintext_tokens``; only digests are returned."""
    f = tmp_path / "tokens"
    f.write_text(f"team-b={TOK_B}\n")
    for env, where in (({"SCALE_SCHEDULER_TOKENS": f"team-a={TOK_A}"}, "SCALE_SCHEDULER_TOKENS: "),
                       ({"SCALE_SCHEDULER_TOKENS_FILE": str(f)}, f"_FILE ({f})")):
        with pytest.raises(ValueError, match="plaintext token") as e:
            load_tokens(env)
        assert where in str(e.value) and "sha256:" in str(e.value)
        assert "/proc/<pid>/environ" in str(e.value) and "plaintext_tokens" in str(e.value)
        assert TOK_A not in str(e.value) and TOK_B not in str(e.value)
    got = load_tokens({"SCALE_SCHEDULER_TOKENS": f"team-a={TOK_A}",
                       "SCALE_SCHEDULER_TOKENS_FILE": str(f)}, plaintext=True)
    assert got == {"team-a": _h(TOK_A), "team-b": _h(TOK_B)}
    assert TOK_A not in repr(got) and TOK_B not in repr(got)
    from serve_apps.scheduler_config import parse_args
    assert parse_args({}).plaintext_tokens is False  # the service's default refuses them
    assert parse_args({"plaintext_tokens": True}).plaintext_tokens is True


def test_hashed_entries_authenticate_their_token_and_the_helper_makes_them(tmp_path):
    token, line = new_token("team-x")
    tenant, _, digest = line.partition("=")
    assert tenant == "team-x" and digest == _h(token) and len(token) >= 40
    t = Tenants(load_tokens({"SCALE_SCHEDULER_TOKENS": line}))
    assert t.authenticate(f"Bearer {token}", "10.0.0.7") == ("team-x", 0, "")
    assert t.authenticate(f"Bearer {digest}", "10.0.0.7")[1] == 401  # the hash is no token
    assert t.authenticate(f"Bearer {token}".encode(), None)[0] == "team-x"  # bytes work too
    assert all(isinstance(d, bytes) and len(d) == 32 for _, d in t._digests)
    for bad in ("", "a=b", "a,b", " a", "a#"):
        with pytest.raises(ValueError, match="tenant"):
            new_token(bad)
    out = subprocess.run([sys.executable, "-m", "serve_apps.tenants", "new", "team-y"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SCALE_SCHEDULER_TOKENS_FILE": ""})
    assert out.returncode == 0, out.stderr
    tok = out.stdout.split("\n")[0].rsplit(" ", 1)[1]
    assert f"team-y={_h(tok)}" in out.stdout and tenant_label("team-y") in out.stdout
    # `new` writes the tokens file (the variable's, or --file): created 0600, one sha256 line a
    # tenant, the service's default source
    f = tmp_path / "tokens"
    made = {}
    for tenant, argv, env in (("team-y", ["--file", str(f)], {}),
                              ("team-z", [], {"SCALE_SCHEDULER_TOKENS_FILE": str(f)})):
        out = subprocess.run([sys.executable, "-m", "serve_apps.tenants", "new", tenant, *argv],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 0 and str(f) in out.stdout, out.stderr
        made[tenant] = out.stdout.split("\n")[0].rsplit(" ", 1)[1]
    assert (f.stat().st_mode & 0o777) == 0o600
    assert all(tok not in f.read_text() for tok in made.values())
    t = Tenants(load_tokens({"SCALE_SCHEDULER_TOKENS_FILE": str(f)}))
    assert [t.authenticate(f"Bearer {made[k]}", None)[0] for k in made] == list(made)
    out = subprocess.run([sys.executable, "-m", "serve_apps.tenants", "new", "team-z", "--file",
                          str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has a token already" in out.stderr
    assert len(f.read_text().splitlines()) == 2


def test_tenant_labels_are_short_stable_hashes():
    assert tenant_label("team-a") == tenant_label("team-a") != tenant_label("team-b")
    assert tenant_label("team-a").startswith("t-") and len(tenant_label("team-a")) == 10
    assert "team" not in tenant_label("team-a") and tenant_label("?") == "?"
    assert tenant_label("caf\u00e9\ud800").startswith("t-")  # any string


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
    from serve_apps.registry import Workflows
    from serve_apps.scheduler import SchedulerService, SchedulerTuning

    cls = SchedulerService.func_or_class
    svc = object.__new__(cls)
    svc.tenants = Tenants(tokens)
    svc.tuning = SchedulerTuning(**tuning)
    svc.metrics = type("M", (), {"refused": lambda self, t, r: None,
                                 "finished": lambda self, t, p, h: None})()
    svc.registry = Workflows(None, lambda: svc.tuning, None, svc.metrics, None, "inc1")
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
    reg = svc.registry
    reg.inflight = {"team-a": [2, 4, 0.0]}
    with pytest.raises(RequestError) as e:
        reg.check_quota("team-a", 1)
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "5"}
    assert "unfinished workflows of this tenant" in e.value.msg
    reg.check_quota("team-b", 5)  # another tenant is not held back by team-a's count
    with pytest.raises(RequestError, match="tasks of all unfinished workflows"):
        reg.check_quota("team-b", 7)


def _racing_registry(tuning, submit_s: float = 0.005):
    """serve_apps.registry.Workflows over a fake scheduler whose submit takes ``submit_s`` (the
    journal's write) and whose tasks are 3,600 resource-seconds each."""
    import time as _time
    from types import SimpleNamespace

    from scale_ray.live.handles import WorkflowHandle
    from serve_apps.registry import Workflows

    def submit(wf, tenant, key, record, program):
        _time.sleep(submit_s)
        h = WorkflowHandle(0, wf, _time.perf_counter())
        h.jid, h.tenant = record.id, tenant
        return h

    sched = SimpleNamespace(
        durable=SimpleNamespace(known=lambda t, k: None, journal=None),
        admission=SimpleNamespace(work_s=lambda wf: [3600.0] * len(wf.calls)),
        alive_servers=[SimpleNamespace(node=SimpleNamespace(compute=1.0))],
        policy=SimpleNamespace(name="eft"), submit=submit)
    metrics = SimpleNamespace(refused=lambda t, r: None, finished=lambda t, p, h: None)
    return Workflows(sched, lambda: tuning, IdSigner("inc1", b"k" * 32), metrics, None, "inc1")


def _workflow(tasks: int, name: str = "big"):
    from types import SimpleNamespace

    return SimpleNamespace(calls=[object() for _ in range(tasks)], outputs=(tasks - 1,),
                           spec=SimpleNamespace(name=name, tasks=[SimpleNamespace(
                               compute_gflop=1.0)] * tasks))


def test_concurrent_submits_cannot_overshoot_a_quota_together():
    """Issue 71 (3): three concurrent 2,000-task submits of 7.2e6 resource-seconds each against
    the 1e7 cap: two were accepted in 2 of 3 trials (the quota was checked, then the workflow
    counted after the journal's write). Checking and counting are one step now: in 20 trials
    exactly one is accepted, the others are 429s, and the count is the accepted one's."""
    import threading

    from serve_apps.scheduler import SchedulerTuning
    from serve_apps.schemas import RequestError

    tuning = SchedulerTuning(max_queued_work_s_per_tenant=1e7)
    overshoot = []
    for trial in range(20):
        reg = _racing_registry(tuning)
        go = threading.Barrier(3)
        answers: list = []

        def submit() -> None:
            go.wait()
            try:
                answers.append(reg.accept(_workflow(2000), "team-a", "json", b"{}"))
            except RequestError as e:
                answers.append(e.status)

        threads = [threading.Thread(target=submit) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted = [a for a in answers if isinstance(a, dict)]
        overshoot.append(max(0.0, reg.inflight["team-a"][2] - 1e7))
        assert len(accepted) == 1 and sorted(a for a in answers if not isinstance(a, dict)) \
            == [429, 429], (trial, answers)
        assert reg.inflight["team-a"] == [1, 2000, 7.2e6], trial
    assert overshoot == [0.0] * 20


def test_a_refused_or_duplicate_submit_gives_its_reservation_back():
    """A submit the scheduler refuses (here: it raises) or that lost a race on its idempotency
    key counts nothing; a finished workflow gives its charge back."""
    from scale_ray.live.handles import WorkflowHandle
    from serve_apps.scheduler import SchedulerTuning

    tuning = SchedulerTuning(max_queued_work_s_per_tenant=1e7)
    reg = _racing_registry(tuning, 0.0)

    def fails(*a, **k):
        raise RuntimeError("storage down")
    ok, reg.sched.submit = reg.sched.submit, fails
    with pytest.raises(RuntimeError):
        reg.accept(_workflow(2000), "team-a", "json", b"{}")
    assert reg.inflight["team-a"] == [0, 0, 0.0]
    reg.sched.submit = ok
    first = reg.accept(_workflow(2000), "team-a", "json", b"{}", key="k1")
    h = reg.handles[first["id"]]
    reg.sched.submit = lambda *a, **k: h  # the same key raced in: the first workflow
    dup = reg.accept(_workflow(500), "team-a", "json", b"{}", key="k1")  # (fits beside it)
    assert dup["duplicate"] and dup["id"] == first["id"]
    assert reg.inflight["team-a"] == [1, 2000, 7.2e6]
    assert isinstance(h, WorkflowHandle)
    h.record_completion(1.0)
    assert reg.inflight["team-a"] == [0, 0, 0.0]


def test_finished_workflows_keep_only_their_outputs_and_expire():
    import time as _time

    class H:
        def __init__(self):
            self.result_refs = ["r0", "r1", "r2"]
            self.workflow = type("W", (), {"outputs": (2,)})()
            self.finished_wall = _time.perf_counter() - 10.0
            self.pins = 0  # held steps waiting on its results (scale_ray.live.programs.hold)
            self.program = None

        def done(self):
            return True

    from serve_apps.registry import Workflows
    from serve_apps.scheduler import SchedulerTuning

    compacted = []
    durable = type("D", (), {"journal": None, "compact": lambda self, h: compacted.append(h)})()
    sched = type("S", (), {"forget": lambda self, hs: None, "durable": durable})()
    tuning = SchedulerTuning(result_ttl_s=5.0, retain_finished=100)
    reg = Workflows(sched, lambda: tuning, None, None, None, "inc1")
    h, pinned = H(), H()
    reg.inflight = {"t": [1, 3, 2.0]}
    reg._done("t", 3, h, 2.0)
    assert h.result_refs == [None, None, "r2"] and reg.inflight["t"] == [0, 0, 0.0]
    reg.handles["x"] = h
    pinned.pins = 1
    reg.handles["y"] = pinned  # a held step still waits on it: kept past the TTL
    reg._prune()  # finished 10 s ago, TTL 5 s: its result is released, its record stays
    assert pinned.result_refs == ["r0", "r1", "r2"]
    assert h.result_refs == [None, None, None] and "x" in reg.handles
    assert compacted == [h]  # the journal drops its results too (once)
    reg._prune()
    assert compacted == [h]


def _hostile_strings(n: int = 300, seed: int = 43) -> list[str]:
    """Ids and header values a hostile client may send: non-ASCII, control characters,
    %-escapes, very long, dashes in the right places, lone surrogates (a handle call's str)."""
    rng = random.Random(seed)
    fixed = ["a-b-\u00e9", "a-b-%C3%A9", "\u00e9-\u00e9-\u00e9", "x-y-\x00", "\x00", "-", "--",
             "a-b-c-d", "%00", "..%2F..%2Fetc", "a" * 100_000, "-".join(["\u00e9" * 16] * 3),
             "\ud800-\udfff-x", "a-b-" + "\U0001f600" * 16, "Bearer", "Bearer ", "bearer \u00e9",
             "Bearer \x00\x01", "Bearer " + "x" * 100_000, "\r\n", "a\nb", ""]
    pools = ["abcdef0123456789-", "\u00e9\u4e2d\U0001f600-", "\x00\x01\x1f\x7f\t\r\n-",
             "%ZZ%C3%A9%00%-", "".join(map(chr, range(32, 0x3000, 7)))]
    out = list(fixed)
    for _ in range(n):
        pool = rng.choice(pools)
        out.append("".join(rng.choice(pool) for _ in range(rng.choice([1, 3, 40, 42, 200]))))
    return out


def test_no_string_breaks_the_id_token_or_key_checks():
    from serve_apps.durable import check_key
    from serve_apps.schemas import RequestError

    signer = IdSigner("inc2", b"k" * 32)
    good = signer.new("team-a")
    closed, open_ = Tenants({"team-a": TOK_A}), Tenants({})
    for s in _hostile_strings():
        for wid in (s, s.encode("utf-8", "surrogatepass"), f"inc2-{s}", f"{good}{s or 0}"):
            assert signer.check(wid, "team-a") == "unknown", wid[:50]
        assert signer.check(good, s) == "unknown"  # any tenant name: no error
        for auth in (s, f"Bearer {s}", s.encode("utf-8", "surrogatepass")):
            assert closed.authenticate(auth, "10.0.0.1")[1] == 401
            assert open_.authenticate(auth, s)[1] in (0, 403)
        try:
            assert check_key(s) == s and s.isascii() and s.isprintable()
        except RequestError as e:
            assert e.status == 422 and list(e.loc) == ["header", "idempotency-key"]
    assert signer.check(good, "team-a") == "ours"
    for s in (None, 5, b"\xff\xfe", bytearray(b"a-b-c")):
        assert signer.check(s, "team-a") == "unknown"
    with pytest.raises(RequestError):
        check_key(b"caf\xc3\xa9")
    assert check_key(b"req-1") == "req-1"
    # a header as an ASGI server hands it over (latin-1 of the wire bytes) finds its token
    t = Tenants({"team-u": "t\u00f6ken-with-utf8-bytes"})
    wire = "Bearer t\u00f6ken-with-utf8-bytes".encode().decode("latin-1")
    assert t.authenticate(wire, None)[0] == "team-u"
