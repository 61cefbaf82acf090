"""The journal (scale_ray.live.journal) and the service's side of it (serve_apps.durable),
without Ray: entries survive a crash at any point (whole or absent, a leftover temporary file
removed), a truncated or corrupt entry is reported and skipped, compaction keeps the record, and
the service's defaults journal every workflow. The resume itself runs on real clusters:
tests/test_durability.py (library) and tests/test_service.py (the service, kill -9)."""

from __future__ import annotations

import json

import pytest

from scale_ray.live import journal as jr
from scale_ray.live.journal import CorruptEntry, Journal, Submission, decode, encode
from serve_apps.durable import MAX_KEY_CHARS, check_key, rebuild
from serve_apps.scheduler_config import SchedulerTuning, parse_args
from serve_apps.schemas import RequestError
from serve_apps.workflow_api import AllowList


def _doc(tasks: list[dict]) -> bytes:
    return json.dumps({"name": "w", "tasks": tasks}).encode()


def test_entries_round_trip_and_every_damage_is_named():
    blob = encode({"a": 1}, b"payload")
    assert decode(blob) == ({"a": 1}, b"payload")
    for bad, what in [(blob[:5], "truncated"), (blob[:-1], "truncated"),
                      (b"XXXX" + blob[4:], "magic"),
                      (blob[:-1] + bytes([blob[-1] ^ 1]), "checksum")]:
        with pytest.raises(CorruptEntry, match=what):
            decode(bad)


def test_journal_load_reports_and_skips_what_it_cannot_read(tmp_path):
    j = Journal(str(tmp_path / "j"))
    j.submit(Submission(id="w1", fmt="json", payload=b"{}", name="one", tenant="t", key="k"))
    j.submit(Submission(id="w2", fmt="json", payload=b"{}", tenant="t"))
    jr.record_start(j.target("w1", 0, "json", 0))
    jr.record_result(j.target("w1", 0, "json", 0), {"v": [1, 2]}, "node-a")
    jr.record_start(j.target("w1", 1, "json", 0))
    jr.record_start(j.target("w1", 1, "json", 1))
    jr.record_result(j.target("w1", 1, "json", 1), 7, "node-b")
    root = tmp_path / "j" / "wf"
    # a crash mid-write: a temporary file never moved into place, and (a storage without
    # atomic moves) a truncated entry under its real name
    (root / "w1" / "t2.tmp-deadbeef").write_bytes(b"half")
    (root / "w1" / "t1").write_bytes((root / "w1" / "t1").read_bytes()[:-3])
    (root / "w2" / "submit").write_bytes(b"garbage")
    (root / "w3").mkdir()
    (root / "w3" / "t0").write_bytes(encode({"node": "n", "t": 0.0, "attempt": 0, "fmt": "json"},
                                            b"1"))
    loaded = j.load()
    (e,) = loaded.entries
    assert e.submission.id == "w1" and e.submission.key == "k" and e.submission.tenant == "t"
    assert e.results == {0: ({"v": [1, 2]}, "node-a", pytest.approx(e.results[0][2]))}
    assert e.runs == {0: 1, 1: 2}  # task 1 started twice; its result is corrupt: it runs again
    assert set(loaded.unrestorable) == {"w2", "w3"}
    assert "unreadable" in loaded.unrestorable["w2"] and "never" in loaded.unrestorable["w3"]
    assert any("task 1" in p and "runs again" in p for p in loaded.problems)
    assert not (root / "w1" / "t2.tmp-deadbeef").exists()  # leftovers are removed


def test_a_json_workflow_never_unpickles_a_value(tmp_path):
    j = Journal(str(tmp_path / "j"))
    j.submit(Submission(id="w", fmt="json", payload=b"{}"))
    jr.record_result(j.target("w", 0, "pickle", 0), 5, "n")  # a pickle where JSON belongs
    loaded = j.load()
    assert loaded.entries[0].results == {}
    assert any("'pickle' value in a 'json' workflow" in p for p in loaded.problems)
    with pytest.raises(ValueError, match="NaN|JSON|Out of range"):
        jr.record_result(j.target("w", 1, "json", 0), float("nan"), "n")


