"""envs.snapshot (a simulator built from a snapshot of the present) and the lookahead planner
acting on one (issue 17: the planner in Serve and in the live scheduler)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.simulator import Simulator
from envs.snapshot import ServerState, TaskState, WorkflowState, build, describe
from policies.heuristics import eft_pick
from policies.lookahead import Lookahead
from scale_ray.config import load_env

REALISTIC = "configs/env/realistic.yaml"


def run_eft(sim: Simulator) -> None:
    while sim.current is not None:
        sim.step(eft_pick(sim))


@pytest.mark.parametrize("seed,steps", [(0, 150), (1, 400), (2, 700), (4, 1000)])
def test_a_snapshot_runs_like_the_simulator_it_describes(seed, steps):
    # waits jump to the next event: with fixed 0.1 s wait steps, a finish that falls on a wait
    # tick is processed before or after it depending on float rounding of the absolute clock,
    # which the snapshot (clock 0 = now) does not share; a task then starts one tick apart
    env = load_env(REALISTIC, {"workload": {"horizon_s": 200.0},
                               "mdp": {"advance_to_next_event": True}}, servers=16)
    sim = Simulator(env)
    sim.reset(seed)
    while True:  # EFT into the episode, to a state with running tasks and finished inputs
        sim.step(eft_pick(sim))
        steps -= 1
        servers, workflows, ids = describe(sim)
        if steps <= 0 and any(s.remaining_s > 0 for s in servers) and sum(
                len(t.inputs) for w in workflows for t in w.tasks) >= 3:
            break
    snap = build(env, servers, workflows, mean_compute=sim.costs.mean_cpu)
    assert snap.sim.current is not None and snap.sim.t == 0.0
    assert snap.sim.tasks[snap.ids[0][0]].compute == sim.tasks[ids[0][0]].compute
    original = sim.fork()
    original.drop_arrivals()
    run_eft(original)
    run_eft(snap.sim)
    t0 = sim.t
    for orig_ids, snap_ids in zip(ids, snap.ids):
        for a, b in zip(orig_ids, snap_ids):
            assert snap.sim.tasks[b].finish == pytest.approx(original.tasks[a].finish - t0, abs=1e-6)
            assert snap.sim.tasks[b].slot == original.tasks[a].slot


def servers_and_chain(busy_fast: float = 0.5):
    """A slow idle server, a fast busy one (``busy_fast`` s left), a 2-task chain whose first
    task is ready and whose input lies on the fast server."""
    servers = [ServerState(1.0, 64.0), ServerState(8.0, 64.0, remaining_s=busy_fast)]
    chain = WorkflowState((TaskState(8.0, 1.0, 0.5, inputs=((1, 0.5),)),
                           TaskState(8.0, 1.0, 0.0, parents=(0,))), age_s=1.0, size=3)
    return servers, [chain]


def test_the_planner_waits_for_a_fast_busy_server_and_not_for_a_slow_one():
    env = load_env(REALISTIC, servers=2)
    servers, wfs = servers_and_chain(0.5)
    assert Lookahead(env).plan(servers, wfs, (0, 0)) == 1  # 0.5 + 1 s there, 8 s on the slow one
    servers, wfs = servers_and_chain(30.0)
    assert Lookahead(env).plan(servers, wfs, (0, 0)) == 0


def test_focus_makes_any_ready_task_current_and_refuses_others():
    env = load_env(REALISTIC, servers=2)
    servers = [ServerState(1.0, 64.0), ServerState(2.0, 64.0)]
    wf = WorkflowState((TaskState(1.0, 1.0), TaskState(5.0, 1.0), TaskState(1.0, 1.0, parents=(1,))))
    snap = build(env, servers, [wf], focus=(0, 0))
    assert snap.sim.current.id == snap.ids[0][0]
    assert build(env, servers, [wf]).sim.current.id == snap.ids[0][1]  # the head: longest path
    with pytest.raises(ValueError, match=r"workflows\[0\].tasks\[2\]: not ready"):
        build(env, servers, [wf], focus=(0, 2))


@pytest.mark.parametrize("wf,match", [
    (WorkflowState((TaskState(1.0, 1.0, parents=(1,)), TaskState(1.0, 1.0, parents=(0,)))),
     r"workflows\[0\].tasks: the parents form a cycle"),
    (WorkflowState((TaskState(1.0, 1.0, parents=(0,)),)), r"workflows\[0\].tasks\[0\].parents"),
    (WorkflowState((TaskState(1.0, 1.0, server=5),)), r"workflows\[0\].tasks\[0\].server: 5"),
    (WorkflowState((TaskState(1.0, 1.0), TaskState(1.0, 1.0, parents=(0,), server=0))),
     r"workflows\[0\].tasks\[1\].server: a running task"),
    (WorkflowState((TaskState(1.0, 1.0),), size=0), r"workflows\[0\].size"),
])
def test_bad_snapshots_name_the_field(wf, match):
    env = load_env(REALISTIC, servers=2)
    with pytest.raises(ValueError, match=match):
        build(env, [ServerState(1.0, 8.0), ServerState(2.0, 8.0)], [wf])


def test_a_busy_server_running_unlisted_work_frees_up_when_it_says():
    env = load_env(REALISTIC, servers=1)
    snap = build(env, [ServerState(2.0, 8.0, remaining_s=3.0)],
                 [WorkflowState((TaskState(2.0, 1.0),))])
    sim = snap.sim
    while sim.current is not None:
        sim.step(0)  # waits until the server is free, then starts there
    assert sim.tasks[snap.ids[0][0]].start == pytest.approx(3.0, abs=0.11)
    assert np.isfinite(sim.tasks[snap.ids[0][0]].finish)


# ------------------------------------------------------------------------- /v1/schedule
def _request(running_server="fast"):
    from serve_apps.schemas import ScheduleRequest

    return ScheduleRequest.model_validate({
        "workflows": [
            {"id": "w1", "arrival_s": 0.0, "tasks": [
                {"id": "a", "compute_gflop": 8.0, "memory_gb": 1.0, "output_gb": 0.5,
                 "inputs": [{"server": "fast", "output_gb": 0.5}]},
                {"id": "b", "compute_gflop": 8.0, "memory_gb": 1.0, "parents": ["a"]},
                {"id": "r", "compute_gflop": 8.0, "memory_gb": 1.0, "running": True,
                 "server": running_server}]},
            {"id": "w2", "arrival_s": 0.5, "tasks": [
                {"id": "x", "compute_gflop": 0.5, "memory_gb": 1.0}]}],
        "servers": [{"id": "slow", "compute": 1.0, "memory_gb": 64.0},
                    {"id": "fast", "compute": 8.0, "memory_gb": 64.0, "remaining_s": 0.5}],
        "now_s": 1.0})


def test_schedule_with_the_planner_waits_where_eft_would_not():
    from serve_apps.decisions import load
    from serve_apps.schedule import schedule, try_policy

    env = load_env(REALISTIC)
    lp = load("lookahead", env)
    try_policy(lp)  # a swap to the planner is tried on a small /v1/schedule request
    out = schedule(_request(), lp, 100, 100)
    # task a waits for the fast server (0.5 + 1 s) rather than 8 s on the slow one; the small
    # task x takes the slow server
    assert out["unassigned"] == [{"workflow": "w1", "task": "a", "reason": "wait", "guard": None}]
    assert [(a["task"], a["server"]) for a in out["assignments"]] == [("x", "slow")]
    eft = schedule(_request(), load("eft", env), 100, 100)
    assert {(a["task"], a["server"]) for a in eft["assignments"]} == {("a", "slow")}


def test_schedule_remembers_a_planner_defer_for_the_rest_of_the_round(monkeypatch):
    """/v1/schedule with ``first_k``: a task the planner defers is unassigned (``wait``), and
    the later asks of the round see it deferred, not waiting for a server."""
    from serve_apps.decisions import load
    from serve_apps.schedule import schedule

    seen = []
    real = Lookahead.plan

    def plan(self, servers, workflows, focus, waiting=None, env=None, deferred=()):
        seen.append((focus, dict(waiting or {}), list(deferred)))
        if len(seen) == 1:
            self.last_deferred = True
            return 1  # the busy fast server: a defer
        return real(self, servers, workflows, focus, waiting, env, deferred)

    lp = load("lookahead:first_k=2", load_env(REALISTIC))
    monkeypatch.setattr(Lookahead, "plan", plan)
    out = schedule(_request(), lp, 100, 100)
    assert out["unassigned"] == [{"workflow": "w1", "task": "a", "reason": "wait", "guard": None}]
    assert seen[0][2] == [] and seen[1] == (seen[1][0], {}, [seen[0][0]])


def test_schedule_remembers_a_planner_wait_as_a_wait_not_a_defer(monkeypatch):
    """The later asks of a /v1/schedule round see a task that waits for a busy server as
    holding that server (``waiting``), not as deferred."""
    from serve_apps.decisions import load
    from serve_apps.schedule import schedule

    seen = []
    real = Lookahead.plan

    def plan(self, servers, workflows, focus, waiting=None, env=None, deferred=()):
        seen.append((focus, dict(waiting or {}), list(deferred)))
        return real(self, servers, workflows, focus, waiting, env, deferred)

    lp = load("lookahead", load_env(REALISTIC))
    monkeypatch.setattr(Lookahead, "plan", plan)
    out = schedule(_request(), lp, 100, 100)
    assert out["unassigned"] == [{"workflow": "w1", "task": "a", "reason": "wait", "guard": None}]
    assert len(seen) == 2 and seen[1][1] == {seen[0][0]: 1} and seen[1][2] == []


def test_schedule_with_the_planner_needs_running_servers_and_refuses_place():
    from serve_apps.decisions import RequestError, load, place
    from serve_apps.schedule import schedule
    from serve_apps.schemas import PlaceRequest

    lp = load("lookahead", load_env(REALISTIC))
    bad = _request()
    bad.workflows[0].tasks[2].server = None
    with pytest.raises(RequestError) as e:
        schedule(bad, lp, 100, 100)
    assert e.value.loc == ["body", "workflows", 0, "tasks", 2, "server"]
    with pytest.raises(RequestError) as e:
        schedule(_request("nowhere"), lp, 100, 100)
    assert "not a server of the request" in e.value.msg
    for field, value, loc in (("parents", ["ghost"], ["parents", 0]), ("id", "a", ["id"])):
        bad = _request()  # an unknown parent, a duplicate id: refused before the planner reads it
        setattr(bad.workflows[0].tasks[1], field, value)
        with pytest.raises(RequestError) as e:
            schedule(bad, lp, 100, 100)
        assert e.value.loc == ["body", "workflows", 0, "tasks", 1, *loc]
    req = PlaceRequest.model_validate({"task": {"compute_gflop": 1.0, "memory_gb": 1.0},
                                       "servers": [{"id": 1, "compute": 1.0, "memory_gb": 2.0}]})
    with pytest.raises(RequestError, match="use /v1/schedule"):
        place(req, lp, 10)


def test_the_snapshot_planner_completes_an_episode_with_valid_decisions(tmp_path):
    """``lookahead:snapshot=true`` (every decision planned on a snapshot, as Serve and the live
    scheduler plan): a whole episode with valid picks and a verified trace; its waits last one
    instant, so it plans more often than a planner whose waits hold until the task starts."""
    from envs.trace import read_trace, verify_trace
    from policies import get_policy
    from scale_ray.evaluation import episode_seed, run_episode

    cfg = load_env(REALISTIC, {"workload": {"horizon_s": 60.0}}, servers=16)
    trace = tmp_path / "snap.jsonl"
    m = run_episode(cfg, "lookahead:snapshot=true", 0, 0, trace)
    assert not m["truncated"] and m["completed_tasks"] == m["arrived_tasks"] > 0
    verify_trace(read_trace(trace))
    pol, sim = get_policy("lookahead:snapshot=true", cfg, seed=0), Simulator(cfg)
    sim.reset(episode_seed(0, 0))
    while sim.current is not None:
        task = sim.current
        a = pol.decide(sim)
        assert sim._accept_l[a] and sim.table.memory_l[a] >= task.memory_gb
        sim.step(a)
    assert sim.metrics()["mean_task_response_s"] == m["mean_task_response_s"]
    sticky = get_policy("lookahead:reservations=until_start", cfg, seed=0)
    sim.reset(episode_seed(0, 0))
    while sim.current is not None:
        sim.step(sticky.decide(sim))
    assert pol.stats["planned"] > sticky.stats["planned"] > 0


def test_instant_reservations_last_one_instant():
    """reservations: instant (the default): a wait reserves its server for this instant only
    (after the clock moves the task is planned again, and may wait again); until_start keeps a
    reservation made earlier until the task starts."""
    from policies import get_policy
    from scale_ray.evaluation import episode_seed

    cfg = load_env(REALISTIC, {"workload": {"horizon_s": 40.0}}, servers=16)
    for spec, instant in (("lookahead", True), ("lookahead:reservations=until_start", False)):
        pol, sim = get_policy(spec, cfg, seed=0), Simulator(cfg)
        sim.reset(episode_seed(0, 1))
        made: dict[int, float] = {}  # task id -> when the planner last chose its wait
        older = 0
        while sim.current is not None:
            tid, before = sim.current.id, pol.stats["waits_chosen"]
            a = pol.decide(sim)
            if pol.stats["waits_chosen"] > before:
                made[tid] = sim.t
            older += sum(1 for t in pol._reserved if made[t] < sim.t)
            sim.step(a)
        assert (older == 0) == instant, (spec, older)


@pytest.mark.parametrize("spec", ["lookahead:first_k=3", "lookahead:first_k=3,snapshot=true"])
def test_first_k_defers_at_most_k_minus_1_tasks_per_instant(spec):
    """first_k = K: the planner may let the head task wait this instant (nothing reserved, the
    next ready task is planned) at most K - 1 times per instant, in the simulator and on
    snapshots (Serve, live); a deferred task is not asked again before the clock moves."""
    from policies import get_policy
    from scale_ray.evaluation import episode_seed

    cfg = load_env(REALISTIC, {"workload": {"horizon_s": 60.0}}, servers=16)
    pol, sim = get_policy(spec, cfg, seed=0), Simulator(cfg)
    sim.reset(episode_seed(0, 0))
    per_instant: dict[float, list[int]] = {}
    while sim.current is not None:
        t, tid = sim.t, sim.current.id
        a = pol.decide(sim)
        if pol.last_deferred:
            assert sim.table.busy[a] and tid not in per_instant.get(t, [])
            assert tid not in pol._reserved  # a defer reserves nothing
            per_instant.setdefault(t, []).append(tid)
        else:
            assert tid not in per_instant.get(t, [])  # not asked again at this instant
        sim.step(a)
    assert pol.stats["deferred"] == sum(map(len, per_instant.values())) > 0
    assert max(map(len, per_instant.values())) <= 2
    assert sim.metrics()["completed_tasks"] == sim.metrics()["arrived_tasks"]


def test_a_snapshot_with_deferred_tasks_sets_them_aside_until_the_clock_moves():
    from envs.snapshot import build

    env = load_env(REALISTIC, servers=2)
    servers = [ServerState(1.0, 64.0), ServerState(4.0, 64.0, remaining_s=1.0)]
    wf = WorkflowState((TaskState(4.0, 1.0, 0.1), TaskState(4.0, 1.0, 0.1)))
    snap = build(env, servers, [wf], deferred=[(0, 0)])
    sim = snap.sim
    assert sim.current.id == snap.ids[0][1]  # the deferred head is not asked
    assert [e[1] for e in sim.core.queue.deferred] == [snap.ids[0][0]]
    sim.step(0)  # the second task starts; the clock moves, the deferred one competes again
    assert sim.current is not None and sim.current.id == snap.ids[0][0]
    with pytest.raises(ValueError, match=r"workflows\[0\]\.tasks\[1\]: deferred but not ready"):
        build(env, servers, [WorkflowState((TaskState(4.0, 1.0, 0.1),
                                            TaskState(4.0, 1.0, 0.1, parents=(0,))))],
              deferred=[(0, 1)])


def test_a_schedule_request_reads_through_the_one_snapshot_builder():
    """/v1/schedule's workflows become snapshots through envs.snapshot.workflow_state: parents as
    positions, inputs in the order given (unknown server: -1), a running task's server."""
    from envs.snapshot import workflow_state
    from serve_apps.planning import _RequestTasks
    from serve_apps.schemas import RequestError, ScheduleRequest

    req = ScheduleRequest.model_validate({"workflows": [{"id": "w", "tasks": [
        {"id": "a", "compute_gflop": 8.0, "memory_gb": 1.0, "output_gb": 0.5,
         "inputs": [{"server": "fast", "output_gb": 0.5}, {"server": "gone", "output_gb": 2.0},
                    {"server": "slow", "output_gb": 1.0}]},
        {"id": "b", "compute_gflop": 4.0, "memory_gb": 2.0, "parents": ["a", "r"]},
        {"id": "r", "compute_gflop": 2.0, "memory_gb": 3.0, "running": True, "server": "fast"}]}],
        "servers": [{"id": "slow", "compute": 1.0, "memory_gb": 64.0},
                    {"id": "fast", "compute": 8.0, "memory_gb": 64.0, "remaining_s": 0.5}]})
    wf = req.workflows[0]
    pos = {"slow": 0, "fast": 1}
    got = workflow_state(wf.tasks, _RequestTasks(wf, 0, pos), 1.5, 7)
    slot = ("slot", 1.0)
    assert got == WorkflowState((
        TaskState(8.0, 1.0, 0.5, (), ((1, 0.5), (-1, 2.0), (0, 1.0)), None,
                  (("memory", 1.0), slot)),
        TaskState(4.0, 2.0, 0.0, (0, 2), (), None, (("memory", 2.0), slot)),
        TaskState(2.0, 3.0, 0.0, (), (), 1, (("memory", 3.0), slot))), 1.5, 7)
    wf.tasks[2].server = "nowhere"
    with pytest.raises(RequestError, match="not a server of the request"):
        _RequestTasks(wf, 0, pos)
