"""Nothing a workflow carries stops the live scheduler's thread (issue 71 item 1): an error while
admitting, placing, starting (Ray's ``.options()``) or settling one task fails that task's
workflow with a SchedulingError naming the task and the cause; every other workflow runs on.
The real scheduler thread over a stand-in for Ray's client calls (tests/fake_ray.py)."""

from __future__ import annotations

import time

import pytest
from fake_ray import Crash, crash_on, raw_node, scheduler, wait_dead, wait_done
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envs.config import ConfigError, build
from envs.nodes import NodeTable
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.live import (LiveConfig, LiveScheduler, SchedulingError, WorkflowError,
                            WorkflowQuarantined, collect)
from scale_ray.live.admission import Admission
from scale_ray.live.cluster import NodeInfo, server_caps
from scale_ray.live.completions import Completions
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.tasks import RUNNING
from scale_ray.live.workflow import Primitive, emulated_body

PLAIN = [raw_node(0, {"CPU": 2, "memory": 8e9, "boom": 1})]
SLOTS = [raw_node(0, {"CPU": 2, "scale_slot": 1, "scale_compute": 2.0, "scale_memory_gb": 8.0,
                      "memory": 8e9, "boom": 1})]


@pytest.fixture(params=["nodes", "slots"])
def sched(request, monkeypatch):
    s, _ = scheduler(monkeypatch, PLAIN if request.param == "nodes" else SLOTS)
    yield s
    s.shutdown(timeout=5)


def _prim(name: str = "ok", **ray_options) -> Primitive:
    return Primitive(emulated_body, 1.0, name=name, ray_options=ray_options)


def _run_both(sched, bad: Primitive) -> None:
    """``bad``'s workflow fails with a SchedulingError naming it; a good one submitted with it
    and one submitted after it complete; the thread lives."""
    before = _prim()
    h_bad = sched.submit(bad.bind(0))
    h_ok = sched.submit(before.bind(1))
    assert wait_done([h_bad, h_ok]), sched.thread_error
    assert isinstance(h_bad.error, SchedulingError), h_bad.error
    assert f"({bad.name!r})" in str(h_bad.error), h_bad.error
    assert h_ok.error is None and h_ok.result(timeout=5) == 2
    after = sched.submit(_prim().bind(2))
    assert after.result(timeout=5) == 3
    assert sched.thread_error is None
    assert sched.counters["scheduling_errors"] >= 1


def test_options_ray_refuses_on_the_scheduler_thread_fail_only_their_workflow(sched):
    """The issue's ``num_cpus: 0.00005`` reached Ray's ``.options()`` on the scheduler thread
    and killed it. A primitive whose options changed after they were checked (a pickled one
    from a client, say) still raises there: its workflow fails, naming Ray's reason."""
    bad = _prim("fine", num_cpus=1)
    bad.ray_options["num_cpus"] = 0.00005  # (past the check at construction)
    bad.request = bad.request.__class__(0.00005, (("CPU", 0.00005),), 0.0)
    _run_both(sched, bad)


def test_a_runtime_env_that_fails_on_the_scheduler_fails_its_workflow(sched, tmp_path):
    """A local ``working_dir`` checked where the primitive was made, gone where it runs."""
    d = tmp_path / "code"
    d.mkdir()
    bad = _prim("code", runtime_env={"working_dir": str(d)})
    d.rmdir()
    _run_both(sched, bad)


def test_a_runtime_env_ray_refuses_is_refused_at_submit():
    with pytest.raises(WorkflowError, match=r"runtime_env: runtime_env\['pip'\] must be"):
        _prim("pip", runtime_env={"pip": 5})


def test_a_policy_that_raises_on_one_task_fails_only_its_workflow(sched, monkeypatch):
    decide = sched.policy.decide

    def picky(state):
        if state.task.prim.name == "bad":
            raise ZeroDivisionError("no server for you")
        return decide(state)

    monkeypatch.setattr(sched.policy, "decide", picky)
    _run_both(sched, _prim("bad"))


def test_the_decision_core_raising_on_one_task_fails_only_its_workflow(sched, monkeypatch):
    fits_now = NodeTable.fits_now

    def fragile(self, i, demands):
        if ("boom", 1.0) in demands:
            raise KeyError("boom")
        return fits_now(self, i, demands)

    monkeypatch.setattr(NodeTable, "fits_now", fragile)
    _run_both(sched, _prim("bad", resources={"boom": 1}))


