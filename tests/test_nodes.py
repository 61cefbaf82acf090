"""Ray's resource model (envs/nodes.py) through the decision core, the simulator on Ray nodes
and the node rules (policies/heuristics.py), against timelines computed by hand and Ray's own
rules."""

import math

import numpy as np
import pytest

from envs.config import ConfigError, EnvConfig, build, replace
from envs.decision import DecisionCore, Rules
from envs.demands import DemandError, parse_options, parse_selector, selector_matches
from envs.encoding import ServerView, slot_table
from envs.nodes import CACHE_MAX, LATER, NEVER, NOW, NodeSpec, NodeTable
from envs.workflow import TaskSpec, WorkflowSpec
from policies import get_policy, make_heuristic
from policies.heuristics import MAX_WAITS, RayHybrid, ray_node_order
from scale_ray.config import load_env
from scale_ray.evaluation import simulate


def _d(num_cpus=1.0, num_gpus=0.0, memory_gb=0.0, **opts) -> tuple:
    """A task's demands on Ray nodes from Ray's options (memory in GB here)."""
    return parse_options({"num_cpus": num_cpus, "num_gpus": num_gpus, **opts},
                         memory_gb).on_nodes()


class _T:
    """A task as the decision core and the rules see it."""
    def __init__(self, demands, compute=1.0, tid=0):
        self.demands, self.compute, self.id = demands, compute, tid
        self.memory_gb = dict(demands).get("memory", 0.0)
        self.state, self.waits, self.key = 0, 0, (tid,)


class _State:
    """A decision on a hand-built table (``policies.base.State``)."""
    def __init__(self, table, task, now=0.0):
        self.table, self.task, self.now = table, task, now
        self.parent, self.transfer_s, self.transfer_delays = -1, 0.0, False


def _env(tiers: list[dict], order: str = "fifo", **over) -> EnvConfig:
    """Ray nodes of ``tiers`` (each with a count), the agents setting's rules."""
    return build(EnvConfig, {"cluster": {"servers": sum(t["count"] for t in tiers),
                                         "latency_s": 0.0, "tiers": tiers},
                             "mdp": {"order": order, "head_of_line_blocking": False,
                                     "ask_only_startable": True, "advance_to_next_event": True,
                                     "mask_infeasible": True},
                             "objective": "workflow", **over})


def _call(name, demands, compute, parents=()) -> TaskSpec:
    """A call of ``compute`` seconds on a speed-1 node holding ``demands`` (Ray's options)."""
    r = parse_options(demands)
    return TaskSpec(compute, r.memory_gb, 0.0, tuple(parents), name, demands=r.named)


# ---------------------------------------------------------------- the model
def test_two_half_gpu_tasks_share_one_gpu_and_run_at_once():
    t = NodeTable([NodeSpec("g", {"CPU": 4, "GPU": 1, "memory": 16})])
    half = _d(num_gpus=0.5)
    assert t.fits_now(0, half)
    t.start(0, "a", half, 1.0)
    assert t.fits_now(0, half)
    t.start(0, "b", half, 1.0)
    assert not t.fits_now(0, half)
    t.finish("a", 0)
    assert t.fits_now(0, half)


def test_fractions_must_fit_one_gpu_instance_as_in_ray():
    t = NodeTable([NodeSpec("g2", {"CPU": 8, "GPU": 2, "memory": 32})])
    t.start(0, "a", _d(num_gpus=0.75), 1.0)
    assert t.fits_now(0, _d(num_gpus=0.5))  # the other GPU
    t.start(0, "b", _d(num_gpus=0.5), 1.0)
    assert t.gpus[0] == pytest.approx([0.25, 0.5])
    assert not t.fits_now(0, _d(num_gpus=1))  # no whole GPU is free
    assert not t.fits_now(0, _d(num_gpus=0.75))  # 0.75 free in total, in no one instance
    assert t.fits_now(0, _d(num_gpus=0.25))
    t.start(0, "c", _d(num_gpus=0.25), 1.0)
    assert t.gpus[0] == pytest.approx([0.0, 0.5])  # best fit: the fullest instance that fits
    t.finish("a", 0), t.finish("c", 0)
    assert t.fits_now(0, _d(num_gpus=1))


