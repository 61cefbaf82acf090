"""envs.programs (mdp.submission: dag, program, per_call) and envs.program_source (the agent-program
generator): hand-built timelines on one server, the estimate by hand, what deciders see, forks."""
from __future__ import annotations

import numpy as np
import pytest

from envs.config import ConfigError, EnvConfig, build
from envs.config_files import load_env
from envs.decision import DONE
from envs.program_source import SHAPES
from envs.programs import WorkEstimate, split_submission
from envs.simulator import Simulator
from envs.workflow import TaskSpec, WorkflowSpec
from envs.workload import make_source
from scale_ray.evaluation import split_order

CHAIN = WorkflowSpec((TaskSpec(4.0, 1.0, 0.0), TaskSpec(4.0, 1.0, 0.0, (0,)),
                      TaskSpec(4.0, 1.0, 0.0, (1,))), "chain")
ONE = WorkflowSpec((TaskSpec(1.0, 1.0, 0.0),), "one")
# a source, then a leaf (1) and a two-chain (2 -> 3): the hop order starts 2 before 1
FORK = WorkflowSpec((TaskSpec(1.0, 1.0, 0.0), TaskSpec(1.0, 1.0, 0.0, (0,)),
                     TaskSpec(1.0, 1.0, 0.0, (0,)), TaskSpec(1.0, 1.0, 0.0, (2,))), "fork")


def _env(order: str, submission: str, servers: int = 1) -> EnvConfig:
    return build(EnvConfig, {"cluster": {"servers": servers, "tiers": [
        {"name": "only", "compute": 1.0, "memory_gb": 80.0, "ratio": 1}]},
        "mdp": {"order": order, "submission": submission, "mask_infeasible": True,
                "ask_only_startable": True, "head_of_line_blocking": False}})


def _starts(order: str, submission: str, arrivals) -> list[tuple[int, int]]:
    """(workflow, task index) in the order one server starts them."""
    sim = Simulator(_env(order, submission))
    sim.reset(0, arrivals=arrivals)
    seen = []
    while sim.current is not None:
        t = sim.current
        if sim.table.fits_now(0, t.demands):
            seen.append((t.wf.id, t.id - t.wf.tasks[0].id))
        sim.step(0)
    return seen


def test_per_call_keys_a_call_by_the_time_it_became_ready():
    # t=0 a 3-chain (4 s a call); t=0.5 a one-call request. Program-aware fifo finishes the
    # chain first (its calls carry the program's arrival, 0); submitted one by one, the chain's
    # second call is submitted at 4 s, after the one-call request (0.5 s): it goes first.
    arrivals = [(0.0, CHAIN), (0.5, ONE)]
    assert _starts("fifo", "dag", arrivals) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert _starts("fifo", "program", arrivals) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert _starts("fifo", "per_call", arrivals) == [(0, 0), (1, 0), (0, 1), (0, 2)]
    # las per call sees no service (every call 0): as fifo per call
    assert _starts("las", "per_call", arrivals) == [(0, 0), (1, 0), (0, 1), (0, 2)]


def test_program_hides_the_rank_that_needs_the_future():
    # after the source, calls 1 (a leaf) and 2 (the head of a 2-chain) exist together; the
    # hop tie-break (longest path to a sink first) needs the DAG: program mode takes call ids
    assert _starts("fifo", "dag", [(0.0, FORK)]) == [(0, 0), (0, 2), (0, 1), (0, 3)]
    assert _starts("fifo", "program", [(0.0, FORK)]) == [(0, 0), (0, 1), (0, 2), (0, 3)]


def test_srpt_program_level_from_what_exists_then_from_the_estimate():
    sim = Simulator(_env("srpt", "program"))
    sim.reset(0, arrivals=[(0.0, CHAIN), (20.0, CHAIN)])
    first = sim.workflows[0]
    assert first.level == pytest.approx(4.0)  # no history: the one call that exists (4 GFLOP/1)
    while len(sim.workflows) < 2:
        sim.step(0)
    second = sim.workflows[1]
    # the second arrived after the first finished (12 s of work): its level is the estimate
    # E[W - 0 | W > 0] = 12, then E[W - 4 | W > 4] = 8 after its first call
    assert sim.submission.estimate.programs == 1
    assert second.level == pytest.approx(12.0)
    while second.tasks[0].state != DONE:
        sim.step(0)
    assert second.level == pytest.approx(8.0)
    while sim.current is not None:
        sim.step(0)
    assert sim.submission.estimate.programs == 2