def test_compaction_keeps_the_record_and_forget_removes_it(tmp_path):
    j = Journal(str(tmp_path / "j"))
    j.submit(Submission(id="w", fmt="json", payload=b"{" * 100))
    for i in range(3):
        jr.record_start(j.target("w", i, "json", 0))
        jr.record_result(j.target("w", i, "json", 0), "x" * 1000, "n")
    before = j.size()
    assert before["workflows"] == 1 and before["entries"] == 7
    j.end("w", {"state": "completed", "error": None, "finished": 1.0, "task_finish": [1, 1, 1],
                "task_nodes": ["n"] * 3})
    after = j.size()  # (submission and end record folded into one segment file)
    assert after["entries"] == 1 and after["workflows"] == 1
    assert after["bytes"] < before["bytes"] - 2500
    (e,) = j.load().entries
    assert e.end["state"] == "completed" and e.results == {}
    j.remove("w")
    assert j.size()["workflows"] == 0 and j.load().entries == []


def test_a_closed_program_is_journaled_until_its_first_step_is_forgotten(tmp_path):
    j = Journal(str(tmp_path / "j"))
    for w in ("first", "second"):
        j.submit(Submission(id=w, fmt="json", payload=b"{}"))
    assert j.load().closed == set()
    j.close_program("first")
    (tmp_path / "j" / "closed" / "second.tmp-0000").write_bytes(b"")  # a close never finished
    assert j.load().closed == {"first"} and j.size()["entries"] == 3
    assert not (tmp_path / "j" / "closed" / "second.tmp-0000").exists()
    again = Journal(str(tmp_path / "j"))  # another writer (a restarted scheduler) reads it
    assert again.load().closed == {"first"}
    again.remove("second")
    assert again.load().closed == {"first"}
    again.remove("first")
    assert again.load().closed == set() and again.size()["entries"] == 0


def test_storage_settings_resolve():
    assert jr.resolve_storage(None) is None and jr.resolve_storage("off") is None
    assert jr.resolve_storage("session", "/tmp/ray/session_x/") == "/tmp/ray/session_x/scale_journal"
    assert jr.resolve_storage("s3://b/p") == "s3://b/p"
    with pytest.raises(ValueError, match="fmt"):
        Journal.submit(object.__new__(Journal), Submission(id="w", fmt="yaml", payload=b""))


def test_attempt_is_zero_outside_a_primitive():
    assert jr.attempt() == 0
    jr.set_attempt(2)
    assert jr.attempt() == 2
    jr.set_attempt(0)


def test_the_service_journals_and_shares_fairly_unless_told_otherwise():
    a = parse_args({})
    assert a.live.storage == "session" and a.live.fair_share is True
    b = parse_args({"live": {"storage": "off", "fair_share": False, "time_scale": 0.5}})
    assert b.live.storage == "off" and b.live.fair_share is False and b.live.time_scale == 0.5
    # the library's own default stays off (a driver opts in)
    from scale_ray.live import LiveConfig
    assert LiveConfig().storage is None


def test_idempotency_keys_are_checked():
    assert check_key(None) is None and check_key("req-42") == "req-42"
    for bad in ("", "x" * (MAX_KEY_CHARS + 1), "caf\u00e9", "a\nb", 5):
        with pytest.raises(RequestError) as e:
            check_key(bad)
        assert list(e.value.loc) == ["header", "idempotency-key"]


def test_rebuild_validates_a_document_again_with_todays_allow_list():
    doc = _doc([{"name": "a", "compute_gflop": 1, "primitive": "jsontools:add", "args": [1, 2]}])
    sub = Submission(id="w", fmt="json", payload=doc, meta={"content_type": "application/json"})
    wf = rebuild(sub, AllowList(["jsontools:add"]), SchedulerTuning())
    assert wf.calls[0].primitive.fn(1, 2) == 3
    with pytest.raises(ValueError, match="jsontools:add"):
        rebuild(sub, AllowList([]), SchedulerTuning())  # a redeploy removed it


def _submit_path(body: bytes, tuning: SchedulerTuning, allow: AllowList):
    """What POST /v1/workflows does with a body before it is journaled (scheduler.py's
    ``accept``: parse, per-task argument caps, calls), without Ray."""
    from serve_apps.bounds import check_args
    from serve_apps.errors import parse_body
    from serve_apps.workflow_api import WorkflowIn, emulate, to_workflow

    req = parse_body(body, WorkflowIn, "application/json")
    for i, task in enumerate(req.tasks):
        check_args(("body", "tasks", i), task.args, task.kwargs, tuning)
    return emulate(to_workflow(req, allow, tuning.max_tasks), body, None, 0.0)


def _on_a_deep_stack(fn, free: int = 250):
    """``fn()`` called with all but ``free`` frames of the recursion limit in use (a replica's
    start is deep; a worker thread that took the submit is shallow)."""
    import sys

    def down(n):
        return fn() if n <= 0 else down(n - 1)

    import inspect
    return down(sys.getrecursionlimit() - len(inspect.stack(0)) - free)


