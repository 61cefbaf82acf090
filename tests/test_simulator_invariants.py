"""Invariants over many seeds, switches and random action sequences, checked by replaying the
trace with the independent checker (envs.trace.verify_trace)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.config import EnvConfig, build
from envs.simulator import DONE, Simulator
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
    "order": st.sampled_from(["hop", "upward_rank", "fifo", "edf", "srpt", "las"]),
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
        valid = [s for s in range(sim.n_slots) if sim.table.fits_now(s, sim.current.demands)]
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
    for key in ("completed_tasks", "mean_task_response_s", "censored_task_response_s",
                "mean_workflow_response_s", "utilization", "p95_task_response_s", "slowdown"):
        a, b = reported[key], recomputed[key]
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), key
    if sim.terminated:
        assert reported["completed_tasks"] == reported["arrived_tasks"]
        a, b = reported["censored_task_response_s"], reported["mean_task_response_s"]
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)


def test_a_truncated_episode_counts_its_unfinished_tasks_in_the_censored_mean():
    """A policy that leaves tasks unfinished must not look faster: the censored mean counts each
    unfinished task at its age when the episode was cut (checked against the trace replay)."""
    env = build(EnvConfig, {"cluster": {"servers": 4}, "workload": {"horizon_s": 30.0},
                            "mdp": {"max_decisions": 40}, "n_max": 12})
    events: list[dict] = []
    sim = Simulator(env, trace=events.append)
    sim.reset(3)
    while sim.current is not None:
        valid = [s for s in range(sim.n_slots) if sim.table.fits_now(s, sim.current.demands)]
        sim.step(valid[0] if valid else 0)
    m = sim.metrics()
    assert sim.truncated and 0 < m["completed_tasks"] < m["arrived_tasks"]
    # by hand: done tasks at their response, the others at their age when the episode was cut
    ages = [(tk.finish if tk.state == DONE else sim.t) - tk.wf.arrival for tk in sim.tasks]
    assert m["censored_task_response_s"] == pytest.approx(np.mean(ages))
    assert verify_trace(events)["censored_task_response_s"] == pytest.approx(m["censored_task_response_s"])
    assert m["censored_task_response_s"] != pytest.approx(m["mean_task_response_s"])
