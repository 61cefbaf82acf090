"""A LiveScheduler with a journal (``LiveConfig.storage``) on a real local cluster: a driver that
stops mid-run and starts again with the same storage resumes its workflows (finished primitives
are not run again, the one that was running runs again and reads ``attempt() == 1``),
idempotent submits, failed workflows that stay failed, and a damaged journal that is reported,
never fatal; in the slot model and in Ray's resource model. The service's kill -9 / redeploy tests are in tests/test_service.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import ray
from processes import no_ray_connection

from policies import get_policy
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler, WorkflowFailed, attempt, primitive
from scale_ray.live.cluster import SLOT_RESOURCE, LocalHeteroCluster
from scale_ray.live.programs import ProgramClosed, StepResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@primitive(compute_gflop=1.0, emulate=False)
def step(x, tag, marks, gate=None):
    """Leave a marker ``<tag>.<attempt>``; wait for ``gate`` to exist; return x + 1."""
    Path(marks, f"{tag}.{attempt()}").write_text("")
    while gate is not None and not os.path.exists(gate):
        time.sleep(0.05)
    return x + 1


@primitive(compute_gflop=1.0, emulate=False)
def boom(x, marks):
    Path(marks, f"boom.{attempt()}").write_text("")
    raise ValueError("no such city")


@pytest.fixture(scope="module", params=["slots", "nodes"])
def env(request):
    """A scale_slot cluster (the slot model), then a plain Ray node of 3 CPUs (Ray's resource
    model: one whole-node server, every task that fits at once)."""
    no_ray_connection()
    env = load_env(None, ["cluster.servers=3"])
    if request.param == "slots":
        with LocalHeteroCluster(env.cluster):
            yield env
        return
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        yield env
    finally:
        ray.shutdown()


def _marks(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_restarted_driver_resumes_without_running_finished_tasks_again(env, tmp_path):
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    cfg = LiveConfig(time_scale=0.0, storage=str(tmp_path / "journal"))
    s1 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    h = s1.submit(step.bind(step.bind(step.bind(1, "a", str(marks)), "b", str(marks), str(gate)),
                            "c", str(marks)), key="req-1")
    assert s1.submit(step.bind(0, "other", str(marks)), key="req-1") is h  # same key: same one
    bad = s1.submit(boom.bind(1, str(marks)), key="req-2")
    with pytest.raises(WorkflowFailed):
        bad.result(timeout=60)
    slots = any(n["Resources"].get(SLOT_RESOURCE) for n in ray.nodes() if n["Alive"])
    assert s1.placement.slotted is slots  # a plain node: whole Ray nodes
    _wait_for(marks / "b.0")  # a finished, b is running: the driver stops now
    s1.shutdown()
    assert s1.durable.size()["workflows"] == 2

    s2 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    resumed = {x.key: x for x in s2.resume()}
    assert set(resumed) == {"req-1", "req-2"}
    assert not s2.durable.unrestorable and not s2.durable.journal_problems
    again = s2.submit(step.bind(0, "other", str(marks)), key="req-1")
    assert again is resumed["req-1"]  # the key still names the resumed workflow
    # failed before the restart: failed still, with the primitive's own exception, not re-run
    assert resumed["req-2"].done() and isinstance(resumed["req-2"].error, ValueError)
    assert "no such city" in str(resumed["req-2"].error)
    gate.write_text("")
    assert again.result(timeout=60) == 4
    # a ran once (its journaled result fed b), b ran again as attempt 1, c once; boom once
    assert _marks(marks) == ["a.0", "b.0", "b.1", "boom.0", "c.0"]
    assert again.task_attempts == [0, 0, 0]  # no loss counted against max_retries
    s2.durable.compact(again)  # fetched: only its record stays
    size = s2.durable.size()
    s2.forget([again, resumed["req-2"]])
    assert s2.durable.size()["workflows"] == 0 < size["workflows"]
    s2.shutdown()


def test_a_resumed_program_keeps_its_steps_together(env, tmp_path):
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    cfg = LiveConfig(time_scale=0.0, storage=str(tmp_path / "journal"))
    s1 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    prog = s1.program("agent")
    assert prog.submit(step.bind(1, "think", str(marks))).result(timeout=60) == 2
    prog.submit(step.bind(2, "act", str(marks), str(gate)))  # the agent's next step, running
    prog.close()  # journaled: it stays closed
    open_prog = s1.program("open")
    for tag in ("open", "open2"):  # two steps: the journal links the second to the first
        open_prog.submit(step.bind(7, tag, str(marks)))
    alone = s1.submit(step.bind(5, "alone", str(marks)))
    assert alone.result(timeout=60) == 6
    _wait_for(marks / "act.0")
    s1.shutdown()

    s2 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    by_name = {}
    for h in s2.resume():
        by_name.setdefault(h.workflow.calls[0].args[1], h)
    think, act, other = by_name["think"], by_name["act"], by_name["alone"]
    # the journal linked the step to its program's first step: one program again, its arrival
    # the first step's; a workflow submitted alone stays alone
    assert act.program is not None and act.program is think.program
    assert act.program.handles == [think, act] and other.program is None
    assert act.program.started_wall == think.submitted_wall <= act.submitted_wall
    assert act.program.closed and not by_name["open"].program.closed
    with pytest.raises(ProgramClosed):
        act.program.submit(step.bind(3, "late", str(marks)))
    assert by_name["open"].program.submit(step.bind(8, "more", str(marks))).result(timeout=60) == 9
    gate.write_text("")
    assert act.result(timeout=60) == 3
    assert act.live_record.arrival == act.program.arrival
    s2.shutdown()


def test_a_held_step_survives_a_restart_and_gets_its_input(env, tmp_path):
    """A step naming a running step's result (``StepResult``) waits for it; the driver stops
    before it ran; after the restart it waits for the resumed step and gets its value."""
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    cfg = LiveConfig(time_scale=0.0, storage=str(tmp_path / "journal"))
    s1 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    prog = s1.program("agent")
    plan = prog.submit(step.bind(1, "plan", str(marks), str(gate)))
    act = prog.submit(step.bind(StepResult(plan, 0), "act", str(marks)))
    _wait_for(marks / "plan.0")
    assert not act.done() and act.live_record is None  # held: the scheduler has not seen it
    s1.shutdown()

    s2 = LiveScheduler(get_policy("eft", env), env, cfg).start()
    back = {h.workflow.calls[0].args[1]: h for h in s2.resume()}
    assert back["act"].program is back["plan"].program and back["plan"].pins == 1
    gate.write_text("")
    assert back["act"].result(timeout=60) == 3  # plan's 2, + 1
    assert _marks(marks) == ["act.0", "plan.0", "plan.1"]
    assert back["plan"].pins == 0
    # an earlier step that fails fails the step that names it; the cause is named
    prog = s2.program("agent")
    bad = prog.submit(boom.bind(1, str(marks)))
    after = prog.submit(step.bind(StepResult(bad, 0), "never", str(marks)))
    with pytest.raises(WorkflowFailed, match="failed"):
        after.result(timeout=60)
    assert not (marks / "never.0").exists()
    s2.shutdown()


def test_a_damaged_journal_is_reported_and_skipped(env, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = LiveConfig(time_scale=0.0, storage=str(tmp_path / "journal"))
    with LiveScheduler(get_policy("eft", env), env, cfg) as s1:
        h = s1.submit(step.bind(step.bind(1, "x", str(marks)), "y", str(marks)))
        other = s1.submit(step.bind(1, "z", str(marks)))
        assert h.result(timeout=60) == 3 and other.result(timeout=60) == 2
    root = tmp_path / "journal" / "wf"
    t0 = root / h.jid / "t0"
    t0.write_bytes(t0.read_bytes()[:-4])  # truncated: x runs again, y's result stays
    (root / other.jid / "submit").write_bytes(b"\x00" * 10)  # unreadable: not resumable
    with LiveScheduler(get_policy("eft", env), env, cfg) as s2:
        (back,) = s2.resume()
        assert back.result(timeout=60) == 3
        assert other.jid in s2.durable.unrestorable and len(s2.durable.journal_problems) == 2
    assert _marks(marks) == ["x.0", "x.1", "y.0", "z.0"]