def test_an_admission_error_fails_only_its_workflow(sched, monkeypatch):
    admit = Admission.admit

    def fragile(self, h):
        if h.workflow.calls[0].primitive.name == "bad":
            raise OverflowError("keys")
        return admit(self, h)

    monkeypatch.setattr(Admission, "admit", fragile)
    bad = _prim("bad")
    h = sched.submit(bad.bind(0))
    assert wait_done([h]) and isinstance(h.error, SchedulingError), h.error
    assert "could not be admitted: OverflowError: keys" in str(h.error)
    assert sched.submit(_prim().bind(1)).result(timeout=5) == 2
    assert sched.thread_error is None


def test_an_error_settling_a_result_fails_its_workflow_and_frees_its_server(sched, monkeypatch):
    """One server: the next workflow runs there, so the failed task's hold was released."""
    finish = Completions.finish

    def fragile(self, t, node, run_s):
        if t.prim.name == "bad":
            raise ValueError("result")
        return finish(self, t, node, run_s)

    monkeypatch.setattr(Completions, "finish", fragile)
    _run_both(sched, _prim("bad"))
    assert all(not s.running for s in sched.alive_servers)


def test_a_hedged_copy_that_cannot_start_leaves_the_task_on_its_first_run():
    """Hedging (``live.hedge: all``): a copy whose start raises is not made; the straggler's
    own run goes on and nothing is held for the copy (runs are stand-ins, no thread)."""
    env = load_env(None, servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0, hedge="all"))
    sched.nodes.slotted = False
    a, b = (LiveServer(i, NodeInfo(n, 1, 1.0, 8.0, n, 0.0, 0.0,
                                   server_caps({"CPU": 2}, 1), 0.0), 0)
            for i, n in enumerate(("a", "b")))
    sched.set_alive([a, b])

    def run(srv, prim, meta, args, kwargs):
        if srv is b:
            raise ValueError("Ray refused the copy's options")
        return "value", "status"

    sched.nodes.run = run
    sched.admission.admit(WorkflowHandle(0, collect([_prim().bind(0)]), 0.0))
    (t,) = [e[2] for e in sched.placement.queue.heap]
    runs = sched.runs
    runs.submit(t, a, 0.0)
    sched.placement.table.start(0, t, t.demands, 1.0)
    runs.due.append((t.token, t))
    runs.launch_copies(1.0)
    assert t.copy is None and t.state == RUNNING and t.server is a and not runs.due
    assert not b.running and sched.counters["scheduling_errors"] == 1


# ------------------------------------------------------------------------- quarantine
def test_a_workflow_that_stops_every_scheduler_resuming_it_is_quarantined(monkeypatch,
                                                                         tmp_path):
    """Issue 71 (1): every new replica resumed the journaled request and crashed again. A
    workflow whose resume failed ``resume_attempts`` (3) times in a row fails at the next
    resume with WorkflowQuarantined (journaled: it stays failed), is not run, and the
    scheduler serves everyone else."""
    crash_on(monkeypatch, "crasher")
    store = str(tmp_path / "journal")
    s, _ = scheduler(monkeypatch, PLAIN, storage=store)
    h = s.submit(_prim("c").bind(0), name="crasher", key="k1")
    wait_dead(s)
    s.shutdown(timeout=5)
    for _ in range(3):  # three schedulers resume it, each is stopped by it
        s, _ = scheduler(monkeypatch, PLAIN, storage=store)
        (h,) = s.resume()
        assert not h.done() or s.thread_error is not None
        wait_dead(s)
        s.shutdown(timeout=5)
    s, _ = scheduler(monkeypatch, PLAIN, storage=store)
    (h,) = s.resume()
    assert h.done() and isinstance(h.error, WorkflowQuarantined), h.error
    assert "resumed 3 times" in str(h.error) and "resume_attempts=3" in str(h.error)
    assert h.key == "k1" and s.submit(_prim().bind(1), key="k1") is h  # still its key's
    assert s.submit(_prim().bind(1)).result(timeout=5) == 2
    assert s.thread_error is None
    s.shutdown(timeout=5)
    s, _ = scheduler(monkeypatch, PLAIN, storage=store)  # it stays failed, not run
    h = {x.name: x for x in s.resume()}["crasher"]
    assert h.done() and isinstance(h.error, WorkflowQuarantined), h.error
    time.sleep(0.05)
    assert s.thread_error is None
    s.shutdown(timeout=5)