def test_the_deepest_and_largest_accepted_bodies_rebuild_after_a_restart(tmp_path):
    """Issue 43 (c): a body nested 985 deep was accepted (the parser's own limit, in a worker
    thread) and could not be rebuilt by the next replica (the same parser on a deeper stack).
    One depth check, before parsing, holds at submit and at rebuild alike."""
    from serve_apps.errors import DEFAULT_MAX_BODY_BYTES, MAX_JSON_DEPTH

    tuning = SchedulerTuning(max_args_depth=1000)  # the loosest argument cap there is
    allow = AllowList([])

    def deep(levels: int) -> bytes:  # the body nests 4 levels (body, tasks, task, args) + args
        inner = "[" * (levels - 4) + "1" + "]" * (levels - 4)
        return ('{"name": "deepest", "tasks": [{"name": "a", "compute_gflop": 1, "args": ['
                + inner + ']}]}').encode()

    assert jr_depth(deep(MAX_JSON_DEPTH + 1)) == MAX_JSON_DEPTH + 1
    with pytest.raises(RequestError) as e:  # one past the limit: refused at submit
        _submit_path(deep(MAX_JSON_DEPTH + 1), tuning, allow)
    assert e.value.kind == "json_too_deep" and f"{MAX_JSON_DEPTH} levels" in e.value.msg
    with pytest.raises(RequestError, match="json_too_deep|nested 985"):
        _submit_path(deep(985), tuning, allow)
    per_task = 1 << 20
    big_tasks = [{"name": f"t{i}", "compute_gflop": 1, "args": ["x" * (per_task - 16)]}
                 for i in range(3)]
    largest = json.dumps({"name": "largest", "tasks": big_tasks}).encode()
    assert DEFAULT_MAX_BODY_BYTES - (2 << 20) < len(largest) <= DEFAULT_MAX_BODY_BYTES
    j = Journal(str(tmp_path / "j"))
    for wid, body in (("deepest", deep(MAX_JSON_DEPTH)), ("largest", largest)):
        accepted = _submit_path(body, tuning, allow)  # (a worker thread's shallow stack)
        j.submit(Submission(id=wid, fmt="json", payload=body, name=accepted.spec.name,
                            tenant="t", key=None, meta={"content_type": "application/json"}))
    loaded = {e.submission.id: e.submission for e in j.load().entries}
    for wid in ("deepest", "largest"):
        wf = _on_a_deep_stack(lambda: rebuild(loaded[wid], allow, tuning))
        assert wf.spec.name == wid and len(wf.calls) == (1 if wid == "deepest" else 3)
    # the old limit, the parser's own, depended on the stack: what a shallow stack parsed ...
    json.loads(deep(900))
    with pytest.raises(RecursionError):  # ... a deep one could not
        _on_a_deep_stack(lambda: json.loads(deep(900)))


def jr_depth(body: bytes) -> int:
    from serve_apps.errors import json_depth
    return json_depth(body)


def _files(root) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def _run_workflow(j: Journal, wid: str, tasks: int = 3) -> None:
    j.submit(Submission(id=wid, fmt="json", payload=_doc([{"name": f"t{i}", "compute_gflop": 1}
                                                          for i in range(tasks)]), tenant="t"))
    for i in range(tasks):
        jr.record_start(j.target(wid, i, "json", 0))
        jr.record_result(j.target(wid, i, "json", 0), {"task": i, "pad": "x" * 200}, "node-a")