def test_num_cpus_2_and_a_12_gib_task_run_where_ray_runs_them():
    t = NodeTable([NodeSpec("c2", {"CPU": 2, "memory": 16})])
    two = _d(num_cpus=2)
    assert t.fits_now(0, two)
    t.start(0, "a", two, 1.0)
    assert not t.fits_now(0, _d(num_cpus=1))
    t.finish("a", 0)
    big = _d(num_cpus=1, memory_gb=12)
    assert t.fits_now(0, big) and t.missing(big) is None
    assert t.missing(_d(memory_gb=20)) == "memory=20 GB (the most any node has: 16 GB)"
    assert "GPU=1" in t.missing(_d(num_gpus=1))
    assert "custom" in t.missing(_d(resources={"custom": 1}))


def test_demands_follow_rays_options_and_refuse_bad_values_by_name():
    assert _d(num_cpus=1, accelerator_type="A100") == (
        ("CPU", 1.0), ("accelerator_type:A100", 0.001))
    assert _d(num_cpus=0, num_gpus=2) == (("GPU", 2.0),)  # num_cpus=0 holds no CPU, as in Ray
    with pytest.raises(DemandError, match="GPU amount above 1 must be a whole number"):
        _d(num_gpus=1.5)
    with pytest.raises(DemandError, match="options.num_cpus"):
        _d(num_cpus=-1)
    with pytest.raises(DemandError, match="num_gpus"):
        _d(resources={"GPU": 1})
    t = NodeTable([NodeSpec("a", {"CPU": 4, "GPU": 1}, accelerator="A100"),
                   NodeSpec("b", {"CPU": 4, "GPU": 1}, accelerator="A10G")])
    want = _d(num_gpus=1, accelerator_type="A10G")
    assert [t.fits_now(i, want) for i in range(2)] == [False, True]


