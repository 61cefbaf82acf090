"""Issue 17: the simulator fork (envs.fork), the fast EFT and the lookahead planner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from envs.config import ConfigError, EnvConfig, build
from envs.simulator import DONE, Simulator
from envs.trace import read_trace, verify_trace
from policies import get_policy, is_planner
from policies.guard import is_learned, make_guard
from policies.heuristics import EarliestFinish, eft_pick, finish_key
from policies.lookahead import Lookahead, LookaheadConfig, load_lookahead_config, parse_spec
from scale_ray.config import load_env
from scale_ray.evaluation import episode_seed, run_episode, run_episodes_lockstep

REALISTIC = "configs/env/realistic.yaml"
DYNAMIC = {"fail_rate_per_server_s": 0.01, "rejoin_after_s": 1.0, "join_rate_s": 0.1,
           "leave_rate_s": 0.1}


def env(source=REALISTIC, servers=16, horizon=40.0, **extra) -> EnvConfig:
    ov = {"workload": {"horizon_s": horizon}}
    ov.update(extra)
    return load_env(source, ov, servers=servers)


def state(sim: Simulator) -> dict:
    """Everything observable of a simulator's state (tasks by value)."""
    tasks = [(t.state, t.slot, t.sid, t.start, t.finish, t.token, t.pending, t.waits,
              None if t.first_parent is None else t.first_parent.id, t.wf.done)
             for t in sim.tasks]
    return {"t": sim.t, "tasks": tasks, "current": None if sim.current is None else sim.current.id,
            "busy": sim.table.busy.tolist(), "busy_until": sim.busy_until.tolist(),
            "events": [(e[0], e[1], e[2]) for e in sim.events],
            "ready": [(k, i) for k, i, _ in sim.core.queue.heap],
            "deferred": [i for _, i, _ in sim.core.queue.deferred],
            "blocked": [i for _, i, _ in sim.core.queue.blocked],
            "rng": [g.bit_generator.state["state"] for g in
                    (sim.arrivals.rng_arrivals, sim.arrivals.rng_workload, sim.cluster.rng_dynamics)],
            "metrics": sim.metrics(), "obs": {k: v.tolist() for k, v in sim.observe().items()},
            "slot_of": dict(sim.cluster.slot_of)}


def actions(sim: Simulator, rng: np.random.Generator, eft: EarliestFinish):
    """EFT most of the time, a random slot (often a wait) otherwise: varied states."""
    return eft.decide(sim) if rng.random() < 0.8 else int(rng.integers(0, sim.n_slots))