def test_finished_workflows_fold_into_a_bounded_number_of_files(tmp_path, monkeypatch):
    """Issue 43 (g): the journal reached 65,864 files after 45k tasks (every finished task kept
    its start marker and result until its result was fetched). Now a finished workflow is
    folded into a shared segment (its outputs' results kept, the other tasks' node and time),
    a forgotten one dropped, a sparse segment merged: the files are unfinished work plus about
    retained / (SEGMENT_RECORDS / 4) segments, however many workflows ran, across restarts."""
    monkeypatch.setattr(jr, "SEGMENT_RECORDS", 8)
    root = tmp_path / "j"
    j = Journal(str(root))
    retain, unfinished = 20, 3
    bound = unfinished * 7 + retain // (8 // 4) + 2  # (7 files an unfinished 3-task workflow)
    finished: list[str] = []
    counts = []
    for n in range(240):
        wid = f"w{n:04d}"
        _run_workflow(j, wid)
        if n % 80 == 79:  # a restart: a new writer loads what the last one left
            j = Journal(str(root))
            j.load()
        if n >= unfinished:  # the oldest unfinished one completes; its outputs are kept
            done = f"w{n - unfinished:04d}"
            if n % 5 == 0:
                j.end(done, {"state": "failed", "error": "x", "finished": 1.0,
                             "task_finish": [1.0] * 3, "task_nodes": ["n"] * 3})
            else:
                j.finish(done, keep={2})
            finished.append(done)
            if n % 3 == 0 and len(finished) > 1:
                j.end(finished[-2], {"state": "completed", "error": None, "finished": 1.0,
                                     "task_finish": [1.0] * 3, "task_nodes": ["n"] * 3})
        while len(finished) > retain:  # retain_finished: the oldest is forgotten
            j.remove(finished.pop(0))
        counts.append(_files(root))
        assert counts[-1] <= bound, (n, counts[-1], bound)
    assert max(counts[120:]) <= bound and j.size()["workflows"] == retain + unfinished
    loaded = Journal(str(root)).load()
    assert not loaded.problems and not loaded.unrestorable
    by_id = {e.submission.id: e for e in loaded.entries}
    assert set(by_id) == set(finished) | {f"w{n:04d}" for n in range(237, 240)}
    kept = [e for e in by_id.values() if e.end is None and len(e.results) == 3 and e.runs == {}]
    assert kept, "completed workflows come back with every task done"
    for e in kept:  # the output's value, the others' node and time only
        assert e.results[2][0] == {"task": 2, "pad": "x" * 200} and e.results[2][1] == "node-a"
        assert e.results[0][0] is None and e.results[1][0] is None
    assert any(e.end is not None and e.end["state"] == "failed" for e in by_id.values())


def test_a_fold_interrupted_or_followed_by_a_late_result_loads_once(tmp_path):
    """A crash between writing a workflow's segment record and deleting its directory, or a late
    run (a hedged copy) writing a result after the fold: the segment's record wins and the
    directory is removed at the next load."""
    root = tmp_path / "j"
    j = Journal(str(root))
    _run_workflow(j, "a")
    _run_workflow(j, "b")
    j.finish("a", keep={2})
    jr.record_start(j.target("a", 1, "json", 1))  # a late copy: nothing to record
    jr.record_result(j.target("a", 1, "json", 1), {"late": True}, "node-b")
    assert not (root / "wf" / "a").exists()
    saved = {p.name: p.read_bytes() for p in (root / "wf" / "b").iterdir()}
    j.finish("b", keep={2})
    (root / "wf" / "b").mkdir()  # ... as if the directory's delete never happened
    for name, blob in saved.items():
        (root / "wf" / "b" / name).write_bytes(blob)
    j.finish("b", keep={2})  # a second fold of a folded one only removes the directory
    assert not (root / "wf" / "b").exists()
    (root / "wf" / "b").mkdir()
    (root / "wf" / "b" / "submit").write_bytes(saved["submit"])
    loaded = Journal(str(root)).load()
    assert sorted(e.submission.id for e in loaded.entries) == ["a", "b"]
    assert not loaded.problems and not (root / "wf" / "a").exists()
    assert not (root / "wf" / "b").exists()
    a = next(e for e in loaded.entries if e.submission.id == "a")
    assert a.results[1][0] is None and a.results[2][0]["task"] == 2


def test_a_journal_written_before_the_rename_reads_its_group_as_the_tenant():
    from scale_ray.live.journal_format import submission_of

    old = {"id": "w1", "fmt": "json", "name": "n", "group": "t", "key": None, "submitted": 1.0}
    assert submission_of(old, b"{}").tenant == "t"
    assert submission_of({**old, "tenant": "u"}, b"{}").tenant == "u"


def test_a_local_journal_is_readable_by_its_owner_only(tmp_path):
    """Issue 71 (8): the journal held bodies and results in files 0644 under directories 0755.
    Every file (submissions, start markers, results, segments, closed programs) is 0600 and
    every directory 0700 now, the root of a journal written before included."""
    root = tmp_path / "j"
    root.mkdir()
    root.chmod(0o755)  # a journal of an earlier version
    j = Journal(str(root))
    _run_workflow(j, "w1")
    _run_workflow(j, "w2")
    j.finish("w1", keep={2})
    j.close_program("w2")
    paths = [root, *root.rglob("*")]
    files = {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777) for p in paths
             if p.is_file()}
    dirs = {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777) for p in paths
            if p.is_dir()}
    assert any(k.startswith("done/") for k in files) and "closed/w2" in files
    assert "wf/w2/t0" in files and "wf/w2/s0.0" in files and "wf/w2/submit" in files
    assert set(files.values()) == {"0o600"}, files
    assert set(dirs.values()) == {"0o700"}, dirs