def test_the_papers_model_is_one_slot_nodes():
    """Servers of one slot ({slot: 1, memory: M}, every task asking {slot: 1, memory: m}) obey
    the paper's rules after any run of starts and ends: a valid pick is an idle accepting
    server whose memory fits; "can some server start it" is whether one is."""
    rng = np.random.default_rng(0)
    n = 6
    mem = [8.0, 8.0, 32.0, 32.0, 80.0, 80.0]
    t = slot_table([ServerView(1.0, m) for m in mem])
    running: dict[int, str] = {}
    for step in range(300):
        m = float(rng.choice([4.0, 16.0, 64.0, 100.0]))
        d = (("memory", m), ("slot", 1.0))
        idle = [i not in running for i in range(n)]
        assert [t.fits_now(i, d) for i in range(n)] == [idle[i] and mem[i] >= m
                                                      for i in range(n)]
        want = NOW if any(idle[i] and mem[i] >= m for i in range(n)) else (
            LATER if max(mem) >= m else NEVER)
        assert t.state(d) == want, step
        i = int(rng.integers(0, n))
        if i in running:
            t.finish(running.pop(i), i)
        elif t.fits_now(i, (("slot", 1.0),)):
            running[i] = f"t{step}"
            t.start(i, running[i], (("slot", 1.0),), 1.0)
        if step % 50 == 49:
            t.set_accepting(step // 50 % n, step % 100 == 99)
            mem_ok = [t.accept_l[i] for i in range(n)]
            assert all(not t.fits_now(i, (("slot", 1.0),)) for i in range(n) if not mem_ok[i])
            t.set_accepting(step // 50 % n, True)


def test_the_core_defers_what_fits_later_and_blocks_what_never_fits():
    t = NodeTable([NodeSpec("c", {"CPU": 2, "memory": 8})])
    core = DecisionCore(t, Rules(False, True, True))
    asked = []
    big, later, now_ = _T(_d(num_cpus=4), tid=0), _T(_d(num_cpus=2), tid=1), _T(_d(num_cpus=1), tid=2)
    t.start(0, "x", _d(num_cpus=1), 5.0)
    for k in (big, later, now_):
        core.queue.push(k.key, k.id, k)
    started = []
    core.run_round(lambda k: asked.append(k.id) or 0, lambda k, i: started.append((k.id, i)) or
                   t.start(i, k, k.demands, 1.0))
    assert asked == [2] and started == [(2, 0)]  # 1 waits unasked (forced), 0 is blocked
    assert core.forced_waits == 1 and [e[2].id for e in core.queue.blocked] == [0]


def test_the_cached_state_equals_a_scan_of_every_node():
    """The answers cached per table stamp and the per-shape idle sets never change the answer:
    after random starts, ends and accepting changes, ``state`` equals "fits some accepting node
    now / ever" scanned node by node."""
    rng = np.random.default_rng(1)
    specs = [NodeSpec("cpu", {"CPU": 8, "memory": 32}), NodeSpec("a10g", {"CPU": 4, "memory": 16,
             "GPU": 1}, accelerator="A10G"), NodeSpec("gpu2", {"CPU": 8, "memory": 64, "GPU": 2})]
    t = NodeTable(specs * 3)
    shapes = [_d(num_cpus=c, num_gpus=g, memory_gb=m) for c in (0, 1, 2, 4, 8)
              for g in (0, 0.25, 0.5, 1, 2) for m in (0, 4, 20)] + [
        _d(num_cpus=1, num_gpus=1, accelerator_type="A10G")]
    running, checked = [], 0
    for step in range(2000):
        d = shapes[int(rng.integers(len(shapes)))]
        ever = any(t.accept_l[i] and t.fits_total(i, d) for i in range(t.n))
        now = any(t.fits_now(i, d) for i in range(t.n))
        assert t.state(d) == (NOW if now else LATER if ever else NEVER), (step, d)
        checked += now
        r = rng.random()
        if r < 0.5 and now:
            fits = t.fitting(d)
            i = fits[int(rng.integers(len(fits)))]
            running.append((f"t{step}", i))
            t.start(i, running[-1][0], d, 1.0)
        elif r < 0.9 and running:
            t.finish(*running.pop(int(rng.integers(len(running)))))
        elif r >= 0.97:
            t.set_accepting(int(rng.integers(t.n)), bool(rng.random() < 0.7))
    assert checked > 200  # both answers were exercised


def test_a_round_sets_aside_at_most_node_look_tasks_that_do_not_fit_now():
    """Under a backlog that fits no node now, a round looks at ``node_look`` of them and stops:
    a task that fits, queued behind more than that, waits for the next round (bounded cost per
    round); one queued within it starts (backfill). ``node_look`` 0: no bound."""
    from envs.decision import NODE_LOOK

    def run(waiting: int, look: int = NODE_LOOK) -> list[int]:
        t = NodeTable([NodeSpec("c", {"CPU": 2, "memory": 8})])
        t.start(0, "x", _d(num_cpus=1), 5.0)
        core = DecisionCore(t, Rules(False, True, True, look))
        for k in range(waiting):
            w = _T(_d(num_cpus=2), tid=k)
            core.queue.push(w.key, w.id, w)
        small = _T(_d(num_cpus=1), tid=waiting)
        core.queue.push(small.key, small.id, small)
        started = []
        core.run_round(lambda k: 0, lambda k, i: started.append(k.id) or
                       t.start(i, k, k.demands, 1.0))
        return started

    assert run(NODE_LOOK) == [NODE_LOOK]
    assert run(NODE_LOOK + 1) == []
    assert run(NODE_LOOK + 1, look=0) == [NODE_LOOK + 1]
    assert run(3, look=2) == []
    with pytest.raises(ConfigError, match="mdp.node_look"):
        build(EnvConfig, {"mdp": {"node_look": -1}})


def test_label_selectors_follow_rays_syntax_and_matching():
    """Ray's label_selector: value, !value, in(a,b), !in(a,b); ``in`` needs the key, ``!``
    matches a node without it; bad syntax is refused naming the key."""
    assert parse_selector({"zone": "in(a, b)", "market": "!spot"}) == (
        ("market", "!spot"), ("zone", "in(a, b)"))
    cases = [("A100", {"t": "A100"}, True), ("A100", {}, False), ("!A100", {}, True),
             ("!A100", {"t": "A100"}, False), ("in(a,b)", {"t": "b"}, True),
             ("in(a,b)", {"t": "c"}, False), ("in(a,b)", {}, False),
             ("!in(a,b)", {"t": "c"}, True), ("!in(a,b)", {"t": "a"}, False)]
    for expr, labels, want in cases:
        assert selector_matches("t", expr, labels) is want, (expr, labels)
    for bad in ("in()", "!!a", "in(a,", "-a", ""):
        with pytest.raises(ValueError, match=r"label_selector\['t'\]"):
            parse_selector({"t": bad})
    with pytest.raises(ValueError, match="label key name 'bad key'"):
        parse_selector({"bad key": "a"})


def test_a_selector_limits_where_a_task_fits_and_a_refusal_names_it():
    t = NodeTable([NodeSpec("a", {"CPU": 4}, labels={"zone": "a"}),
                   NodeSpec("b", {"CPU": 8}, labels={"zone": "b", "spot": "yes"}),
                   NodeSpec("c", {"CPU": 8})])
    assert t.fitting(_d(num_cpus=2, label_selector={"zone": "a"})) == [0]
    assert t.fitting(_d(num_cpus=2, label_selector={"zone": "!a"})) == [1, 2]
    assert t.fitting(_d(num_cpus=2, label_selector={"zone": "!a", "spot": "!yes"})) == [2]
    d = _d(num_cpus=6, label_selector={"zone": "a"})
    assert t.state(d) == NEVER
    assert t.missing(d) == "CPU=6 (the most any node its label_selector allows has: 4)"
    assert "label_selector {zone: in(x, y)} (no node's labels match it)" == t.missing(
        _d(num_cpus=1, label_selector={"zone": "in(x, y)"}))
    t.start(0, "x", _d(num_cpus=3), 1.0)
    assert t.state(_d(num_cpus=2, label_selector={"zone": "a"})) == LATER  # waits for a


def test_a_long_lived_table_keeps_its_demand_cache_bounded():
    """Live, every task may bring its own demand tuple (its own memory): the compiled demands
    stay below CACHE_MAX entries and answers stay right."""
    t = NodeTable([NodeSpec("c", {"CPU": 4, "memory": 16})])
    for k in range(CACHE_MAX + 10):
        d = _d(num_cpus=1, memory_gb=1 + k * 1e-6)
        assert t.state(d) == NOW
    assert len(t._compiled) <= CACHE_MAX
    assert t.state(_d(num_cpus=8)) == NEVER


# ---------------------------------------------------------------- the simulator
GPU_NODE = {"name": "gpu", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
            "gpu_speed": 2.0}
CPU_NODE = {"name": "cpu", "count": 1, "resources": {"CPU": 2, "memory": 16}}


def test_a_request_on_two_nodes_matches_its_timeline_by_hand():
    """plan (0.5 GPU, 2 s) -> two tools (2 CPUs, 3 s each) -> answer (0.5 GPU, 1 s) on a GPU node
    of GPU speed 2 (4 CPUs) and a CPU node with 2 CPUs, under EFT (lowest index on ties).
    plan: GPU node, 0-1 s. Tools: both fit the GPU node (4 CPUs) at t=1 (CPU speed 1 on both,
    the lowest index wins): 1-4 s. answer: 4-4.5 s. Response 4.5 s."""
    env = _env([GPU_NODE, CPU_NODE])
    half, two = {"num_gpus": 0.5, "memory": 1e9}, {"num_cpus": 2, "memory": 1e9}
    req = WorkflowSpec((_call("plan", half, 2.0), _call("t0", two, 3.0, (0,)),
                        _call("t1", two, 3.0, (0,)), _call("answer", half, 1.0, (1, 2))))
    eft = get_policy("eft", env)
    m = simulate(env, eft, 0, arrivals=[(0.0, req)])
    assert m["mean_workflow_response_s"] == pytest.approx(4.5)
    # Two such requests at once: the two plans share the GPU (0.5 each), 0-1 s; four tools of
    # 2 CPUs: the first request's two on the GPU node, the second's on the CPU node at t=1
    # (1-4 s), its last at 4 (4-7 s); answers 4-4.5 and 7-7.5: mean (4.5 + 7.5) / 2.
    m2 = simulate(env, eft, 0, arrivals=[(0.0, req), (0.0, req)])
    assert m2["mean_workflow_response_s"] == pytest.approx(6.0)
    assert m2["invalid_rate"] == 0


def test_learned_speeds_start_blind_and_follow_the_estimator():
    """runtime.speeds learned: with no speed known (speed 1 to the rule) EFT sends the first
    call to the first node (a tie); its run shows that node at half the prior speed, so the
    next call goes to the unexplored node, which runs at 3x the prior: every later call stays
    there. Known speeds: all four on the fast node. (A node is only learned by running there:
    one slower than the prior is left for good, one faster is found only when a call lands on
    it.)"""
    slow = {"name": "slow", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
            "gpu_speed": 0.5}
    fast = {"name": "fast", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
            "gpu_speed": 3.0}
    calls = [(10.0 * k, WorkflowSpec((_call("plan", {"num_cpus": 1, "num_gpus": 1}, 3.0),)))
             for k in range(4)]
    means = []
    for speeds in ("known", "learned"):
        env = _env([slow, fast], runtime={"speeds": speeds})
        means.append(simulate(env, get_policy("eft", env), 0,
                              arrivals=calls)["mean_workflow_response_s"])
    assert means == [pytest.approx(1.0), pytest.approx((6.0 + 1.0 * 3) / 4)]


def test_eft_wait_waits_for_a_faster_node_and_eft_never_waits():
    t = NodeTable([NodeSpec("slow", {"CPU": 1, "GPU": 1}),
                   NodeSpec("fast", {"CPU": 1, "GPU": 1}, gpu_speed=4.0)])
    t.start(1, "busy", _d(num_gpus=1), 1.0)  # the fast node frees at t=1
    task = _T(_d(num_gpus=1), compute=4.0)
    assert make_heuristic("eft").decide(_State(t, task)) == 0  # 4 s on the slow node
    wait = make_heuristic("eft-wait")
    assert wait.decide(_State(t, task)) == 1  # wait: 1 + 1 s on the fast one
    assert not t.fits_now(1, task.demands)
    bounded = make_heuristic("eft_wait")
    assert bounded.decide(_State(t, task)) == 1
    task.waits = MAX_WAITS  # eft_wait: no more waiting after MAX_WAITS (eft-wait: unbounded)
    assert bounded.decide(_State(t, task)) == 0 and wait.decide(_State(t, task)) == 1
    task.waits = 0
    t.finish("busy", 1)
    t.start(1, "busy", _d(num_gpus=1), 10.0)  # now it frees at t=10: 4 s on the slow one wins
    assert wait.decide(_State(t, task)) == 0


def _ray_pick(t, task, rng_seed=0, order=None, n=1):
    ray = RayHybrid(seed=rng_seed, order=order)
    return {ray.decide(_State(t, task)) for _ in range(n)}


def test_ray_hybrid_avoids_gpu_nodes_packs_below_half_and_draws_from_the_top_k():
    nodes = [NodeSpec("gpu", {"CPU": 8, "memory": 32, "GPU": 1})] + [
        NodeSpec(f"c{i}", {"CPU": 8, "memory": 32}) for i in range(9)]
    t = NodeTable(nodes)
    one = _T(_d(num_cpus=1))
    picks = _ray_pick(t, one, n=200)
    assert 0 not in picks  # CPU work avoids the GPU node while a CPU node is available
    # scores below the spread threshold count as 0; top k = max(1, int(0.2 x 10)) = 2 of the
    # equal-score nodes in node-id order: every draw comes from two nodes
    assert len(picks) == 2
    for i in range(1, 10):  # fill every CPU node: CPU work goes to the GPU node
        t.start(i, f"f{i}", _d(num_cpus=8), 9.0)
    assert _ray_pick(t, one) == {0}
    assert _ray_pick(t, _T(_d(num_gpus=1))) == {0}


def test_ray_hybrid_prefers_nodes_below_the_spread_threshold():
    t = NodeTable([NodeSpec("a", {"CPU": 10}), NodeSpec("b", {"CPU": 10})])
    t.start(0, "x", _d(num_cpus=6), 9.0)  # node a at 60 % > 0.5: scored 0.6, b scored 0
    assert _ray_pick(t, _T(_d(num_cpus=1)), 1, n=50) == {1}


def test_ray_node_order_is_libstdcxx_hash_of_the_binary_id_and_ray_hybrid_breaks_ties_by_it():
    """Ray sorts equal-score nodes by ``scheduling::NodeID``: the signed std::hash of the binary
    node id. The expected values were printed by g++ 13's libstdc++ (``(int64_t)
    std::hash<std::string>{}(bytes)``); tests/test_ray_tie_order.py checks the order on Ray."""
    from policies.heuristics import _std_hash

    for hexid, want in [("00", 7857072875483051545), ("fe150c4b", 8563129783979015671),
                        ("b0e78189230c31bc8c4c6dfa", -4141579467855084378),
                        ("a730365a557ee8b2ebdf95fb3c81e224a730365a557ee8b2ebdf95fb",
                         564543480132327033)]:
        assert _std_hash(bytes.fromhex(hexid)) == want
    assert ray_node_order(["fe150c4b", "00", "b0e78189230c31bc8c4c6dfa"]) == [2, 1, 0]
    with pytest.raises(ValueError, match="hex"):
        ray_node_order(["node-1"])
    t = NodeTable([NodeSpec(f"c{i}", {"CPU": 8, "memory": 32}) for i in range(4)])
    order = [2, 0, 3, 1]  # 4 nodes: top k = 1, the first in id order
    assert _ray_pick(t, _T(_d(num_cpus=1)), order=order, n=20) == {2}
    t.start(2, "x", _d(num_cpus=6), 9.0)  # node 2 above the spread threshold: the next in order
    assert _ray_pick(t, _T(_d(num_cpus=1)), order=order) == {0}
    with pytest.raises(ValueError, match="permutation"):
        RayHybrid(order=[0, 0, 1])
    with pytest.raises(ValueError, match="3 node indices for a table of 4"):
        RayHybrid(order=[0, 1, 2]).decide(_State(t, _T(_d(num_cpus=1))))


def test_the_agents_config_is_validated_by_name():
    def env(**agents):
        return build(EnvConfig, {"workload": {"source": "agents", "agents": agents}})

    with pytest.raises(ConfigError, match="unknown key workload.agents.llm.gpus"):
        env(llm={"gpus": [1]})
    with pytest.raises(ConfigError, match="gpu_p"):
        env(llm={"gpu": [0.5, 1.0], "gpu_p": [1.0]})
    with pytest.raises(ConfigError, match="gpu_load"):
        build(EnvConfig, {"workload": {"gpu_load": 1.5}})
    with pytest.raises(ConfigError, match="GPU amount above 1 must be a whole number"):
        build(EnvConfig, {"cluster": {"tiers": [{"name": "x", "resources": {"CPU": 4,
                                                                            "GPU": 1.5}}]}})


def test_a_workload_no_node_can_hold_is_refused_naming_the_resource():
    env = _env([GPU_NODE])
    big = WorkflowSpec((_call("tool", {"num_cpus": 8}, 1.0),))
    m = simulate(env, get_policy("eft", env), 0, arrivals=[(0.0, big)])
    assert m["completed_tasks"] == 0  # set aside: no node could ever hold it
    from envs.nodes import NodeTable as _NT
    assert "CPU=8" in _NT([env.cluster.tiers[0].spec()]).missing(
        parse_options({"num_cpus": 8}).on_nodes())


def test_shipped_agents_setting_runs_paired_and_every_task_finishes():
    env = replace(load_env("configs/env/agents.yaml"), workload={"horizon_s": 40})
    a = simulate(env, get_policy("eft", env), 3)
    b = simulate(env, get_policy("ray", env), 3)
    assert a["completed_workflows"] == b["completed_workflows"] > 10
    assert a["completed_tasks"] == b["completed_tasks"] == a["arrived_tasks"]
    assert simulate(env, get_policy("eft", env), 3) == a  # deterministic per seed
    assert not math.isnan(a["p99_workflow_response_s"])


def test_headroom_default_needs_a_win_everywhere_with_p95_no_worse():
    from scale_ray.bench.headroom import choose_default

    def row(p, n, mean, ci, p95):
        return {"policy": p, "nodes": n, "load": 0.6, "mean_rel_diff_vs_eft": mean / 100,
                "mean_rel_diff_vs_eft_ci95": ci / 100, "p95_rel_diff_vs_eft": p95 / 100}
    rows = [row("eft", 16, 0, 0, 0), row("eft", 64, 0, 0, 0),
            row("ray", 16, -3, 1, -1), row("ray", 64, -2, 1, 0),
            row("eft_spread", 16, -5, 1, -1), row("eft_spread", 64, -0.5, 1, -1),  # CI has 0
            row("reserve", 16, -6, 1, 2), row("reserve", 64, -6, 1, -1),  # p95 worse at 16
            row("lookahead", 16, -9, 1, -1), row("lookahead", 64, -9, 1, -1)]  # not a rule
    assert choose_default(rows) == "ray"
    assert choose_default([r for r in rows if r["policy"] != "ray"]) == "eft"


def test_headroom_pairs_a_run_with_an_earlier_one_by_episode(tmp_path):
    """--paired-with: the same (nodes, load, rule, seed) of two runs, value / earlier - 1
    averaged over the pairs (10 % and 30 % higher: +20 %), episodes missing in either skipped."""
    import json

    from scale_ray.bench.headroom import paired_with

    def ep(seed, mean, stops=0):
        return {"nodes": 16, "load": 0.9, "policy": "eft", "episode": seed, "look_stops": stops,
                "mean_workflow_response_s": mean, "p95_workflow_response_s": mean,
                "p99_workflow_response_s": mean}
    earlier = tmp_path / "a.json"
    earlier.write_text(json.dumps({"node_look": 64, "per_episode": [ep(0, 10.0, 5), ep(1, 10.0, 7)]}))
    lines = paired_with([ep(0, 11.0), ep(1, 13.0), ep(2, 99.0)], str(earlier))
    assert "(node_look 64)" in lines[0] and len(lines) == 2
    assert "(2 episodes)" in lines[1] and "mean +20.0 % higher" in lines[1]
    assert "look_stops 0 vs 6" in lines[1]


def test_heft_order_runs_the_longest_mean_path_first():
    """Two roots on one 1-CPU node: A (1 s, child C 1 s) and B (20 s). fifo and hop put A first
    (more hops below it): A 0-1, B 1-21, C 21-22, task responses 1, 21, 22. HEFT's upward rank
    (mean run time along the path: A 2, B 20) puts B first: B 0-20, A 20-21, C 21-22."""
    one = {"num_cpus": 1}
    req = WorkflowSpec((_call("A", one, 1.0), _call("B", one, 20.0), _call("C", one, 1.0, (0,))))
    node = [{"name": "c", "count": 1, "resources": {"CPU": 1, "memory": 16}}]
    got = {}
    for order in ("fifo", "hop", "upward_rank"):
        env = _env(node, order)
        got[order] = simulate(env, get_policy("eft", env), 0,
                              arrivals=[(0.0, req)])["mean_task_response_s"]
    assert got["fifo"] == got["hop"] == pytest.approx((1 + 21 + 22) / 3)
    assert got["upward_rank"] == pytest.approx((20 + 21 + 22) / 3)


def test_every_order_keys_requests_on_ray_nodes_as_on_servers():
    """One 1-CPU node. Request 1 at t=0: a chain X1 (2 s) -> X2 (2 s); request 2 at t=1: T (1 s).
    At t=2 X1 ends and X2 and T are ready. fifo and hop run X2 first (2-4, T 4-5: responses 4
    and 4). las (request 1 has attained 2 s, request 2 none: re-keyed on X1's finish), srpt (2 s
    of work left against 1) and edf (deadlines 0 + 2 x 4 = 8 against 1 + 2 x 1 = 3) run T
    first (2-3, X2 3-5: responses 5 and 2)."""
    one = {"num_cpus": 1}
    chain = WorkflowSpec((_call("X1", one, 2.0), _call("X2", one, 2.0, (0,))))
    short = WorkflowSpec((_call("T", one, 1.0),))
    node = [{"name": "c", "count": 1, "resources": {"CPU": 1, "memory": 16}}]
    for order, mean in (("fifo", 4.0), ("hop", 4.0), ("las", 3.5), ("srpt", 3.5),
                        ("edf", 3.5)):
        env = _env(node, order)
        m = simulate(env, get_policy("eft", env), 0, arrivals=[(0.0, chain), (1.0, short)])
        assert m["mean_workflow_response_s"] == pytest.approx(mean), order
