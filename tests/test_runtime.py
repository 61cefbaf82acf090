"""Run times as they are (issue 31): noise, kinds, hints, the online estimator, and what deciders
may not see (envs/runtime.py, envs/estimator.py, envs/run_model.py, envs/fork.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.config import ConfigError, build
from envs.estimator import RuntimeEstimator
from envs.runtime import RuntimeConfig, compute_bucket, factors, kind_of_name
from envs.events import FINISH
from envs.simulator import RUNNING, Simulator
from envs.snapshot import build as build_snapshot
from envs.snapshot import describe
from policies import get_policy
from scale_ray.config import load_env


def _env(**runtime):
    return load_env("configs/env/realistic.yaml",
                    [f"runtime.{k}={v}" for k, v in runtime.items()] + ["cluster.servers=16"])


def _run(sim, policy, steps=None):
    n = 0
    while sim.current is not None and (steps is None or n < steps):
        sim.step(policy.decide(sim))
        n += 1


def test_factors_have_mean_one_and_no_noise_is_exact():
    rng = np.random.default_rng(0)
    assert (factors(rng, RuntimeConfig(), 5) == 1).all()
    for cfg in (RuntimeConfig(noise_sigma=0.5), RuntimeConfig(noise_sigma=1.0),
                RuntimeConfig(noise_sigma=0.5, tail="pareto", tail_prob=0.05, tail_alpha=2.5)):
        f = factors(rng, cfg, 400_000)
        assert f.mean() == pytest.approx(1.0, rel=0.02) and (f > 0).all()
    heavy = factors(rng, RuntimeConfig(noise_sigma=0.3, tail="pareto", tail_prob=0.05), 200_000)
    light = factors(rng, RuntimeConfig(noise_sigma=0.3), 200_000)
    assert np.percentile(heavy, 99.9) > 2 * np.percentile(light, 99.9)
    with pytest.raises(ConfigError, match="runtime.noise_sigma"):
        build(type(_env()), {"runtime": {"noise_sigma": -1}})


def test_kinds_from_names_and_compute_buckets():
    assert kind_of_name("mProject_00012") == "mProject"
    assert kind_of_name("search-3") == "search" and kind_of_name("llm") == "llm"
    assert kind_of_name("ID00001") == ""
    assert compute_bucket(1.0, 1.0, 12.0, 12) == "k0" and compute_bucket(12.0, 1.0, 12.0, 12) == "k11"
    assert compute_bucket(99.0, 1.0, 12.0, 4) == "k3"


def test_estimator_converges_and_is_robust():
    rng = np.random.default_rng(1)
    est = RuntimeEstimator()
    for x in rng.lognormal(math.log(3.0), 0.5, 300):  # the hint says 1 s; runs take ~3 s
        est.observe("llm", "small", float(x), 1.0)
    assert est.median("llm", "small", 1.0) == pytest.approx(3.0, rel=0.08)
    assert est.quantile("llm", "small", 1.0, 0.9) == pytest.approx(3.0 * math.exp(1.2816 * 0.5),
                                                                   rel=0.12)
    before = est.median("llm", "small", 1.0)
    est.observe("llm", "small", 1e6, 1.0)  # one wild straggler
    assert est.median("llm", "small", 1.0) == pytest.approx(before, rel=0.02)
    # an unseen tier starts from the kind (pooled); an unseen kind from the hint
    assert est.median("llm", "large", 1.0) == pytest.approx(before, rel=0.05)
    assert est.median("other", "small", 2.0) == 2.0
    assert est.summary()["kinds"]["llm"]["n"] == 301


def test_noisy_runs_take_their_actual_time_and_deciders_see_estimates():
    sim = Simulator(_env(noise_sigma=1.0))
    events = []
    sim.trace = events.append
    sim.reset(3)
    eft = get_policy("eft", sim.cfg)
    _run(sim, eft, 400)
    starts = {e["task"]: e for e in events if e["event"] == "start"}
    done = [e for e in events if e["event"] == "finish" and e["task"] in starts]
    assert done
    for e in done:
        s = starts[e["task"]]
        assert e["t"] - s["t"] == pytest.approx(s["run_s"] + s.get("transfer_s", 0.0), abs=1e-9)
    assert any(abs(starts[e["task"]]["run_s"] - starts[e["task"]]["estimate_s"]) > 1e-3
               for e in done)
    # busy servers never look idle (an overdue one shows time left), idle ones never busy
    while sim.current is not None:
        obs = sim.observe()
        rem = obs["servers"][:, 2]
        busy = sim.table.busy.copy()
        present = np.array(sim.table.present_l)
        assert (rem[busy] > 0).all() and (rem[~busy & present] == 0).all()
        sim.step(eft.decide(sim))
        if sim.decisions > 1500:
            break


def test_every_policy_sees_the_same_noise():
    got = []
    for name in ("eft", "random"):
        sim = Simulator(_env(noise_sigma=0.5))
        sim.reset(7)
        _run(sim, get_policy(name, sim.cfg, seed=0), 300)
        got.append([(t.id, t.factor) for t in sim.tasks[:50]])
    assert got[0] == got[1]


def test_hints_decide_what_deciders_see():
    for hints, check in [("exact", lambda t: t.compute == t.nominal),
                         ("none", lambda t: t.compute == 4.0),
                         ("kind", lambda t: t.compute > 0 and t.kind.startswith("k"))]:
        sim = Simulator(_env(noise_sigma=0.5, hints=hints))
        sim.reset(1)
        _run(sim, get_policy("eft", sim.cfg), 100)
        assert all(check(t) for t in sim.tasks)
    sim = Simulator(_env(noise_sigma=0.5, hints="none", estimator="online"))
    sim.reset(1)
    _run(sim, get_policy("eft", sim.cfg), 2000)
    est = sim._rt.estimator
    assert est.observations > 100 and len({round(t.compute, 6) for t in sim.tasks[-100:]}) > 1


def test_fork_and_snapshot_cannot_see_a_true_finish():
    sim = Simulator(_env(noise_sigma=1.0))
    sim.reset(5)
    eft = get_policy("eft", sim.cfg)
    found = None
    while sim.current is not None and found is None:
        sim.step(eft.decide(sim))
        for t_true, kind, _, slot, b in sim.events:
            if kind == FINISH and b[1].state == RUNNING and b[1].token == b[0] \
                    and abs(t_true - float(sim.busy_until[slot])) > 0.5:
                found = (slot, t_true, float(sim.busy_until[slot]))
                break
    assert found is not None, "no run whose estimate is off by 0.5 s"
    slot, t_true, t_est = found
    f = sim.fork()
    task = next(iter(f.table.running[slot]))
    f_ends = [e[0] for e in f.events if e[1] == FINISH and e[4][1] is task]
    assert f_ends == [pytest.approx(max(t_est, sim.t))] and f_ends[0] != pytest.approx(t_true)
    # the fork's own runs take their estimates, and the original is untouched
    assert not f._rt.truth and sim._rt.truth
    # a snapshot shows the estimated remaining time, and its simulator runs exactly that
    servers, _, _ = describe(sim)
    assert servers[slot].remaining_s == pytest.approx(t_est - sim.t)
    _, workflows, _ = describe(sim)
    snap = build_snapshot(sim.cfg, servers, workflows)
    assert snap.sim._rt is None


def test_run_overhead_ends_every_run_late_and_deciders_are_not_told():
    """``runtime.overhead_s`` (what the live runtime adds per run; bench live's twin): every run
    ends that much after its run time; a busy server past its expected end shows OVERDUE_S left
    (as live shows it), never an end in the past; a fork's running tasks end when expected and
    its own runs take no overhead."""
    c = 0.25
    sim = Simulator(_env(overhead_s=c))
    assert sim._rt is None  # nothing else about run times changes
    sim.reset(3)
    eft = get_policy("eft", sim.cfg)
    overdue = forked = 0
    while sim.current is not None and sim.decisions < 600:
        obs = sim.observe()
        busy = sim.table.busy.copy()
        assert (obs["servers"][busy, 2] > 0).all()
        assert (sim.busy_until[busy] > sim.t).all()
        overdue += int((sim.busy_until[busy] <= sim.t + 2e-3).sum())
        if forked < 3 and busy.any():
            f = sim.fork()
            assert f._overhead == 0.0 and sim._overhead == c
            for t_end, kind, _, slot, b in f.events:
                if kind == FINISH and b[1].state == RUNNING:
                    assert t_end == pytest.approx(max(float(sim.busy_until[slot]), sim.t))
            forked += 1
        sim.step(eft.decide(sim))
    assert overdue > 0, "no decision saw a server past its expected end"
    done = [t for t in sim.tasks if t.finish is not None and t.finish > 0 and t.slot is not None]
    assert len(done) > 100
    for t in done:
        run = t.compute / sim.table.cpu_speed[t.slot]
        assert t.finish - t.start >= run + c - 1e-9
        assert t.finish - t.start <= run + c + 10.0  # + its transfer, at most
    exact = [t for t in done if t.first_parent is None]
    assert exact and all(t.finish - t.start == pytest.approx(t.compute / sim.table.cpu_speed[t.slot] + c)
                         for t in exact)


def test_run_overhead_is_checked():
    with pytest.raises(ConfigError, match="overhead_s"):
        _env(overhead_s=-1)
