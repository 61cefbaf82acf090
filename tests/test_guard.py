"""policies.guard: the rules on hand-built decisions, the simulator (livelock -> completes),
the switch that reproduces the raw policy, traces, and /v1/place and /v1/schedule in process."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import ConfigError, FeatureConfig
from envs.encoding import Described, ServerView, TaskView
from envs.simulator import Simulator
from envs.trace import read_trace, verify_trace
from policies.base import ObservationPolicy
from policies.guard import Guard, GuardConfig, guard_summary, load_guard_config, make_guard
from policies.heuristics import make_heuristic
from scale_ray.config import load_env
from scale_ray.evaluation import guarded_action, run_episode

F = FeatureConfig()
# slot 0: small idle; 1: large busy 0.5 s; 2: medium idle; 3: large busy 30 s; 4: tiny (2 GB) idle
SERVERS = [ServerView(1.0, 8), ServerView(4.0, 80, remaining_s=0.5), ServerView(2.0, 32),
           ServerView(4.0, 80, remaining_s=30.0), ServerView(1.0, 2)]


def state_for(compute=8.0, memory=4.0, servers=SERVERS, waits=0):
    return Described(TaskView(compute, memory), servers, F, mask_infeasible=False, waits=waits)


class Fixed(ObservationPolicy):
    """A 'learned' policy (not a heuristic) that always answers one slot."""
    name = "fixed"

    def __init__(self, slot: int):
        self.slot = slot

    def scores(self, obs):
        s = np.full(len(obs["action_mask"]), -1.0)
        s[self.slot % len(s)] = 1.0
        return s


def test_rules_on_hand_built_decisions():
    g = Guard(GuardConfig(max_waits=3))
    o = state_for()
    # EFT's choice: the fastest idle fitting server, the medium one (slot 2): 8 / 2 = 4 s
    assert make_heuristic("eft").decide(o) == 2
    assert g.check(o, 2) == (2, None)                    # idle and fits: kept
    assert g.check(o, 0) == (0, None)                    # slower idle: kept (not a wait)
    assert g.check(o, 1) == (1, None)                    # busy, 0.5 + 2 s < 4 s: a justified wait
    assert g.check(o, 3) == (2, "slower_wait")           # busy, 30 + 2 s > 4 s
    assert g.check(state_for(waits=3), 1) == (2, "wait_budget")  # the task waited 3 times
    assert g.check(state_for(memory=6.0), 4) == (2, "infeasible")  # 2 GB server, 6 GB task
    assert g.check(o, 99) == (2, "infeasible")           # no such slot
    assert g.counts == {"infeasible": 2, "wait_budget": 1, "slower_wait": 1}
    assert g.checked == 7 and g.overrides == 4
    # nothing idle fits: every answer is a wait, a fitting busy one is kept
    busy = [ServerView(4.0, 80, remaining_s=5.0), ServerView(4.0, 80, remaining_s=1.0),
            ServerView(1.0, 8)]
    assert g.check(state_for(memory=20.0, servers=busy, waits=100), 0) == (0, None)
    # EFT waits for the server that frees first
    assert g.check(state_for(memory=20.0, servers=busy), 2) == (1, "infeasible")


def test_config_is_validated_and_heuristics_are_not_guarded():
    with pytest.raises(ConfigError, match="guard.max_waits.*out of range"):
        load_guard_config({"max_waits": -1})
    with pytest.raises(ConfigError, match="unknown key guard.patience"):
        load_guard_config({"patience": 3})
    assert make_guard(make_heuristic("eft-wait"), GuardConfig()) is None
    assert make_guard(Fixed(0), GuardConfig(enabled=False)) is None
    assert isinstance(make_guard(Fixed(0), None), Guard)  # on by default
    assert guard_summary(None) == {"guard_overrides": 0, "guard_infeasible": 0,
                                   "guard_wait_budget": 0, "guard_slower_wait": 0}


def _run(env, policy, guard):
    sim = Simulator(env)
    sim.reset(3)
    while sim.current is not None:
        a = (policy.act(sim.observe()) if isinstance(policy, ObservationPolicy)
             else policy.decide(sim))
        sim.step(guarded_action(guard, sim, a))
    return sim.metrics()


def test_guard_turns_a_livelock_into_a_complete_episode():
    """A policy that always answers the first slot (a small 8 GB server) livelocks on the first
    task that does not fit it (paper setting, unmasked); guarded, every task finishes, and the
    guarded episode equals EFT's where the policy never acts differently."""
    env = load_env(None, ["workload.horizon_s=30", "workload.memory_gb.mean=12",
                          "mdp.max_time_factor=3"], servers=8)
    raw = _run(env, Fixed(0), None)
    assert raw["truncated"] and raw["completed_tasks"] < raw["arrived_tasks"]
    g = make_guard(Fixed(0), GuardConfig(max_waits=2))
    safe = _run(env, Fixed(0), g)
    assert not safe["truncated"] and safe["completed_tasks"] == safe["arrived_tasks"]
    assert g.counts["infeasible"] > 0 and g.counts["wait_budget"] + g.counts["slower_wait"] > 0
    # waits while a fitting server is idle are bounded by max_waits per task
    eft = _run(env, make_heuristic("eft", env), None)
    assert safe["mean_task_response_s"] < 3 * eft["mean_task_response_s"]