def run_to_end(sim: Simulator, seed: int, eft: EarliestFinish, fork_every: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    k = 0
    while sim.current is not None:
        if fork_every and k % fork_every == 0:
            f = sim.fork()
            frng = np.random.default_rng(k)
            for _ in range(int(frng.integers(1, 200))):  # step the fork any number of times
                if f.current is None:
                    break
                f.step(actions(f, frng, eft))
        sim.step(actions(sim, rng, eft))
        k += 1
    return sim.metrics()


@pytest.mark.parametrize("cfg", [
    env(), env("configs/env/paper.yaml", dynamics=DYNAMIC, n_max=40),
    env("configs/env/paper.yaml", mdp={"head_of_line_blocking": False}),
])
def test_fork_leaves_the_original_and_its_future_alone(cfg):
    eft = EarliestFinish()
    a = Simulator(cfg)
    a.reset(episode_seed(0, 1))
    plain = run_to_end(a, 7, eft)
    b = Simulator(cfg)
    b.reset(episode_seed(0, 1))
    for _ in range(100):  # the state right before a fork equals the one right after it
        b.step(actions(b, np.random.default_rng(1), eft))
    assert b.current is not None
    before = state(b)
    f = b.fork()
    while f.current is not None:
        f.step(eft.decide(f))
    assert state(b) == before
    c = Simulator(cfg)
    c.reset(episode_seed(0, 1))
    assert run_to_end(c, 7, eft, fork_every=23) == plain


@pytest.mark.parametrize("cfg", [env(), env("configs/env/paper.yaml", dynamics=DYNAMIC, n_max=40)])
def test_fork_then_run_to_end_equals_the_original(cfg):
    eft = EarliestFinish()
    sim = Simulator(cfg)
    sim.reset(episode_seed(0, 2))
    rng = np.random.default_rng(3)
    for _ in range(120):
        sim.step(actions(sim, rng, eft))
    assert sim.current is not None
    f = sim.fork([np.random.Generator(np.random.PCG64(9)) for _ in range(3)])
    assert f.trace is None
    seq = np.random.SeedSequence(5)
    mf = run_to_end(f, seq.entropy, eft)
    mo = run_to_end(sim, seq.entropy, eft)
    assert mf == mo
    assert state(f)["tasks"] == state(sim)["tasks"]


def test_a_reset_starts_the_unfinished_watermark_again():
    """The watermark of ``unfinished_range`` belongs to an episode: after a reset a fork copies
    the new episode's unfinished tasks (it once kept the last episode's and shared them)."""
    cfg = env()
    eft = EarliestFinish()
    sim = Simulator(cfg)
    sim.reset(episode_seed(0, 1))
    while sim.current is not None:
        sim.step(eft.decide(sim))
    assert sim.unfinished_range() == len(sim.tasks)
    sim.reset(episode_seed(0, 2))
    for _ in range(5):
        sim.step(eft.decide(sim))
    lo = sim.unfinished_range()
    assert lo <= len(sim.tasks) and all(t.state == DONE for t in sim.tasks[:lo])
    f = sim.fork()
    assert not {id(t) for t in f.tasks if t.state != DONE} & {id(t) for t in sim.tasks}


def test_fork_refuses_unknown_mutable_state():
    sim = Simulator(env())
    sim.some_new_list = []
    with pytest.raises(TypeError, match="some_new_list"):
        sim.fork()


def test_fork_shares_only_immutable_values_and_names_no_attribute():
    """What a fork shares is decided by type (envs.fork.immutable), not by a list of names: the
    frozen configuration, the order, the objective and its methods; never a list, a dict, a
    tuple holding one, or a method of a mutable object."""
    from envs.fork import immutable

    sim = Simulator(env())
    for v in (sim.cfg, sim.order, sim.objective, sim._start_reward, sim.costs,
              sim._rules, 1.5, ("a", (1, 2.0))):
        assert immutable(v), v
    for v in ([], {}, (1, []), sim.table, sim.event_q, sim.arrivals, [].append, np.zeros(2)):
        assert not immutable(v), v
    f = sim.fork()
    assert f.cfg is sim.cfg and f.objective is sim.objective and f.table is not sim.table


@pytest.mark.parametrize("source,extra", [
    (REALISTIC, {}),
    ("configs/env/paper.yaml", {}),
    ("configs/env/paper.yaml", {"mdp": {"head_of_line_blocking": False, "transfer_delays_start": True}}),
    ("configs/env/paper.yaml", {"dynamics": DYNAMIC, "n_max": 120}),
    (REALISTIC, {"features": {"workload_scale": 3.0}}),
])
@pytest.mark.parametrize("servers", [16, 48])
def test_eft_equals_a_scan_of_every_node(source, extra, servers):
    """EFT looks at the lowest idle node of each shape, the input's node and the partly used
    ones (``eft_heads``): the same pick as scanning every node with its key, and when the task
    fits no node now, the node where it could start first."""
    cfg = env(source, servers=servers, horizon=60.0, **extra)
    rng = np.random.default_rng(servers)

    def scan(sim):
        t, task = sim.table, sim.task
        fit = [i for i in range(t.n) if t.fits_now(i, task.demands)]
        if fit:
            return min(fit, key=lambda i: (finish_key(sim, i, t.run_time(i, task)), i))
        ever = [i for i in range(t.n) if t.accept_l[i] and t.fits_total(i, task.demands)]
        return min(ever, key=lambda i: (t.earliest_fit(i, task.demands, sim.t), i))

    n = 0
    for ep in range(2):
        sim = Simulator(cfg)
        sim.reset(episode_seed(4, ep))
        while sim.current is not None:
            want = scan(sim)
            assert eft_pick(sim) == want
            n += 1
            sim.step(want if rng.random() < 0.85 else int(rng.integers(0, sim.n_slots)))
    assert n > 300


def test_planner_completes_an_episode_with_valid_decisions(tmp_path):
    cfg = env(horizon=60.0)
    trace = tmp_path / "la.jsonl"
    m = run_episode(cfg, "lookahead", 0, 0, trace)
    assert not m["truncated"] and m["completed_tasks"] == m["arrived_tasks"] > 0
    verify_trace(read_trace(trace))  # readiness, one task per server, memory fits, run times
    # every answer: a slot in range; an idle fitting server, or a wait on a reserved busy one
    pol = Lookahead(cfg, seed=0)
    sim = Simulator(cfg)
    sim.reset(episode_seed(0, 0))
    while sim.current is not None:
        task = sim.current
        a = pol.decide(sim)
        assert 0 <= a < sim.n_slots
        assert sim._accept_l[a] and sim.table.memory_l[a] >= task.memory_gb
        if sim.table.busy[a]:
            assert pol._reserved[task.id][0] == a
        sim.step(a)
    assert sim.metrics()["mean_task_response_s"] == m["mean_task_response_s"]
    assert pol.stats["planned"] > 0 and pol.stats["rollouts"] >= 2 * pol.stats["planned"]


def test_planner_never_picks_a_server_the_task_cannot_fit_when_all_are_reserved():
    """Regression: when every server the task fits was reserved for other tasks, the planner
    answered slot 0, a server too small for the task (found by scale_ray/distill.py: 7 of
    2,083 decisions of this episode)."""
    cfg = load_env(Path(__file__).resolve().parent.parent / "configs/env/realistic.yaml",
                   servers=16)
    pol = get_policy("lookahead", cfg, seed=6)
    sim = Simulator(cfg)
    sim.reset(np.random.SeedSequence([1000, 6]))
    pol.reset(6)
    while sim.current is not None:
        task, mask = sim.current, sim.observe()["action_mask"]
        a = pol.decide(sim)
        assert mask[a] and sim.table.memory_l[a] >= task.memory_gb, (sim.t, a)
        sim.step(a)


def test_planner_is_deterministic_and_one_candidate_is_eft():
    cfg = env(horizon=40.0)
    a = run_episode(cfg, "lookahead:future=sampled", 1)
    b = run_episode(cfg, "lookahead:future=sampled", 1)
    assert a["mean_task_response_s"] == b["mean_task_response_s"]
    # one candidate, no wait: EFT's choice every time, no rollout
    one = run_episode(cfg, "lookahead:candidates=1,wait=false", 1)
    assert one["mean_task_response_s"] == run_episode(cfg, "eft", 1)["mean_task_response_s"]


def test_registration_guard_and_lockstep():
    cfg = env(horizon=20.0)
    pol = get_policy("lookahead:horizon_s=5,objective=workflow", cfg)
    assert isinstance(pol, Lookahead) and is_planner(pol) and not is_planner(get_policy("eft", cfg))
    assert pol.config == LookaheadConfig(horizon_s=5.0, objective="workflow")
    assert not is_learned(pol) and make_guard(pol, None) is None
    assert not hasattr(pol, "scores")  # it plans on the state, never on an observation
    with pytest.raises(ValueError):
        get_policy("sample:lookahead", cfg)
    seq = run_episodes_lockstep(cfg, "lookahead", [0, 1])
    assert [m["mean_task_response_s"] for m in seq] == [
        run_episode(cfg, "lookahead", k)["mean_task_response_s"] for k in (0, 1)]


@pytest.mark.parametrize("spec,key", [
    ("lookahead:candidates=0", "lookahead.candidates"),
    ("lookahead:candidates=2.5", "lookahead.candidates"),
    ("lookahead:horizon_s=-1", "lookahead.horizon_s"),
    ("lookahead:objective=makespan", "lookahead.objective"),
    ("lookahead:base=random", "lookahead.base"),
    ("lookahead:wait=maybe", "lookahead.wait"),
    ("lookahead:future=psychic", "lookahead.future"),
    ("lookahead:depth=3", "lookahead.depth"),
    ("lookahead:first_k=0", "lookahead.first_k"),
    ("lookahead:first_k=17", "lookahead.first_k"),
])
def test_config_errors_name_the_key(spec, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_spec(spec)


def test_the_planner_follows_the_envs_objective_unless_told_otherwise():
    """One default for what better means: the env's ``objective`` (workflow unless a config
    says task, as paper.yaml does); the planner follows it unless given its own."""
    from envs.config import EnvConfig

    assert EnvConfig().objective == "workflow"
    assert parse_spec("lookahead").objective is None
    assert parse_spec("lookahead:objective=task").objective == "task"
    from envs.simulator import DONE, Simulator
    from policies import get_policy
    from scale_ray.config import load_env
    from scale_ray.evaluation import episode_seed

    assert load_env("configs/env/paper.yaml").objective == "task"
    cfg = load_env("configs/env/realistic.yaml", {"objective": "task",
                                                  "workload": {"horizon_s": 60.0}}, servers=16)

    def decisions(spec):
        pol, sim, out = get_policy(spec, cfg, seed=0), Simulator(cfg), []
        sim.reset(episode_seed(0, 0))
        while sim.current is not None:
            out.append(pol.decide(sim))
            sim.step(out[-1])
        return out

    default = decisions("lookahead")
    assert default == decisions("lookahead:objective=task")
    assert decisions("lookahead:objective=workflow") != default


def test_config_from_a_mapping():
    assert load_lookahead_config({"candidates": 2, "wait": False}) == LookaheadConfig(2, wait=False)
    with pytest.raises(ConfigError, match=r"planner\.horizon_s"):
        load_lookahead_config({"horizon_s": 0}, "planner")
    with pytest.raises(ValueError, match="key=value"):
        parse_spec("lookahead:candidates")
    assert build(LookaheadConfig, None) == LookaheadConfig()