def test_work_estimate_by_hand():
    est = WorkEstimate()
    assert est.remaining_s("a", 0.0) is None and est.bound_s("a") is None
    for w, b in ((10.0, 5.0), (20.0, 7.0), (40.0, 9.0)):
        est.add("a", w, b)
    est.add("b", 100.0, 50.0)
    assert est.remaining_s("a", 0.0) == pytest.approx(70.0 / 3)
    assert est.remaining_s("a", 15.0) == pytest.approx((5.0 + 25.0) / 2)  # only W > 15
    # past every program of its kind: the pooled kinds (only b's 100 exceeds 45)
    assert est.remaining_s("a", 45.0) == pytest.approx(55.0)
    assert est.remaining_s("a", 100.0) is None
    assert est.bound_s("a") == pytest.approx(7.0)
    assert est.bound_s("unknown") == pytest.approx((5 + 7 + 9 + 50) / 4)
    copy = est.copy()
    copy.add("a", 1000.0, 1.0)
    assert est.programs == 4 and copy.programs == 5
    assert est.remaining_s("a", 45.0) == pytest.approx(55.0)


def test_deciders_see_no_successors_under_program():
    for mode, kids in (("dag", 2.0), ("program", 0.0), ("per_call", 0.0)):
        sim = Simulator(_env("fifo", mode))
        sim.reset(0, arrivals=[(0.0, FORK)])
        obs = sim.observe()  # the source: 2 children in the DAG
        f = sim.cfg.features
        assert obs["task"][2] == pytest.approx(kids / f.successors), mode


def test_modes_see_the_same_workload_and_the_fork_copies_the_estimate():
    env = load_env("configs/env/programs.yaml", ["workload.horizon_s=30"], servers=4)
    arrived = set()
    for mode in ("dag", "program", "per_call"):
        sim = Simulator(build(EnvConfig, {**_mapping(env), "mdp": {
            **_mapping(env)["mdp"], "submission": mode}}))
        sim.reset(3)
        while sim.current is not None:
            sim.step(int(np.flatnonzero(sim.observe()["action_mask"])[0]))
        m = sim.metrics()
        arrived.add((m["arrived_tasks"], len(sim.workflows)))
    assert len(arrived) == 1
    sim = Simulator(build(EnvConfig, {**_mapping(env), "mdp": {**_mapping(env)["mdp"],
                                                               "order": "srpt"}}))
    sim.reset(3)
    for _ in range(200):
        if sim.current is None:
            break
        sim.step(int(np.flatnonzero(sim.observe()["action_mask"])[0]))
    fork = sim.fork()
    assert fork.submission is not sim.submission
    assert fork.submission.estimate is not sim.submission.estimate
    n = sim.submission.estimate.programs
    fork.submission.estimate.add("react", 1.0, 1.0)
    assert sim.submission.estimate.programs == n


def _mapping(env: EnvConfig) -> dict:
    from envs.config import to_dict
    return to_dict(env)


def test_generator_shapes_and_reproducibility():
    env = load_env("configs/env/programs.yaml")
    src = make_source(env.workload)
    a = [src.next_workflow(np.random.default_rng(5)) for _ in range(1)]
    b = [src.next_workflow(np.random.default_rng(5)) for _ in range(1)]
    assert a == b
    rng = np.random.default_rng(0)
    wfs = [src.next_workflow(rng) for _ in range(300)]
    assert {w.name for w in wfs} == set(SHAPES)
    for w in wfs:
        sinks = [i for i, _ in enumerate(w.tasks) if not any(i in t.parents for t in w.tasks)]
        assert sinks == [len(w.tasks) - 1], w.name  # one answer, last
        assert w.tasks[-1].kind == "llm" and not w.tasks[0].parents
        if w.name == "react":
            assert len(w.tasks) % 2 == 1 and len(w.tasks) >= 3
            assert all(t.parents == (i - 1,) for i, t in enumerate(w.tasks) if i)


def test_generator_config_is_validated():
    with pytest.raises(ConfigError, match="fanout_min"):
        load_env(None, ["workload.programs.fanout_min=5", "workload.programs.fanout_max=2"])
    with pytest.raises(ConfigError, match="weights"):
        load_env(None, ["workload.programs.react=0", "workload.programs.plan=0",
                        "workload.programs.branch=0"])
    with pytest.raises(ConfigError, match="submission"):
        load_env(None, ["mdp.submission=calls"])


