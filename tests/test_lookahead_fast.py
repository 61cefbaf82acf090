"""Issue 26: the lookahead planner's exact fast rollouts (policies.fast_rollout) against the
forked rollouts they replace: the same cost for every candidate, to the last bit, on random
states of several settings, and the same decisions over whole episodes."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.snapshot import ServerState, TaskState, WorkflowState
from envs.simulator import Simulator
from policies.heuristics import eft_pick
from policies.fast_rollout import Rollouts, ServerClasses, supported
from policies.heuristics import EarliestFinish
from policies.lookahead import DEFER, Lookahead, parse_spec
from scale_ray.bench.lookahead import measure_one
from scale_ray.config import load_env
from scale_ray.evaluation import episode_seed, run_episode

REALISTIC = "configs/env/realistic.yaml"
PAPER = "configs/env/paper.yaml"


def env(source=REALISTIC, servers=16, horizon=40.0, **extra) -> EnvConfig:
    ov = {"workload": {"horizon_s": horizon}}
    ov.update(extra)
    return load_env(source, ov, servers=servers)


class Checked(Lookahead):
    """The planner, checking at every planned decision that the fast rollouts cost exactly what
    the forked ones do, for its candidates and for a few random slots (busy, too small, any)."""

    def __init__(self, *a, rng_seed: int = 0, **k):
        super().__init__(*a, **k)
        self.rng = np.random.default_rng(rng_seed)
        self.checked = 0
        self.unsupported = 0
        self.reserved_seen = 0
        self.deferrals_checked = 0
        self._pool += [[np.random.Generator(np.random.PCG64(i)) for _ in range(3)]
                       for i in range(2)]  # forks for the two extra slots

    def _plan(self, sim, cands, defer_slot=None):
        if not supported(sim, self.config.future):
            self.unsupported += 1
            return super()._plan(sim, cands, defer_slot)
        t_end = sim.t + self.config.horizon_s
        objective = self.config.objective or sim.cfg.objective
        fast = Rollouts(sim, self._classes.get(sim), self._reserved, objective, self._views)
        assert fast.ok
        slots = [c for c in cands if c != DEFER] + [int(s) for s in self.rng.integers(0, sim.n_slots, 2)]
        got = [fast.cost(s, t_end) for s in slots]
        want = list(self._forked_costs(sim, slots, t_end, objective))
        assert got == want, (sim.t, slots, got, want)
        self.checked += len(slots)
        if defer_slot is not None:  # first_k: the task waits unreserved
            got = fast.cost(defer_slot, t_end, reserve=False)
            want = list(self._forked_costs(sim, [DEFER], t_end, objective, defer_slot))
            assert [got] == want, (sim.t, defer_slot, got, want)
            self.deferrals_checked += 1
        self.reserved_seen += bool(self._reserved)
        return super()._plan(sim, cands, defer_slot)


def drive(cfg: EnvConfig, spec: str, seed: int, decisions: int) -> Checked:
    pol = Checked(cfg, parse_spec(spec), seed=seed, rng_seed=seed)
    sim = Simulator(cfg)
    sim.reset(episode_seed(seed, 0))
    for _ in range(decisions):
        if sim.current is None:
            break
        sim.step(pol.decide(sim))
    return pol


@pytest.mark.parametrize("source,extra,spec", [
    (REALISTIC, {}, "lookahead"),
    (REALISTIC, {}, "lookahead:objective=task,candidates=5"),
    (REALISTIC, {}, "lookahead:reservations=until_start"),
    (REALISTIC, {}, "lookahead:first_k=3"),
    (REALISTIC, {"mdp": {"ask_only_startable": False}}, "lookahead"),
    (REALISTIC, {"mdp": {"head_of_line_blocking": True}}, "lookahead"),  # forced HOL waits
    (REALISTIC, {"mdp": {"mask_infeasible": False, "advance_to_next_event": True}}, "lookahead"),
    (REALISTIC, {"mdp": {"order": "hop"}}, "lookahead:horizon_s=5"),
    (REALISTIC, {"features": {"workload_scale": 3.0}}, "lookahead"),
    # runs end 0.05 s late, unseen: overdue servers show OVERDUE_S left, forks hide the truth
    (REALISTIC, {"runtime": {"overhead_s": 0.05}}, "lookahead"),
    # slow links: the parent's server (no transfer) often decides
    (REALISTIC, {"cluster": {"bandwidth_gb_s": 0.2}}, "lookahead"),
    # no server fits the largest tasks: they are set aside (blocked) for good
    (REALISTIC, {"cluster": {"tiers": [
        {"name": "small", "compute": 1.0, "memory_gb": 8.0, "idle_w": 30.0, "busy_w": 100.0,
         "ratio": 2},
        {"name": "medium", "compute": 2.0, "memory_gb": 20.0, "idle_w": 50.0, "busy_w": 200.0,
         "ratio": 5}]}}, "lookahead"),
    (PAPER, {}, "lookahead"),  # head-of-line blocking, no transfer delays, no masking
    (PAPER, {"mdp": {"head_of_line_blocking": False, "transfer_delays_start": True}},
     "lookahead:reservations=until_start"),
])
def test_fast_rollouts_cost_exactly_what_forked_rollouts_cost(source, extra, spec):
    pol = drive(env(source, **extra), spec, seed=3, decisions=250)
    assert pol.unsupported == 0 and pol.checked > 300


def test_fast_rollouts_at_the_truncation_caps():
    """Rollouts that reach the clock cap (horizon x max_time_factor) or the decision cap."""
    cfg = env(horizon=30.0, mdp={"max_time_factor": 1.0})
    sim = Simulator(cfg)
    sim.reset(episode_seed(5, 0))
    while sim.current is not None and sim.t < 27.0:  # rollouts of 20 s pass the 30 s cap
        sim.step(eft_pick(sim))
    pol = Checked(cfg, parse_spec("lookahead"), seed=5)
    while sim.current is not None:
        sim.step(pol.decide(sim))
    assert pol.checked > 20
    cfg = env(mdp={"max_decisions": 150})  # the episode has ~300
    pol = drive(cfg, "lookahead", seed=6, decisions=150)
    assert pol.checked > 50


def test_unsupported_settings_fall_back_to_forks():
    dyn = {"fail_rate_per_server_s": 0.01, "rejoin_after_s": 1.0}
    pol = drive(env(PAPER, dynamics=dyn, n_max=40), "lookahead", seed=1, decisions=80)
    assert pol.unsupported > 0 and pol.checked == 0
    pol = drive(env(mdp={"order": "srpt"}), "lookahead", seed=1, decisions=80)
    assert pol.unsupported > 0 and pol.checked == 0
    pol = drive(env(), "lookahead:future=oracle", seed=1, decisions=40)
    assert pol.unsupported > 0 and pol.checked == 0
    # run-time noise: the runs take other than what deciders (and the fast rollouts) see
    pol = drive(env(runtime={"noise_sigma": 0.5}), "lookahead", seed=1, decisions=40)
    assert pol.unsupported > 0 and pol.checked == 0


@pytest.mark.parametrize("spec", ["lookahead", "lookahead:reservations=until_start",
                                  "lookahead:snapshot=true", "lookahead:first_k=2"])
def test_fast_and_forked_planners_decide_the_same(spec):
    cfg = env(horizon=60.0)
    a, b = Lookahead(cfg, parse_spec(spec), seed=0), Lookahead(cfg, parse_spec(spec), seed=0)
    b.fast = False
    if b._inner is None and b.config.snapshot:
        b._inner = Lookahead(b.env, parse_spec("lookahead"), b._seed)
        b._inner.fast = False
    sim = Simulator(cfg)
    sim.reset(episode_seed(0, 0))
    n = 0
    while sim.current is not None:
        x = a.decide(sim)
        assert b.decide(sim) == x, (n, sim.t)
        sim.step(x)
        n += 1
    assert a.stats["planned"] > 250 and a.stats == {**b.stats, "plan_s": a.stats["plan_s"]}
    assert run_episode(cfg, spec, 0)["mean_task_response_s"] == sim.metrics()["mean_task_response_s"]


@pytest.mark.parametrize("source,extra", [
    (REALISTIC, {}), (PAPER, {}),
    (PAPER, {"dynamics": {"fail_rate_per_server_s": 0.01, "rejoin_after_s": 1.0,
                          "join_rate_s": 0.1, "leave_rate_s": 0.1}, "n_max": 60}),
])
def test_server_classes_hold_what_eft_tells_apart(source, extra):
    """Each class: accepting slots of the same speed and memory; EFT's pick is the lowest idle
    slot of some class or the task's parent slot."""
    cfg = env(source, servers=48, **extra)
    eft = EarliestFinish()
    cl = ServerClasses()
    sim = Simulator(cfg)
    sim.reset(episode_seed(2, 0))
    rng = np.random.default_rng(0)
    n = 0
    t = sim.table
    while sim.current is not None and n < 1500:
        c = cl.get(sim)
        t = sim.table
        busy, acc = t.busy, t.accept_l
        assert sorted(s for s in range(sim.n_slots) if acc[s]) == sorted(
            s for s in range(sim.n_slots) if c.cls[s] >= 0)
        for s in range(sim.n_slots):
            k = c.cls[s]
            if k >= 0:
                assert (t.cpu_speed[s], t.memory_l[s]) == (c.speed[k], c.mraw[k])
                assert c.mask[k] >> s & 1
        idle = [min((s for s in range(sim.n_slots) if c.cls[s] == k and not busy[s]),
                    default=None) for k in range(len(c.mask))]
        want = eft.decide(sim)
        if not busy[want]:
            assert want in idle or want == sim.parent
        sim.step(want if rng.random() < 0.9 else int(rng.integers(0, sim.n_slots)))
        n += 1
    assert n > 300


