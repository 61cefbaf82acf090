"""Invariants over many seeds, switches and random action sequences, checked by replaying the
trace with the independent checker (envs.trace.verify_trace)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.config import EnvConfig, build
from envs.simulator import Simulator
from envs.trace import TraceError, verify_trace


def small_env(servers: int, switches: dict, dynamics: dict, horizon: float) -> EnvConfig:
    return build(EnvConfig, {
        "cluster": {"servers": servers},
        "workload": {"horizon_s": horizon, "arrival_rate_16": 1.2},
        "mdp": switches, "dynamics": dynamics, "n_max": servers * 3,
    })


switches = st.fixed_dictionaries({
    "mask_infeasible": st.booleans(),
    "advance_to_next_event": st.booleans(),
    "transfer_delays_start": st.booleans(),
    "head_of_line_blocking": st.booleans(),
    "ask_only_startable": st.booleans(),
    "first_level": st.sampled_from(["hop", "upward_rank"]),
})
dynamics = st.one_of(
    st.just({}),
    st.fixed_dictionaries({
        "fail_rate_per_server_s": st.sampled_from([0.0, 0.01, 0.05]),
        "rejoin_after_s": st.sampled_from([None, 1.0]),
        "join_rate_s": st.sampled_from([0.0, 0.1]),
        "leave_rate_s": st.sampled_from([0.0, 0.1]),
    }),
    st.just({"events": [{"t": 5.0, "kind": "fail", "tier": "large"},
                        {"t": 7.0, "kind": "add", "tier": "small", "count": 2},
                        {"t": 9.0, "kind": "remove", "tier": "medium"}]}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), servers=st.sampled_from([3, 5, 8, 16]), switches=switches,
       dynamics=dynamics, p_valid=st.floats(0.0, 1.0))
def test_random_actions_respect_every_constraint(seed, servers, switches, dynamics, p_valid):
    env = small_env(servers, switches, dynamics, horizon=15.0)
    events: list[dict] = []
    sim = Simulator(env, trace=events.append)
    sim.reset(seed)
    rng = np.random.default_rng(seed)
    steps = 0
    while sim.current is not None and steps < 20_000:
        valid = [s for s in range(sim.n_slots) if sim.is_valid(s)]
        if valid and rng.random() < p_valid:
            a = int(rng.choice(valid))
        else:
            a = int(rng.integers(0, sim.n_slots))
        r = sim.step(a)
        assert math.isfinite(r.reward)
        steps += 1
    assert sim.current is None, "episode did not end"
    recomputed = verify_trace(events)
    reported = sim.metrics()
    for key in ("completed_tasks", "mean_response_s", "mean_workflow_response_s", "utilization",
                "p95_response_s", "slowdown"):
        a, b = reported[key], recomputed[key]
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), key
    if sim.terminated:
        assert reported["completed_tasks"] == reported["arrived_tasks"]


def test_checker_catches_a_violation():
    """The checker is not vacuous: a trace with a start moved before its parent's finish fails."""
    events: list[dict] = []
    sim = Simulator(small_env(4, {}, {}, 10.0), trace=events.append)
    sim.reset(1)
    while sim.current is not None:
        valid = [s for s in range(sim.n_slots) if sim.is_valid(s)]
        sim.step(valid[0] if valid else 0)
    verify_trace(events)
    # Corrupt: make some child start on a busy server at its parent's start time.
    parents = {tk["task"]: tk["parents"] for e in events if e["event"] == "arrival" for tk in e["tasks"]}
    child = next(t for t, ps in parents.items() if ps)
    bad = [dict(e) for e in events]
    start_parent = next(e for e in bad if e["event"] == "start" and e["task"] == parents[child][0])
    idx = next(i for i, e in enumerate(bad) if e["event"] == "start" and e["task"] == child)
    moved = bad.pop(idx)
    moved["t"] = start_parent["t"]
    bad.insert(bad.index(start_parent) + 1, moved)
    with pytest.raises(TraceError):
        verify_trace(bad)
    # Corrupt a reported metric.
    bad = [dict(e) for e in events]
    bad[-1] = {**bad[-1], "metrics": {**bad[-1]["metrics"], "mean_response_s": 1.0}}
    with pytest.raises(TraceError, match="mean_response_s"):
        verify_trace(bad)


def test_same_seed_same_episode_bit_for_bit():
    env = small_env(8, {}, {"fail_rate_per_server_s": 0.02, "rejoin_after_s": 2.0}, 20.0)
    runs = []
    for _ in range(2):
        events: list[dict] = []
        sim = Simulator(env, trace=events.append)
        sim.reset(7)
        rng = np.random.default_rng(0)
        while sim.current is not None:
            sim.step(int(rng.integers(0, sim.n_slots)))
        runs.append(events)
    assert runs[0] == runs[1]