def test_spec_suffix_sets_the_submission():
    assert split_submission("eft@fifo+per_call") == ("eft@fifo", "per_call")
    assert split_submission("eft+program") == ("eft", "program")
    assert split_submission("path/a+b") == ("path/a+b", None)
    base, env = split_order("eft@srpt+program", EnvConfig())
    assert base == "eft" and env.mdp.order == "srpt" and env.mdp.submission == "program"


@pytest.mark.parametrize("mode", ["program", "per_call"])
def test_the_planner_rolls_out_only_the_calls_that_exist(monkeypatch, mode):
    """Under a hidden future the planner's rollouts hold the calls that exist (ready, running,
    or waiting on nothing), never a call whose parents are unfinished; per call each call is its
    own workflow to the objective. Under dag they hold the whole DAG. A program under srpt (a
    dynamic order: forked rollouts, which would run the hidden calls) is refused, naming why."""
    from policies import fast_rollout
    from scale_ray.evaluation import run_episode
    seen = {"rollouts": 0, "hidden": 0, "dag_waiting": 0}
    init = fast_rollout.Rollouts.__init__

    def spy(self, sim, *a, **k):
        init(self, sim, *a, **k)
        seen["rollouts"] += 1
        hidden = sum(1 for t in self._present if t.state == 3 and t.pending > 0)  # WAITING
        seen["hidden" if sim.submission.hidden else "dag_waiting"] += hidden
        if sim.submission.per_call:
            assert self.wf == list(self.tid)

    monkeypatch.setattr(fast_rollout.Rollouts, "__init__", spy)
    env = load_env("configs/env/programs.yaml", ["workload.horizon_s=30", "cluster.servers=8"])
    m = run_episode(env, f"lookahead@fifo+{mode}", 0)
    assert m["completed_tasks"] == m["arrived_tasks"] > 50 and seen["rollouts"] > 20
    assert seen["hidden"] == 0
    run_episode(env, "lookahead@fifo+dag", 0)
    assert seen["dag_waiting"] > 0  # (the same workload under dag: the future is rolled out)
    if mode == "program":  # (per call no order is dynamic: srpt keys each call once)
        with pytest.raises(ValueError, match="fast rollouts"):
            run_episode(env, "lookahead@srpt+program", 0)


def test_bench_pairs_the_modes_on_the_same_requests():
    from scale_ray.bench.programs import format_rows, measure
    env = load_env("configs/env/programs.yaml", ["workload.horizon_s=40"])
    rows, eps = measure(env, ["fifo", "las"], [8], 2, 0, 1, "test")
    by = {r["order"]: r for r in rows}
    # las reads no future: knowing the DAG changes nothing; per call it sees no service, as fifo
    assert by["las"]["program"] == by["las"]["dag"]
    assert by["las"]["per_call"] == by["fifo"]["per_call"]
    assert by["las"]["program_vs_dag_workflow"]["mean_rel_diff"] == 0.0
    # the pair is program / per_call - 1 over the same episodes
    mean = {(e["policy"], e["episode"]): e["mean_workflow_response_s"] for e in eps}
    want = sum(mean[("eft@fifo+program", k)] / mean[("eft@fifo+per_call", k)] - 1
               for k in (0, 1)) / 2
    assert by["fifo"]["program_vs_per_call_workflow"]["mean_rel_diff"] == pytest.approx(want)
    # and from the other side (the probe's sign): per_call / program - 1, its own denominator
    back = sum(mean[("eft@fifo+per_call", k)] / mean[("eft@fifo+program", k)] - 1
               for k in (0, 1)) / 2
    assert by["fifo"]["per_call_vs_program_workflow"]["mean_rel_diff"] == pytest.approx(back)
    assert {e["arrived_tasks"] for e in eps if e["episode"] == 0} == {
        next(e["arrived_tasks"] for e in eps if e["episode"] == 0)}
    assert "fifo" in format_rows([r | {"setting": "s", "load": 0.8} for r in rows])


def test_live_and_serve_refuse_a_simulator_only_submission():
    from policies import get_policy
    from scale_ray.live.scheduler import LiveScheduler
    env = load_env(None, ["mdp.submission=program"])
    with pytest.raises(ValueError, match="live scheduler takes whole DAGs"):
        LiveScheduler(get_policy("eft", env), env)
    from serve_apps.decisions import load
    with pytest.raises(ValueError, match="placement service takes whole DAGs"):
        load("eft", env)
