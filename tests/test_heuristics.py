"""Heuristic placements on hand-built decisions (envs.encoding.Described: servers of one slot
from plain descriptions, the same table the simulator keeps)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import EnvConfig, FeatureConfig, build
from envs.encoding import Described, ServerView, TaskView
from policies import HEURISTICS, get_policy, make_heuristic

F = FeatureConfig()


def state_for(task: TaskView, servers: list[ServerView], transfer_delays=False):
    return Described(task, servers, F, transfer_delays=transfer_delays)


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
    picks = {pol.decide(state_for(TASK, cluster())) for _ in range(30)}
    assert picks <= expected and (len(expected) == 1 or picks == expected)


def test_eft_never_waits_but_eft_wait_does():
    state = state_for(TASK, cluster(large_remaining=0.5))
    assert make_heuristic("eft").decide(state) == 2        # idle medium: finishes at 2.0
    assert make_heuristic("eft-wait").decide(state) == 3   # busy large: 0.5 + 1.0 = 1.5


def test_no_idle_fit_waits_for_soonest_free():
    servers = [ServerView(**SMALL), ServerView(**MEDIUM, remaining_s=2.0),
               ServerView(**MEDIUM, remaining_s=0.7), ServerView(**LARGE, remaining_s=1.0)]
    for name in ("eft", "fastest-idle", "round-robin", "least-loaded", "heft"):
        assert make_heuristic(name).decide(state_for(TASK, servers)) == 2, name


@pytest.mark.parametrize("output_gb,expected", [(2.0, 3), (20.0, 2)])
def test_eft_counts_transfer_when_it_delays_start(output_gb, expected):
    env = build(EnvConfig, {"mdp": {"transfer_delays_start": True}})
    task = TaskView(4.0, 16.0, parent_server=2, parent_output_gb=output_gb)
    # large: 1.0 s + (d/10 + 0.01) transfer; medium (holds the parent): 2.0 s
    assert make_heuristic("eft", env).decide(state_for(task, cluster(), True)) == expected
    # without the switch the transfer does not delay the start: the large server wins
    assert make_heuristic("eft").decide(state_for(task, cluster())) == 3


def test_round_robin_cycles_over_idle_fitting_servers():
    pol = make_heuristic("round-robin")
    servers = [ServerView(**MEDIUM) for _ in range(4)]
    picks = [pol.decide(state_for(TASK, servers)) for _ in range(6)]
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
        state = state_for(TASK, servers)
        mask = state.observe()["action_mask"]  # accepting and could ever hold the task
        for name in HEURISTICS:
            a = make_heuristic(name, seed=1).decide(state)
            assert mask[a] == 1.0, (name, a)


def test_get_policy_rejects_unknown_names_clearly():
    with pytest.raises(ValueError, match="not a heuristic"):
        get_policy("fastest")


def test_eft_never_picks_a_node_whose_run_ends_a_hair_after_now():
    """A run due 1e-13 s after now is still running: the node holds its slot. EFT once read the
    observation, where such a remaining time decoded as 0 (idle), picked that node and made the
    task wait a step (tests/data/golden_eval.json's realistic and backlog cases were recorded
    then); on the table it is busy, and EFT takes the idle node."""
    servers = [ServerView(**LARGE, remaining_s=1e-13), ServerView(**MEDIUM)]
    state = state_for(TASK, servers)
    assert not state.table.fits_now(0, state.task.demands)
    for name in ("eft", "heft", "fastest-idle"):
        assert make_heuristic(name).decide(state) == 1, name
