"""Heuristic placements on hand-built observations (built with the shared encoder)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import EnvConfig, FeatureConfig, build
from envs.encoding import ServerView, TaskView, encode
from policies import HEURISTICS, get_policy, make_heuristic

F = FeatureConfig()


def obs_for(task: TaskView, servers: list[ServerView], mask_infeasible=False):
    return encode(task, servers, F, mask_infeasible=mask_infeasible)


SMALL = dict(compute=1.0, memory_gb=8.0)
MEDIUM = dict(compute=2.0, memory_gb=32.0)
LARGE = dict(compute=4.0, memory_gb=80.0)


def cluster(large_remaining=0.0):
    return [ServerView(**SMALL), ServerView(**MEDIUM, remaining_s=2.0), ServerView(**MEDIUM),
            ServerView(**LARGE, remaining_s=large_remaining)]


TASK = TaskView(compute_gflop=4.0, memory_gb=16.0)


@pytest.mark.parametrize("name,expected", [
    ("fastest-idle", {3}), ("eft", {3}), ("eft-wait", {3}), ("heft", {3}),
    ("random", {2, 3}), ("least-loaded", {2, 3}), ("round-robin", {2, 3}),
])
def test_idle_choice(name, expected):
    pol = make_heuristic(name, seed=0)
    picks = {pol.act(obs_for(TASK, cluster())) for _ in range(30)}
    assert picks <= expected and (len(expected) == 1 or picks == expected)


def test_eft_never_waits_but_eft_wait_does():
    obs = obs_for(TASK, cluster(large_remaining=0.5))
    assert make_heuristic("eft").act(obs) == 2        # idle medium: finishes at 2.0
    assert make_heuristic("eft-wait").act(obs) == 3   # busy large: 0.5 + 1.0 = 1.5


def test_no_idle_fit_waits_for_soonest_free():
    servers = [ServerView(**SMALL), ServerView(**MEDIUM, remaining_s=2.0),
               ServerView(**MEDIUM, remaining_s=0.7), ServerView(**LARGE, remaining_s=1.0)]
    for name in ("eft", "fastest-idle", "round-robin", "least-loaded", "heft"):
        assert make_heuristic(name).act(obs_for(TASK, servers)) == 2, name


@pytest.mark.parametrize("output_gb,expected", [(2.0, 3), (20.0, 2)])
def test_eft_counts_transfer_when_it_delays_start(output_gb, expected):
    env = build(EnvConfig, {"mdp": {"transfer_delays_start": True}})
    task = TaskView(4.0, 16.0, parent_server=2, parent_output_gb=output_gb)
    # large: 1.0 s + (d/10 + 0.01) transfer; medium (holds the parent): 2.0 s
    assert make_heuristic("eft", env).act(obs_for(task, cluster())) == expected
    # without the switch the transfer does not delay the start: the large server wins
    assert make_heuristic("eft").act(obs_for(task, cluster())) == 3


def test_round_robin_cycles_over_idle_fitting_servers():
    pol = make_heuristic("round-robin")
    servers = [ServerView(**MEDIUM) for _ in range(4)]
    picks = [pol.act(obs_for(TASK, servers)) for _ in range(6)]
    assert picks == [0, 1, 2, 3, 0, 1]


def test_heft_orders_by_upward_rank():
    assert make_heuristic("heft").order == "upward_rank"
    assert all(make_heuristic(n).order is None for n in HEURISTICS if n != "heft")


def test_masked_servers_are_never_chosen():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        servers = [ServerView(compute=float(rng.choice([1, 2, 4])), memory_gb=float(rng.choice([8, 32, 80])),
                          remaining_s=float(rng.choice([0, 0, 1.5])), accepting=bool(rng.random() < 0.8))
                   for _ in range(n)]
        if not any(s.accepting and s.memory_gb >= 16 for s in servers):
            servers.append(ServerView(**LARGE))
        obs = obs_for(TASK, servers, mask_infeasible=True)
        for name in HEURISTICS:
            a = make_heuristic(name, seed=1).act(obs)
            assert obs["action_mask"][a] == 1.0, (name, a)


def test_get_policy_rejects_unknown_names_clearly():
    with pytest.raises(ValueError, match="not a heuristic"):
        get_policy("fastest")