def test_switch_off_reproduces_the_raw_policy_and_traces_record_overrides(tmp_path):
    from policies.artifact import save_untrained

    env = load_env(None, ["workload.horizon_s=20"], servers=8)
    art = str(save_untrained(tmp_path / "untrained", seed=1))
    off = run_episode(env, art, 0, 5, guard=GuardConfig(enabled=False))
    # the raw loop, written out: the same numbers as --guard off
    from policies import get_policy
    policy = get_policy(art, env)
    sim = Simulator(env)
    sim.reset(np.random.SeedSequence([5, 0]))
    while sim.current is not None:
        sim.step(policy.act(sim.observe()))  # act: the network alone (decide is guarded)
    raw = sim.metrics()
    for k in ("mean_task_response_s", "censored_task_response_s", "completed_tasks", "invalid_rate"):
        assert off[k] == raw[k]
    assert off["guard_overrides"] == 0
    on = run_episode(env, art, 0, 5, trace_path=tmp_path / "t.jsonl")  # default: guarded
    assert on["guard_overrides"] > 0  # an untrained network waits and picks misfits
    assert on["guard_override_rate"] == pytest.approx(on["guard_overrides"] / on["decisions"])
    events = read_trace(tmp_path / "t.jsonl")
    guard_events = [e for e in events if e["event"] == "guard"]
    assert len(guard_events) == on["guard_overrides"]
    assert {e["reason"] for e in guard_events} <= {"infeasible", "wait_budget", "slower_wait"}
    verify_trace(events)  # guard events change nothing the checker replays


def test_placement_service_guards_place_and_schedule():
    from serve_apps.decisions import load, place
    from serve_apps.schedule import schedule
    from serve_apps.schemas import PlaceRequest, ScheduleRequest

    env = load_env(None)
    lp = load("eft", env)
    assert lp.guard is None and lp.guard_info() == {"enabled": False}
    g = make_guard(Fixed(3), GuardConfig(max_waits=1))
    stubborn = type(lp)(lp.spec, Fixed(3), lp.encoder, lp.info, False, True, g)
    servers = [{"id": f"s{i}", "compute": s.compute, "memory_gb": s.memory_gb,
                "remaining_s": s.remaining_s} for i, s in enumerate(SERVERS)]
    req = {"task": {"compute_gflop": 8.0, "memory_gb": 4.0}, "servers": servers}
    ans = place(PlaceRequest.model_validate(req), stubborn, 100)
    assert ans["server"] == "s2" and ans["valid"]
    assert ans["guard"] == {"reason": "slower_wait", "proposed": "s3"}
    # a justified wait is kept until the task's waits reach max_waits
    just = type(lp)(lp.spec, Fixed(1), lp.encoder, lp.info, False, True,
                    make_guard(Fixed(1), GuardConfig(max_waits=1)))
    assert place(PlaceRequest.model_validate(req), just, 100)["guard"] is None
    req["task"]["waits"] = 1
    ans = place(PlaceRequest.model_validate(req), just, 100)
    assert ans["server"] == "s2" and ans["guard"]["reason"] == "wait_budget"
    sreq = {"workflows": [{"id": "w", "tasks": [{"id": "a", "compute_gflop": 8.0, "memory_gb": 4.0},
                                                {"id": "b", "compute_gflop": 1.0, "memory_gb": 1.0,
                                                 "waits": 1}]}],
            "servers": servers}
    out = schedule(ScheduleRequest.model_validate(sreq), stubborn, 100, 100)
    assert [(a["task"], a["server"]) for a in out["assignments"]] == [("a", "s2"), ("b", "s4")]
    assert out["assignments"][0]["guard"] == {"reason": "slower_wait", "proposed": "s3"}
    info = stubborn.guard_info()
    assert info["enabled"] and info["guard_overrides"] == 3 and info["checked"] == 3