def test_fast_rollouts_when_every_fitting_server_is_reserved():
    """The first 100 s of the episode of test_lookahead's regression (every server a task fits
    reserved for other tasks), with many reservations, checked candidate by candidate."""
    cfg = load_env(REALISTIC, servers=16)
    pol = Checked(cfg, parse_spec("lookahead"), seed=6)
    sim = Simulator(cfg)
    sim.reset(np.random.SeedSequence([1000, 6]))
    pol.reset(6)
    while sim.current is not None and sim.t < 100.0:
        sim.step(pol.decide(sim))
    assert pol.checked > 2000 and pol.reserved_seen > 30


def test_fast_rollouts_when_a_reserved_idle_server_is_all_that_fits():
    """In the rollouts task W fits only slot 2, which is idle but reserved for the waiting task
    Y: EFT, with every fitting server reserved, picks among all of them and W takes slot 2."""
    cfg = load_env(REALISTIC, servers=3)
    servers = [ServerState(1.0, 8.0), ServerState(2.0, 32.0), ServerState(4.0, 80.0)]
    workflows = [WorkflowState((TaskState(8.0, 40.0),), age_s=3.0),  # W (oldest: first)
                 WorkflowState((TaskState(16.0, 40.0),), age_s=2.0),  # Y, waiting for slot 2
                 WorkflowState((TaskState(2.0, 4.0),), age_s=1.0)]   # the task decided
    pol = Checked(cfg, parse_spec("lookahead"), seed=0)
    assert pol.plan(servers, workflows, (2, 0), waiting={(1, 0): 2}) in (0, 1)
    assert pol.checked == 4


def test_bench_times_fast_and_forked_planners_on_the_same_decisions():
    r = measure_one(load_env(REALISTIC, servers=16), "lookahead", 40, 20.0, 0, forked=True)
    assert r["decisions"] == 40 and r["planned"] > 0
    assert r["mean_ms"] > 0 and r["forked_mean_ms"] > 0