def test_progress_or_a_clean_shutdown_restarts_the_count(monkeypatch, tmp_path):
    """A resume counts as failed only when the scheduler that made it stopped, not cleanly,
    before a task of the workflow finished. ``stuck`` never starts (its demand never fits
    now); ``moving`` runs a first task after every resume (stand-in runs journal no result,
    so it runs again). Five clean restarts quarantine neither; then five restarts after which
    the thread had died quarantine ``stuck`` at the fourth, never ``moving``."""
    monkeypatch.setattr(NodeTable, "fits_now", lambda self, i, d: ("boom", 1.0) not in d)
    stuck = Primitive(emulated_body, 1.0, name="stuck", ray_options={"resources": {"boom": 1}})
    store = str(tmp_path / "journal")
    s, _ = scheduler(monkeypatch, PLAIN, storage=store)
    s.submit(stuck.bind(0), name="stuck")
    s.submit(stuck.bind(_prim("first").bind(0)), name="moving")

    def restart(clean: bool) -> dict:
        s, _ = scheduler(monkeypatch, PLAIN, storage=store)
        hs = {h.name: h for h in s.resume()}
        if "moving" in hs:  # its first task finishes in this scheduler
            deadline = time.monotonic() + 10
            while hs["moving"].task_finish_wall[0] is None:
                assert time.monotonic() < deadline
                time.sleep(0.005)
        if not clean:
            s.thread_error = Crash("down")  # (what a thread that died leaves)
        s.shutdown(timeout=5)
        return hs

    s.shutdown(timeout=5)
    for _ in range(5):
        hs = restart(clean=True)
        assert not any(h.done() for h in hs.values())
    for k in range(5):
        hs = restart(clean=False)
        assert not hs["moving"].done()
        assert hs["stuck"].done() == (k >= 3), k
    assert isinstance(hs["stuck"].error, WorkflowQuarantined)


def test_resume_attempts_is_checked():
    with pytest.raises(ConfigError, match="resume_attempts"):
        build(LiveConfig, {"resume_attempts": 0}, "live")


# ------------------------------------------------------------------------- the Python fuzz
ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 10 ** 6), st.text(max_size=8),
                st.floats(allow_nan=True, allow_infinity=True))
AMOUNTS = st.one_of(st.sampled_from([0, 1e-4, 5e-5, 0.25, 0.5, 1, 1.5, 2, 4]), ODD)
OPTIONS = st.fixed_dictionaries({}, optional={
    "num_cpus": AMOUNTS, "num_gpus": AMOUNTS, "memory": AMOUNTS,
    "resources": st.one_of(ODD, st.dictionaries(st.one_of(st.just("boom"), st.text(max_size=8)),
                                                AMOUNTS, max_size=3)),
    "accelerator_type": st.one_of(st.just("A100"), ODD),
    "label_selector": st.one_of(ODD, st.dictionaries(
        st.sampled_from(["zone", "a" * 100 + "/k", "x/"]), st.one_of(
            st.sampled_from(["z", "!z", "in(a,b)"]), ODD), max_size=2)),
    "runtime_env": st.one_of(ODD, st.sampled_from([{"pip": 5}, {"env_vars": {"A": "1"}},
                                                   {"env_vars": {"A": 1}}, {}, {"bogus": 1}])),
    "max_retries": ODD, "num_returns": st.sampled_from([1, 2, None]),
    "scheduling_strategy": st.sampled_from(["SPREAD", "DEFAULT"])})
SEEN = {"made": 0, "ended": 0}


@pytest.fixture(scope="module")
def fuzz_scheds():
    mp = pytest.MonkeyPatch()
    made = [scheduler(mp, PLAIN)[0], scheduler(mp, SLOTS)[0]]
    yield made
    for s in made:
        s.shutdown(timeout=5)
    mp.undo()
    assert SEEN["made"] >= 20 and SEEN["ended"] >= 30, SEEN  # many reached the scheduler


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(OPTIONS)
@example({"runtime_env": {"pip": 5}})
@example({"num_cpus": 0})
def test_generated_options_of_python_primitives_never_stop_the_scheduler(fuzz_scheds, opts):
    """Any options a Python caller gives a primitive (wrong types, NaN, unknown keys, bad
    runtime envs...): refused when it is made (a WorkflowError naming the option), or its
    workflow ends, completed or failed with a reason; the thread never dies."""
    try:
        p = Primitive(emulated_body, 1.0, name="fuzz", ray_options=opts)
    except WorkflowError as e:
        assert "primitive 'fuzz'" in str(e)
        return
    SEEN["made"] += 1
    for s in fuzz_scheds:
        try:
            h = s.submit(p.bind(0))
        except WorkflowError:  # no server could ever run it (a 422 in the service)
            continue
        assert wait_done([h], 10), s.thread_error
        SEEN["ended"] += 1
        assert h.error is None or str(h.error), h.error
        assert s.thread_error is None, (s.thread_error, opts)