def test_workload_is_policy_independent():
    """Common random numbers: arrivals and DAGs depend on the seed only, not on the actions."""
    env = small_env(8, {}, {}, 20.0)
    arrivals = []
    for policy_seed in (0, 1):
        events: list[dict] = []
        sim = Simulator(env, trace=events.append)
        sim.reset(3)
        rng = np.random.default_rng(policy_seed)
        while sim.current is not None:
            sim.step(int(rng.integers(0, sim.n_slots)))
        arrivals.append([e for e in events if e["event"] == "arrival"])
    assert arrivals[0] == arrivals[1]


@pytest.mark.parametrize("max_tasks", [3, 8, 12])
def test_dag_generator_table_path_equals_plain_loop(monkeypatch, max_tasks):
    """The bitmask lookup of parents (DAGs up to 12 nodes) draws the same DAGs as the loop."""
    import envs.workload as wl

    cfg = build(EnvConfig, {"workload": {"max_tasks": max_tasks, "edge_prob": 0.4}}).workload
    fast = wl.RandomDagSource(cfg)._generate(np.random.default_rng(7))
    monkeypatch.setattr(wl, "_PARENT_TABLE_WIDTH", 0)  # force the plain loop
    slow = wl.RandomDagSource(cfg)._generate(np.random.default_rng(7))
    assert [w.tasks for w in fast] == [w.tasks for w in slow]
    for wf in fast:  # one connected DAG: every non-first node has a parent, all earlier
        assert all(t.parents and max(t.parents) < i for i, t in enumerate(wf.tasks) if i > 0)


def test_server_feature_render_matches_direct_computation():
    """The scratch-buffer render equals a per-row float32 computation of the same formulas."""
    from envs.config import FeatureConfig
    from envs.encoding import ServerFeatures

    f = FeatureConfig()
    rng = np.random.default_rng(3)
    n = 40
    sf = ServerFeatures(n, f)
    present = rng.random(n) < 0.8
    compute, memory, power = rng.uniform(0.5, 8, n), rng.uniform(4, 96, n), rng.uniform(20, 500, n)
    for i in np.flatnonzero(present):
        sf.set_server(int(i), compute[i], memory[i], power[i])
    t = 12.5
    busy_until = np.where(rng.random(n) < 0.5, t + rng.exponential(5, n), t - 1.0)
    busy_until[~present] = 0.0  # the documented invariant: idle and absent slots are not ahead of t
    for transfer, parent in ((0.0, None), (0.37, 3), (500.0, None)):
        out = sf.render(busy_until, t, transfer, parent)
        for i in range(n):
            if not present[i]:
                assert not out[i].any()
                continue
            rem = np.float32(busy_until[i] - t) * np.float32(1.0 / f.remaining_s)
            tr = 0.0 if (not transfer or i == parent) else min(transfer / f.transfer_s, f.clip)
            assert out[i, 2] == np.clip(rem, 0, f.clip)
            assert out[i, 4] == np.float32(tr)
            assert out[i, 0] == np.float32(min(compute[i] / f.server_compute, f.clip))


@pytest.mark.parametrize("hol", [True, False])
def test_ask_only_startable_changes_who_waits_not_what_happens(hol):
    """With mdp.ask_only_startable every decision offered has an action that starts the task, and
    for a policy that never waits while it can start (EFT) the episode is the same: the waits the
    policy was forced into are made by the simulator instead."""
    from policies import make_heuristic

    def run(ask_only: bool):
        cfg = build(EnvConfig, {"cluster": {"servers": 8}, "n_max": 8,
                                "workload": {"horizon_s": 40.0, "arrival_rate_16": 2.0},
                                "mdp": {"head_of_line_blocking": hol, "mask_infeasible": True,
                                        "transfer_delays_start": True,
                                        "ask_only_startable": ask_only}})
        events: list[dict] = []
        sim = Simulator(cfg, trace=events.append)
        policy = make_heuristic("eft", cfg)
        sim.reset(11)
        offered_unstartable = 0
        while sim.current is not None:
            if not any(sim.is_valid(s) for s in range(sim.n_slots)):
                offered_unstartable += 1
            sim.step(policy.act(sim.observe()))
        verify_trace(events)
        return sim, offered_unstartable, [e for e in events if e["event"] in ("start", "finish")]

    base, base_forced, base_events = run(False)
    sim, forced, events = run(True)
    assert forced == 0 and base_forced > 0  # the scenario has forced waits to remove
    assert sim.forced_waits >= base_forced and sim.invalid == 0
    assert events == base_events  # same starts and finishes, same times and servers
    m, mb = sim.metrics(), base.metrics()
    for key in ("mean_response_s", "completed_tasks", "makespan_s", "utilization"):
        assert m[key] == mb[key], key
    assert sim.decisions == base.decisions - base.invalid
