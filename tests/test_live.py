"""Live scheduler on real multi-node local Ray clusters (scale_ray.live).

One small cluster (a small, a medium and a large node; one raylet each) is shared by the module's
cluster tests; the fake-autoscaler test starts its own `ray start --head` cluster. Validation
tests need no cluster.
"""

from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest
from processes import fake_autoscaler_head, local_cluster, no_ray_connection

from envs.config import ConfigError
from envs.workflow import TaskSpec, WorkflowError, WorkflowSpec
from policies.base import ObservationPolicy, masked
from scale_ray.config import load_env
from scale_ray.live import (LiveConfig, LiveScheduler, RayDefaultRunner, TaskLostError,
                            WorkflowFailed, collect, parse_dag, primitive)
from scale_ray.live.cluster import LocalHeteroCluster, live_nodes
from scale_ray.live.tasks import DONE
from scale_ray.live.workflow import from_spec, load_dag_file

THREE_TIERS = ["cluster.servers=3",
               "cluster.tiers=[{name: small, compute: 1.0, memory_gb: 8, count: 1},"
               " {name: medium, compute: 2.0, memory_gb: 32, count: 1},"
               " {name: large, compute: 4.0, memory_gb: 80, count: 1}]"]


def _plain_views(pl, task, now):
    """The live record at wall time ``now`` as plain descriptions (envs.encoding), written out
    here from the servers and the task: what the placement's state must encode."""
    from envs.encoding import ServerView, TaskView

    ts = pl._ts
    views = [ServerView(s.node.compute, s.node.memory_gb,
                        max((s.busy_until - now) / ts, 1e-3) if s.running else 0.0,
                        s.node.busy_w if s.running else s.node.idle_w, s.offered, s.node.busy_w)
             for s in pl.alive]
    fp = task.first_parent
    parent = None if fp is None else next(
        (i for i, s in enumerate(pl.alive) if s is fp.last_server), None)
    wf = task.wf
    view = TaskView(task.prim.compute_gflop, task.prim.memory_gb, task.prim.output_gb,
                    len(task.children), wf.done / len(wf.tasks), parent,
                    0.0 if fp is None else fp.prim.output_gb, has_parent=fp is not None)
    return view, views


def test_the_live_state_observes_what_the_encoder_makes_of_plain_descriptions():
    """The live placement's state encodes exactly what ``envs.encoding.encode`` makes of the
    same record written out as plain descriptions: idle and busy servers, an overdue run
    (OVERDUE_S left, as in the simulator), a parent on a live server, a parent whose server is
    gone (every server pays the transfer, as in the simulator). No Ray needed."""
    from envs.encoding import encode
    from policies import get_policy
    from scale_ray.live.cluster import NodeInfo
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.nodes import LiveServer

    env = load_env(None, servers=16)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.5))
    tiers = [(1.0, 8.0, "small", 30.0, 100.0), (2.0, 32.0, "medium", 50.0, 200.0),
             (4.0, 80.0, "large", 80.0, 400.0)]
    servers = [LiveServer(i, NodeInfo(f"node{i}", 1, *tiers[i % 3]), 0) for i in range(7)]
    gone = LiveServer(99, NodeInfo("gone", 1, *tiers[2]), 0)
    pl = sched.placement
    pl.set_alive(servers)
    spec = WorkflowSpec((TaskSpec(2.0, 4.0, 0.3), TaskSpec(3.0, 40.0, 0.7, (0,)),
                         TaskSpec(1.0, 1.0, 0.0, (0, 1))))
    handle = WorkflowHandle(0, from_spec(spec), 0.0)
    sched.admission.admit(handle)
    first = pl.queue.heap[0][2]
    t0, t1, t2 = first.wf.tasks
    now = pl.origin + 100.0  # wall s (perf_counter), after the scheduler's clock origin
    for srv, until in ((servers[1], now + 3.0), (servers[4], now - 1.0)):  # 4: overdue
        srv.take(t0, until)
        pl.hold(srv, t0)
    pl.refresh(now)
    c = env.cluster
    cases = [(t0, None), (t1, servers[2]), (t2, gone)]
    for task, parent_server in cases:
        if parent_server is not None:
            task.first_parent = t0
            t0.last_server = parent_server
        got = pl.state(task, now).observe()
        want = encode(*_plain_views(pl, task, now), env.features, c.bandwidth_gb_s,
                      c.latency_s, mask_infeasible=True)
        for key in ("task", "servers", "action_mask"):
            assert got[key].dtype == want[key].dtype
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        transfer = got["servers"][:, 4]
        if parent_server is None:
            assert not transfer.any()
        elif parent_server is gone:  # every live server pays the transfer
            assert (transfer > 0).all()
        else:  # all but the parent's server
            assert transfer[2] == 0 and (np.delete(transfer, 2) > 0).all()
        assert got["servers"][1, 2] > 0 and got["servers"][0, 2] == 0  # busy / idle
        assert got["servers"][4, 2] == pytest.approx(1e-3 / env.features.time_unit)  # overdue


def test_ray_default_passes_each_parents_transfer_where_transfers_delay_starts():
    """What RayDefaultRunner gives a task's body to emulate its inputs (no Ray: refs stand-ins):
    per parent its status ref and (output / bandwidth + latency) x time_scale; nothing where
    transfers do not delay starts (the paper's setting)."""
    from scale_ray.live.raydag import accept

    env = load_env("configs/env/realistic.yaml", servers=2)
    spec = WorkflowSpec((TaskSpec(1.0, 1.0, 2.0), TaskSpec(1.0, 1.0, 0.5),
                         TaskSpec(1.0, 1.0, 0.0, (0, 1))))
    wf = accept(spec, (), {})
    c = env.cluster
    rd = RayDefaultRunner(env, LiveConfig(time_scale=0.5))
    got = rd._inputs(wf, 2, ["s0", "s1"])
    assert got == (("s0", (2.0 / c.bandwidth_gb_s + c.latency_s) * 0.5),
                   ("s1", (0.5 / c.bandwidth_gb_s + c.latency_s) * 0.5))
    assert rd._inputs(wf, 0, []) == ()
    assert RayDefaultRunner(load_env(None, ["cluster.servers=2"]), LiveConfig(time_scale=0.5)
                            )._inputs(wf, 2, ["s0", "s1"]) == ()


def test_live_planner_plans_on_the_record_and_falls_back_to_eft_when_it_raises():
    """The lookahead planner asked by the live scheduler (no Ray: the record is set by hand)
    waits for a fast busy server holding the task's input; if planning raises, EFT decides,
    the error is counted and nothing stops."""
    from policies import get_policy
    from scale_ray.live.cluster import NodeInfo
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.nodes import LiveServer

    env = load_env("configs/env/realistic.yaml", servers=2)
    sched = LiveScheduler(get_policy("lookahead", env), env, LiveConfig(time_scale=1.0))
    slow = LiveServer(0, NodeInfo("slow", 1, 1.0, 64.0, "small", 30.0, 100.0), 0)
    fast = LiveServer(1, NodeInfo("fast", 1, 8.0, 64.0, "large", 80.0, 400.0), 0)
    pl = sched.placement
    pl.set_alive([slow, fast])
    spec = WorkflowSpec((TaskSpec(1.0, 1.0, 0.5), TaskSpec(8.0, 1.0, 0.5, (0,)),
                         TaskSpec(8.0, 1.0, 0.0, (1,))))
    sched.admission.admit(WorkflowHandle(0, from_spec(spec), 0.0))
    t0, t1, t2 = pl.queue.heap[0][2].wf.tasks
    now = pl.origin + 10.0  # wall s (perf_counter), after the scheduler's clock origin
    # t0 finished on the fast server, which now runs other work for 0.5 s; t1 is ready
    t0.state, t0.last_server = DONE, fast
    t1.first_parent = t1.parents[0]
    pl.queue.heap.clear()
    pl.push(t1)
    fast.take(t0, now + 0.5)
    pl.hold(fast, t0)
    state = pl.state(t1, now)
    sched._planner.new_round()
    assert sched._planner.ask(t1, pl, now) == 1  # 0.5 + 1 s there, 8 s on the slow server
    assert sched._planner.waiting == {t1.gid: 1}

    # a wait is answered again without planning while nothing it plans on changed (the loop's
    # timed rounds); a server freeing, or a new ready task, makes it plan again
    planned = []

    def counting(*a, **k):
        planned.append(1)
        return real(*a, **k)

    real = sched._planner.planner.plan
    sched._planner.planner.plan = counting
    for later in (now, now + 0.01, now + 0.02):
        sched._planner.new_round()
        assert sched._planner.ask(t1, pl, later) == 1
        assert sched._planner.waiting == {t1.gid: 1}
    assert not planned and sched._planner.reused == 3  # the first ask above planned
    other = WorkflowSpec((TaskSpec(1.0, 1.0, 0.5),))
    sched.admission.admit(WorkflowHandle(1, from_spec(other), now))  # one more ready task
    sched._planner.new_round()
    assert sched._planner.ask(t1, pl, now + 0.03) == 1 and len(planned) == 1
    pl.release(fast, t0, now)  # the fast server freed: t1 starts there
    sched._planner.new_round()
    assert sched._planner.ask(t1, pl, now + 0.6) == 1 and sched._planner.waiting == {}
    assert len(planned) == 2 and sched._planner.reused == 3
    sched._planner.planner.plan = real

    # a defer (first_k): remembered for the round as a defer, not as a wait for that server
    calls = []

    def deferring(servers, states, focus, waiting, env=None, deferred=()):
        calls.append(list(deferred))
        sched._planner.planner.last_deferred = True
        return 1

    fast.take(t2, now + 0.5)  # busy again, with another task
    pl.hold(fast, t2)
    sched._planner.new_round()
    sched._planner.planner.plan = deferring
    assert sched._planner.ask(t1, pl, now) == 1
    assert sched._planner.deferred == [t1.gid] and sched._planner.waiting == {}
    sched._planner.ask(t1, pl, now)
    assert calls == [[], [(0, 0)]]  # the next ask of the round sees it deferred
    sched._planner.new_round()
    assert sched._planner.deferred == []
    sched._planner.planner.plan = real

    def broken(*_a, **_k):
        raise RuntimeError("planner bug")

    sched._planner.ask = broken
    assert sched.ask(t1, state) == 0  # EFT: the idle server
    assert sched.counters["planner_errors"] == 1


@primitive(compute_gflop=1.0, memory_gb=1.0)
def node_of(*parents):
    """Returns where it ran plus its inputs: data flow and placement checked together."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id(), "in": list(parents)}


@primitive(compute_gflop=2.0, memory_gb=1.0)
def add(a, b=0):
    return a + b


@primitive(compute_gflop=1.0)
def const(x):
    return x


class SlowestIdle(ObservationPolicy):
    """Picks the idle fitting server with the LEAST compute (the opposite of EFT), so that a test
    can tell the policy's choice from Ray's or EFT's."""
    name = "slowest-idle"

    def __init__(self):
        self.picks: list[int] = []

    def scores(self, obs):
        s = np.asarray(obs["servers"], dtype=np.float64)
        idle = s[:, 2] <= 1e-9
        sc = masked(-s[:, 0], obs["action_mask"])
        sc[~idle] = -np.inf
        return sc

    def act(self, obs):
        a = super().act(obs)
        self.picks.append(a)
        return a


# --------------------------------------------------------------------------------------------
# Validation: rejected before anything runs (no cluster needed)
# --------------------------------------------------------------------------------------------

def test_dag_file_cycle_and_unknown_parent_rejected(tmp_path):
    cyc = {"workflows": [{"name": "loop", "tasks": [
        {"name": "a", "compute_gflop": 1, "parents": ["c"]},
        {"name": "b", "compute_gflop": 1, "parents": ["a"]},
        {"name": "c", "compute_gflop": 1, "parents": ["b"]}]}]}
    with pytest.raises(WorkflowError, match="cycle"):
        parse_dag(cyc)
    unknown = {"name": "w", "tasks": [{"name": "a", "compute_gflop": 1, "parents": ["ghost"]}]}
    with pytest.raises(WorkflowError, match="unknown parent 'ghost'"):
        parse_dag(unknown)
    bad = {"name": "w", "tasks": [{"name": "a", "compute_gflop": -1}]}
    with pytest.raises(WorkflowError, match="compute_gflop must be a finite number > 0"):
        parse_dag(bad)
    typo = {"name": "w", "tasks": [{"name": "a", "compute_gflop": 1, "memory": 3}]}
    with pytest.raises(WorkflowError, match="unknown key 'memory'"):
        parse_dag(typo)
    p = tmp_path / "wf.yaml"
    p.write_text("workflows:\n  - name: ok\n    tasks:\n"
                 "      - {name: b, compute_gflop: 2, memory_gb: 4, parents: [a]}\n"
                 "      - {name: a, compute_gflop: 1}\n")
    (spec,) = load_dag_file(p)
    assert [t.name for t in spec.tasks] == ["a", "b"] and spec.tasks[1].parents == (0,)


def test_live_config_rejects_bad_executor_and_idle_time():
    with pytest.raises(ConfigError, match=r"executor must be one of \['task', 'actor'\], got 'actors'"):
        LiveConfig(executor="actors")
    with pytest.raises(ConfigError, match="live.actor_idle_s"):
        LiveScheduler(SlowestIdle(), load_env(None, THREE_TIERS), {"actor_idle_s": 0})


def test_workflow_api_builds_the_dag():
    a = const.bind(1)
    b = add.bind(a, 2)
    c = add.bind(a, b=b)
    wf = collect(c, "diamond")
    assert [t.name for t in wf.spec.tasks] == ["const", "add", "add"]
    assert wf.spec.tasks[2].parents == (0, 1) and wf.outputs == (2,)
    assert wf.spec.tasks[1].compute_gflop == 2.0
    with pytest.raises(WorkflowError, match="nests a Call"):
        add.bind([a])
    with pytest.raises(WorkflowError, match="compute_gflop"):
        primitive(compute_gflop=0)(lambda: 1)
    # a cycle can only be made by mutating a bound call; it is still caught
    x = const.bind(0)
    y = add.bind(x)
    x.args = (y,)
    with pytest.raises(WorkflowError, match="cycle"):
        collect(y)


# --------------------------------------------------------------------------------------------
# Real multi-node cluster
# --------------------------------------------------------------------------------------------

def _tier_of(node_id: str, cluster: LocalHeteroCluster) -> str:
    return cluster.node_tier[node_id]


LONG_TASK = WorkflowSpec((TaskSpec(120.0, 2.0, 0.01),), "long")


def _long_workflows(n: int, seed: int) -> list[WorkflowSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tasks = [TaskSpec(float(rng.uniform(2, 4)), 2.0, 0.01)]
        for i in range(1, 4):
            tasks.append(TaskSpec(float(rng.uniform(2, 4)), 2.0, 0.01, (int(rng.integers(0, i)),)))
        out.append(WorkflowSpec(tuple(tasks), f"w{k}"))
    return out


_no_ray_connection = no_ray_connection


@pytest.fixture(scope="class")
def cluster():
    yield from local_cluster(THREE_TIERS)


@pytest.mark.slow
class TestSharedCluster:
    """Tests sharing one 3-node cluster (torn down before the tests that start their own)."""

    @pytest.mark.parametrize("executor", ["task", "actor"])
    def test_results_flow_and_tasks_run_where_the_policy_chose(self, cluster, executor):
        c, env = cluster
        events = []
        policy = SlowestIdle()
        with LiveScheduler(policy, env, LiveConfig(time_scale=0.0, executor=executor),
                           trace=events.append) as sched:
            a = node_of.bind()
            b = node_of.bind(a)
            d = node_of.bind(a, b)
            h = sched.submit(d, "chain")
            out = h.result(timeout=60)
            s = sched.submit(add.bind(add.bind(const.bind(3), 4), const.bind(10)))
            assert s.result(timeout=60) == 17
            # emulated DAG: every task's value = index + 1 + sum(parent values)
            spec = WorkflowSpec((TaskSpec(1, 1, 0.1), TaskSpec(1, 1, 0.1, (0,)), TaskSpec(1, 1, 0.1, (0,)),
                                 TaskSpec(1, 1, 0.1, (1, 2))), "diamond")
            e = sched.submit(spec)
            assert [e.get(i, timeout=60) for i in range(4)] == [1, 1 + 2, 1 + 3, 3 + 4 + 4]
        # data flowed: d saw a's and b's results, b saw a's
        assert out["in"][0]["node"] == out["in"][1]["in"][0]["node"]
        ran_on = [out["in"][0]["node"], out["in"][1]["node"], out["node"]]
        # the policy always chose the slowest idle server: the small node, every time
        assert {_tier_of(n, c) for n in ran_on} == {"small"}
        assert h.task_nodes == ran_on
        # the trace's start node (the policy's choice) equals where each task ran
        starts = {ev["task"]: ev["node"] for ev in events if ev["event"] == "start"}
        finishes = {}
        for ev in events:
            if ev["event"] == "finish":
                assert ev["task"] not in finishes, "a task completed twice"
                finishes[ev["task"]] = ev["node"]
        assert starts == finishes
        assert len(policy.picks) >= 3 + 4 + 4
        if executor == "actor":  # one actor per server, started when the server was seen
            assert sched.counters["actors_started"] == len(sched.alive_servers)


    def test_a_server_actor_imports_its_run_bodies_package_before_its_first_run(self, cluster):
        """The import every run body needs happens while start() waits for the actor, not in
        the server's first run (it made that run 150 ms wall slower). A runtime env of its own
        gives the actor a fresh worker that no earlier task warmed."""
        import sys

        import ray

        from scale_ray.live.executors import _server_actor_class

        fresh = {"env_vars": {"SCALE_TEST_FRESH_WORKER": "1"}}
        a = _server_actor_class().options(num_cpus=0, runtime_env=fresh).remote()
        ray.get(a.__ray_ready__.remote(), timeout=120)
        a.register.remote(1, lambda meta: ("scale_ray.live.executors" in sys.modules, None))
        imported, _ = a.run.remote(1, ())
        assert ray.get(imported, timeout=60) is True
        ray.kill(a)

    def test_bench_pinned_floor_runs_the_dags_correctly(self, cluster):
        """bench live's reference loop really runs every task of the DAG mix with its data."""
        import ray

        from scale_ray.bench.live import _chain, _fan, _pinned_floor
        from scale_ray.live.workflow import expected_emulated_values

        c, env = cluster
        slots = [n.node_id for n in live_nodes(env.cluster.tiers) for _ in range(n.slots)]
        specs = [_chain(5), _fan(4), _chain(3)]
        wall, refs = _pinned_floor(specs, slots)
        assert wall > 0
        assert [ray.get(r) for r in refs] == [expected_emulated_values(s) for s in specs]

    def test_bench_quality_runs_each_policy_next_to_its_twin(self, cluster, tmp_path):
        """bench live's quality part (tiny): EFT under the paper's order and the default one,
        live and in the simulator twin on the same arrivals; Ray default without a twin; with
        traces, the run overhead measured and the twin run again with it."""
        import argparse

        from scale_ray.bench.live import arrivals, quality
        from scale_ray.bench.twin import calibrated, compare, headline, live_model, why

        c, env = cluster
        args = argparse.Namespace(workflows=4, time_scale=0.02, executor="actor", load=None,
                                  seed=0, trace_dir=str(tmp_path))
        pols = ["eft@hop", "eft", "ray-default"]
        q = quality(env, pols, args, c)
        assert set(q["twin"]) == {"eft@hop", "eft"}
        for p in pols:
            assert q[p]["workflows_completed"] == 4, p
            lag = q[p]["submit_lag_model_s"]  # how late the driver submitted, model s
            assert 0.0 <= lag["mean"] <= lag["max"] < 50.0, (p, lag)
        assert all(q["twin"][p]["completed_workflows"] == 4 for p in q["twin"])
        rows = compare({p: live_model(q[p], args.time_scale) for p in pols}, q["twin"])
        h = headline(rows, "eft", "eft")
        assert set(h) == {"rel_diff_vs_hop", "rel_diff_vs_ray_default", "max_twin_gap_points"}
        assert all(math.isfinite(v) for v in h.values())
        w = {p: why(str(tmp_path / f"live_{p}.jsonl"), str(tmp_path / f"twin_{p}.jsonl"), q[p],
                    args.time_scale) for p in q["twin"]}
        assert all(0.0 < x["run_overhead_s"] < 50.0 for x in w.values()), w
        specs, _, times = arrivals(env, args, 0)
        cal = calibrated(env, args, {p: live_model(q[p], args.time_scale) for p in pols}, specs,
                         times, 0, w)
        assert cal["overhead_s"] == {p: x["run_overhead_s"] for p, x in w.items()}
        assert [r["policy"] for r in cal["rows"]] == pols and math.isfinite(cal["max_twin_gap_points"])

    def test_bench_overhead_measures_both_executors(self, cluster):
        """bench live's overhead part end to end (tiny): both executors run every DAG, their
        actors release the cluster's CPUs before the plain-Ray side runs again."""
        import ray

        from scale_ray.bench.live import overhead
        from scale_ray.live.runner import wait_cpus_free

        c, env = cluster
        r = overhead(env, repeats=2, n_workflows=2, chain=5, executor="actor")
        assert r["executor"] == "actor" and set(r["by_executor"]) == {"task", "actor"}
        assert r["overhead_tasks"] == 8 + 16 and r["chain_hops"] == 4
        for e in ("task", "actor"):
            assert r["by_executor"][e]["tasks_per_s"] > 0 and len(r["raw"][f"{e}_tp"]) == 2
        assert r["throughput_ratio"] == r["by_executor"]["actor"]["throughput_ratio"]
        wait_cpus_free(30)  # no actor leaked: all CPUs come back (asynchronously)
        assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]

    def test_fits_no_node_rejected_before_running(self, cluster):
        c, env = cluster
        big = primitive(compute_gflop=1.0, memory_gb=500.0, name="huge")(lambda: 1)
        with LiveScheduler(SlowestIdle(), env, LiveConfig(time_scale=0.0)) as sched:
            before = sched.counters["tasks_started"]
            with pytest.raises(WorkflowError,
                               match=r"task 1 \('huge'\) asks for memory=500 GB.*could ever run it"):
                sched.submit(big.bind(const.bind(1)))
            assert sched.handles() == [] and sched.counters["tasks_started"] == before
        with pytest.raises(WorkflowError, match="fits no configured tier"):
            RayDefaultRunner(env).submit(big.bind())
        with pytest.raises(ConfigError, match="live.max_retries"):
            LiveScheduler(SlowestIdle(), env, {"max_retries": -1})


    def test_memory_fit_and_ray_default(self, cluster):
        """A 40 GB task only fits the large node; Ray's own placement gives the same results."""
        c, env = cluster
        from policies import get_policy
        spec = WorkflowSpec((TaskSpec(2, 4, 0.1), TaskSpec(2, 40, 0.1, (0,)), TaskSpec(1, 20, 0.1, (0, 1))),
                            "mem")
        with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.01)) as sched:
            h = sched.submit(spec)
            assert h.result(timeout=60) == from_spec(spec).expected[2]
        assert _tier_of(h.task_nodes[1], c) == "large"
        assert _tier_of(h.task_nodes[2], c) in ("medium", "large")
        s = sched.summary()  # the thread's CPU, its Ray client calls' part inside it
        assert 0.0 < s["ray_client_cpu_s"] < s["thread_cpu_s"]
        with RayDefaultRunner(env, LiveConfig(time_scale=0.01)) as rd:
            hs = [rd.submit(spec) for _ in range(3)]
            assert rd.drain(timeout=60)
        assert rd.summary()["thread_cpu_s"] > 0.0  # its ray.wait / ray.get thread
        for r in hs:
            assert r.result() == from_spec(spec).expected[2]
            assert _tier_of(r.task_nodes[1], c) == "large"


    def test_ray_default_pays_emulated_transfers_from_other_nodes(self, cluster):
        """With transfers delaying starts (realistic.yaml), Ray's own placement sleeps a parent's
        transfer when the parent ran on another node, as the live scheduler's runs do: the body
        reads where the parent ran from its status ref (pinned here by tier labels)."""
        import ray

        from scale_ray.live.cluster import TIER_LABEL
        from scale_ray.live.executors import wrap_body

        c, env = cluster
        body = ray.remote(num_returns=2, num_cpus=0)(wrap_body(lambda *a: len(a)))

        def on(tier, meta, *args):
            return body.options(label_selector={TIER_LABEL: tier}).remote(meta, *args)

        v0, s0 = on("large", (None, 0.0, 1e-3))
        ray.get(s0)
        tr = 0.5
        _, far = on("small", (None, 0.0, 1e-3, 0, None, False, ((s0, tr),)), v0)
        _, near = on("large", (None, 0.0, 1e-3, 0, None, False, ((s0, tr),)), v0)
        (far_node, far_s), (near_node, near_s) = ray.get([far, near])
        assert far_node != ray.get(s0)[0] == near_node
        assert far_s >= tr > near_s

    def test_artifact_policy_places_live_tasks(self, cluster, tmp_path):
        """A policy artifact (untrained cross-attention, pure torch) drives the live scheduler:
        same encoder, any N; every task lands on a server its memory fits."""
        pytest.importorskip("torch")
        from policies import get_policy
        from policies.artifact import save_untrained

        c, env = cluster
        path = save_untrained(tmp_path / "untrained", module="crossattn", seed=0)
        policy = get_policy(str(path), env)
        spec = WorkflowSpec((TaskSpec(2, 4, 0.1), TaskSpec(2, 40, 0.1, (0,)),
                             TaskSpec(1, 20, 0.1, (0,)), TaskSpec(1, 1, 0.1, (1, 2))), "art")
        with LiveScheduler(policy, env, LiveConfig(time_scale=0.0)) as sched:
            hs = [sched.submit(spec) for _ in range(3)]
            assert sched.drain(timeout=60)
        expected = from_spec(spec).expected
        for h in hs:
            assert [h.get(i) for i in range(4)] == list(expected)
            assert _tier_of(h.task_nodes[1], c) == "large"
        assert sched.counters["decisions"] >= 12

    def test_lookahead_plans_live_rounds_from_the_scheduler_record(self, cluster):
        """The lookahead planner drives the live scheduler (snapshots of its own record): the
        workflows complete with correct results, memory fits, and the planner planned (rollouts
        on snapshots that held running tasks)."""
        from policies import get_policy

        c, env = cluster
        planner = get_policy("lookahead", env)
        spec = WorkflowSpec((TaskSpec(2, 4, 0.1), TaskSpec(2, 40, 0.1, (0,)),
                             TaskSpec(1, 20, 0.1, (0,)), TaskSpec(1, 1, 0.1, (1, 2))), "la")
        with LiveScheduler(planner, env, LiveConfig(time_scale=0.05)) as sched:
            hs = [sched.submit(spec) for _ in range(4)] + [sched.submit(w) for w in _long_workflows(4, 1)]
            assert sched.drain(timeout=120)
            stats = dict(sched._planner.planner.stats)
        expected = from_spec(spec).expected
        for h in hs[:4]:
            assert [h.get(i) for i in range(4)] == list(expected)
            assert _tier_of(h.task_nodes[1], c) == "large"
        assert all(h.done() and h.error is None for h in hs)
        # every ask was planned, or (a wait asked again with nothing changed) answered again
        assert (stats["decisions"] + sched.counters["planner_reused"]
                == sched.counters["decisions"] >= 4 * 4 + 4 * 4)
        assert stats["planned"] >= 1 and stats["rollouts"] >= 2

    def test_guard_keeps_a_misfit_policy_from_waiting_forever(self, cluster):
        """A learned policy that always answers the smallest server (masked for a 20 GB task)
        would wait forever; the guard (on by default) answers EFT's choice, counts it, traces it."""
        c, env = cluster

        class Smallest(ObservationPolicy):
            name = "smallest"

            def scores(self, obs):
                return -np.asarray(obs["servers"], dtype=np.float64)[:, 1]

        events = []
        spec = WorkflowSpec((TaskSpec(1, 20, 0.1), TaskSpec(1, 20, 0.1, (0,))), "big")
        with LiveScheduler(Smallest(), env, LiveConfig(time_scale=0.0),
                           trace=events.append) as sched:
            hs = [sched.submit(spec) for _ in range(2)]
            assert sched.drain(timeout=60)
            summary = sched.summary()
        assert all(h.done() for h in hs)
        assert summary["guard_infeasible"] == summary["guard_overrides"] >= 4
        assert summary["waits"] == 0
        # every run's time outside its worker, per node where runs finished (Completions.run_lag)
        lag = summary["run_lag_by_node"]
        assert set(lag) == set(summary["tasks_per_node"]) and summary["run_lag_model_s"] > 0
        assert all(0 < mean <= most for mean, most in lag.values())
        guard_events = [e for e in events if e["event"] == "guard"]
        assert len(guard_events) == summary["guard_overrides"]
        assert all(e["reason"] == "infeasible" for e in guard_events)

    @pytest.mark.parametrize("executor", ["task", "actor"])
    def test_added_node_receives_tasks_then_killed_node_loses_nothing(self, cluster, executor):
        c, env = cluster
        from policies import get_policy
        events = []
        sched = LiveScheduler(get_policy("eft", env), env,
                              LiveConfig(time_scale=0.1, node_refresh_s=0.05, executor=executor),
                              trace=events.append)
        with sched:
            specs = _long_workflows(8, 0)
            hs = [sched.submit(s) for s in specs[:4]]
            new = c.add_node("large")  # the fastest node: EFT sends work there once it is seen
            deadline = time.time() + 60
            # seen, and (executor=actor) its actor answered: offered from then on (on a loaded
            # machine a new worker can take longer than the first four workflows)
            while not any(s.node.node_id == new and s.offered for s in list(sched.alive_servers)) \
                    and time.time() < deadline:
                time.sleep(0.05)
            hs += [sched.submit(s) for s in specs[4:]]
            while sched.completions.node_tasks.get(new, 0) == 0 and time.time() < deadline:
                time.sleep(0.05)
            assert sched.completions.node_tasks.get(new, 0) > 0, "the added node never received a task"
            # kill a node while it runs a task
            more = [sched.submit(s) for s in _long_workflows(6, 1)]
            # three one-task workflows of 120 GFLOP (3 s wall on a large node, 12 s on a small
            # one): some run lasts long enough for the kill to land while it runs
            longest = [sched.submit(LONG_TASK) for _ in range(3)]
            victim = None
            kill_deadline = time.time() + 30
            while victim is None and time.time() < kill_deadline:
                # the busy node whose run has the most time left (>= 1.5 s wall: on a loaded
                # machine a run with 0.5 s left ended before the kill landed, on CI)
                now = time.perf_counter()
                busy = sorted((s.busy_until - now, s.node.node_id) for s in list(sched.alive_servers)
                              if s.task is not None and s.offered
                              and s.node.node_id != c.nodes[0].node_id)
                if busy and busy[-1][0] >= 1.5:
                    victim = busy[-1][1]
                time.sleep(0.01)
            assert victim is not None, "no node ran a long enough task to be killed"
            c.kill_node(victim)
            assert sched.drain(timeout=120)
            while victim in {n.node_id for n in live_nodes()} and time.time() < deadline + 60:
                time.sleep(0.1)  # an actor's death can be seen before the GCS drops the node
            alive = {n.node_id for n in live_nodes()}
        assert victim not in alive
        hs += more + longest
        for h, spec in zip(hs, specs + _long_workflows(6, 1) + [LONG_TASK] * 3, strict=True):
            assert h.error is None
            assert [h.get(i) for i in range(len(spec.tasks))] == list(from_spec(spec).expected)
        assert sched.counters["lost"] >= 1
        lost_at = next(i for i, ev in enumerate(events) if ev["event"] == "lost")
        # after the loss nothing completes on the dead node: a start there while the GCS still
        # lists the node (its other servers) is lost too and runs again elsewhere
        assert all(ev["node"] != victim for ev in events[lost_at:] if ev["event"] == "finish")
        late = {ev["task"] for ev in events[lost_at:] if ev["event"] == "start"
                and ev["node"] == victim}
        assert late <= {ev["task"] for ev in events[lost_at:] if ev["event"] == "lost"}
        finished = [ev["task"] for ev in events if ev["event"] == "finish"]
        assert len(finished) == len(set(finished)) == sum(len(s.tasks) for s in specs) + 24 + 3


    def test_idle_actors_are_reaped_and_restarted_on_demand(self, cluster):
        """executor=actor: idle server actors are killed after actor_idle_s, which frees their
        CPUs (the autoscaler needs idle nodes), and the servers are masked; waiting tasks wake
        them (a new actor each, offered once it answers)."""
        import ray

        c, env = cluster
        from policies import get_policy
        spec = WorkflowSpec((TaskSpec(1, 1, 0.1), TaskSpec(1, 1, 0.1, (0,)), TaskSpec(1, 1, 0.1, (0, 1))),
                            "three")
        cfg = LiveConfig(time_scale=0.0, executor="actor", actor_idle_s=0.5)
        with LiveScheduler(get_policy("eft", env), env, cfg) as sched:
            n = len(sched.alive_servers)
            assert sched.counters["actors_started"] == n
            assert sched.submit(spec).result(timeout=60) == from_spec(spec).expected[2]
            deadline = time.time() + 30
            while sched.counters["actors_reaped"] < n and time.time() < deadline:
                time.sleep(0.1)
            assert sched.counters["actors_reaped"] == n
            total = ray.cluster_resources()["CPU"]
            while ray.available_resources().get("CPU", 0) < total and time.time() < deadline:
                time.sleep(0.1)
            assert ray.available_resources().get("CPU", 0) == total, "reaped actors hold CPUs"
            # a reaped server is masked: no run is handed to an actor still starting
            assert not any(s.offered for s in sched.alive_servers)
            h = sched.submit(spec)
            assert h.result(timeout=60) == from_spec(spec).expected[2]
            assert sched.counters["actors_started"] > n  # started again on demand

    def test_server_whose_actor_cannot_start_is_never_offered(self, cluster, caplog):
        """Two servers per 1-CPU node: one actor per node starts, the other cannot; start()
        warns after actor_start_s, and every task runs on a server whose actor is ready."""
        import logging

        c, env = cluster
        from policies import get_policy
        events = []
        spec = WorkflowSpec((TaskSpec(1, 1, 0.1), TaskSpec(1, 1, 0.1, (0,)), TaskSpec(1, 1, 0.1, (0,))),
                            "fan")
        cfg = LiveConfig(time_scale=0.0, executor="actor", slots_per_node=2, actor_start_s=3.0)
        with caplog.at_level(logging.WARNING, logger="scale_ray.live.scheduler"):
            with LiveScheduler(get_policy("eft", env), env, cfg, trace=events.append) as sched:
                n_nodes = len(live_nodes())
                # the unstartable half, and any startable one still starting on a busy machine
                m = re.search(r"(\d+) of (\d+) server actors not ready", caplog.text)
                assert m and n_nodes <= int(m[1]) <= 2 * n_nodes == int(m[2]), caplog.text
                hs = [sched.submit(spec) for _ in range(4)]
                assert sched.drain(timeout=60)
                deadline = time.time() + 60  # a startable actor still starting answers later
                while (len([s for s in sched.alive_servers if s.offered]) < n_nodes
                       and time.time() < deadline):
                    time.sleep(0.2)
                offered = [s for s in sched.alive_servers if s.offered]
                ready = {s.sid for s in offered}
        # one per node: the second actor of a node never starts, so it is never offered
        assert len(ready) == n_nodes == len({s.node.node_id for s in offered})
        assert all([h.get(i) for i in range(3)] == list(from_spec(spec).expected) for h in hs)
        used = {ev["server"] for ev in events if ev["event"] == "start"}
        assert used and used <= ready

    def test_dead_actor_run_is_retried_and_failed_restarts_back_off(self, cluster):
        """executor=actor: a run whose actor died is lost and placed again; the server's new
        actors fail to start twice (as on a dying node), so it stays masked, is retried after a
        pause, and is offered again once an actor answers."""
        import ray

        c, env = cluster
        with LiveScheduler(SlowestIdle(), env, LiveConfig(time_scale=0.0, executor="actor")) as sched:
            victim = min(sched.alive_servers, key=lambda s: s.node.compute)  # SlowestIdle's first pick
            real = sched._remote.actor
            failing = [2]

            def dying_actor(node_id):
                a = real(node_id)
                if failing[0] > 0:
                    failing[0] -= 1
                    ray.kill(a, no_restart=True)
                return a

            sched._remote.actor = dying_actor
            ray.kill(victim.actor, no_restart=True)
            h = sched.submit(add.bind(const.bind(2), 3))
            assert h.result(timeout=60) == 5
            deadline = time.time() + 30
            while not victim.offered and time.time() < deadline:
                time.sleep(0.05)
            assert victim.offered and failing[0] == 0
            assert sched.counters["lost"] >= 1
            assert sched.counters["actors_started"] >= len(sched.alive_servers) + 3
            h2 = sched.submit(const.bind(7))  # the slowest server works again
            assert h2.result(timeout=60) == 7 and h2.task_nodes[0] == victim.node.node_id

    def test_retries_run_out_with_a_clear_error(self, cluster):
        """A node set that keeps losing the task: after max_retries the workflow fails, named."""
        c, env = cluster
        from policies import get_policy
        with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.0, max_retries=1)) as sched:
            def lose_every_run(t, srv, now):  # emulate a node dying under every run
                sched.completions.lose(t, "node died (injected)")
            sched.runs.submit = lose_every_run
            h = sched.submit(const.bind(1))
            assert h.wait(30)
        with pytest.raises(WorkflowFailed, match=r"was lost 2 times \(max_retries=1\)"):
            h.result()
        assert isinstance(h.error, TaskLostError)


@primitive(compute_gflop=1.0, output_gb=0.004)
def big_array(n):
    return np.ones(n)  # 4 MB: above Ray's inline limit, so it lives in its node's object store


@primitive(compute_gflop=1.0)
def nap(seconds):
    time.sleep(seconds)
    return seconds


@primitive(compute_gflop=1.0)
def total(arr, extra):
    return float(arr.sum()) + extra


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["task", "actor"])
def test_output_lost_with_its_node_is_recomputed(executor):
    """A finished parent's result dies with its node before its child runs: the child's run is
    lost, the parent runs again elsewhere, then the child; the value is right, nothing twice."""
    _no_ray_connection()
    env = load_env(None, THREE_TIERS)
    c = LocalHeteroCluster(env.cluster).start()
    events = []
    try:
        cfg = LiveConfig(time_scale=0.0, executor=executor, node_refresh_s=0.05)
        with LiveScheduler(SlowestIdle(), env, cfg, trace=events.append) as sched:
            h = sched.submit(total.bind(big_array.bind(500_000), nap.bind(4.0)))
            deadline = time.time() + 60
            while h.task_finish_wall[0] is None and time.time() < deadline:
                time.sleep(0.01)
            first = h.task_nodes[0]
            assert _tier_of(first, c) == "small" and h.task_finish_wall[1] is None
            c.kill_node(first)  # while the nap (on another node) still runs
            assert h.result(timeout=120) == 500_000 + 4.0
            assert sched.counters["rerun_parents"] >= 1
        assert h.task_nodes[0] != first  # the parent's result now comes from a live node
        finishes = [ev["task"] for ev in events if ev["event"] == "finish" and not ev.get("rerun")]
        assert sorted(finishes) == sorted(set(finishes)) and len(finishes) == 3
    finally:
        c.shutdown()


# --------------------------------------------------------------------------------------------
# Ray's fake autoscaler (the `fake_multinode` provider)
# --------------------------------------------------------------------------------------------



@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("executor", ["task", "actor"])
def test_fake_autoscaler_nodes_appear_are_used_and_go_away(executor):
    from policies import get_policy

    with fake_autoscaler_head("scale-live-test"):
        env = load_env(None, THREE_TIERS)
        cfg = LiveConfig(time_scale=0.2, autoscale_hints=True, backlog_s=0.5, node_refresh_s=0.2,
                         executor=executor, actor_idle_s=2.0)
        with LiveScheduler(get_policy("eft", env), env, cfg) as sched:
            assert live_nodes() == []  # nothing to schedule on yet: demand must add nodes
            specs = _long_workflows(6, 2)
            hs = [sched.submit(s) for s in specs]
            assert sched.drain(timeout=150), "workflows did not finish on autoscaled nodes"
            used = set(sched.completions.node_tasks)
            assert all(h.error is None for h in hs)
            assert [hs[0].get(i) for i in range(4)] == list(from_spec(specs[0]).expected)
            assert len(used) >= 2, f"expected several autoscaled nodes to run tasks, got {used}"
            deadline = time.time() + 90
            while live_nodes() and time.time() < deadline:
                time.sleep(1)
            assert live_nodes() == [], "idle autoscaled nodes did not go away"
            if executor == "actor":  # their actors were reaped first
                assert sched.counters["actors_reaped"] >= len(used)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_workflows_cli_with_scaling_and_failure(tmp_path, repo):
    from envs.trace import read_trace
    from scale_ray.cli import main

    _no_ray_connection()
    out, trace = tmp_path / "run.json", tmp_path / "trace.jsonl"
    args = ["run-workflows", "--nodes", "3", "--dag", str(repo / "configs/live/agent_dags.yaml"),
            "--workflows", "8", "--rate", "0.5", "--time-scale", "0.05", "--seed", "1",
            "--add-node-at", "1:large", "--kill-node-at", "3", "--json", str(out),
            "--trace", str(trace)]
    for item in THREE_TIERS:
        args += ["--set", item]
    assert main(args) == 0
    stats = json.loads(out.read_text())
    for key in ("workflows_submitted", "workflows_completed", "workflows_failed",
                "mean_workflow_response_s", "p95_workflow_response_s"):
        assert key in stats
    assert stats["workflows_submitted"] == stats["workflows_completed"] == 8
    assert stats["workflows_failed"] == 0 and stats["mean_workflow_response_s"] > 0
    assert [e["kind"] for e in stats["cluster_events"]] == ["add", "kill"]
    events = read_trace(trace)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "episode" and kinds[-1] == "end"
    assert kinds.count("server_add") == 4  # three at start, one added
    assert kinds.count("finish") == 8 * 6


@pytest.mark.slow
def test_run_workflows_cli_compares_with_ray_default(tmp_path):
    from scale_ray.cli import main

    _no_ray_connection()
    out = tmp_path / "cmp.json"
    args = ["run-workflows", "--nodes", "3", "--workflows", "6", "--time-scale", "0.02",
            "--policy", "eft", "ray-default", "--json", str(out)]
    for item in THREE_TIERS:
        args += ["--set", item]
    assert main(args) == 0
    stats = json.loads(out.read_text())
    assert set(stats["by_policy"]) == {"eft", "ray-default"}
    assert stats["by_policy"]["ray-default"]["workflows_completed"] == 6
    assert "eft" in stats["rel_diff_vs_ray_default"]


def test_run_workflows_cli_rejects_bad_arguments(tmp_path):
    from scale_ray.cli import main

    assert main(["run-workflows", "--nodes", "0"]) == 2
    assert main(["run-workflows", "--policy", "no-such-policy", "--workflows", "1"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "w", "tasks": [{"name": "a", "compute_gflop": 1,
                                                      "parents": ["a"]}]}))
    assert main(["run-workflows", "--dag", str(bad)]) == 2


def test_done_callbacks_run_once_and_one_that_raises_stops_nothing():
    """The scheduler service waits on handles through callbacks run on the scheduler thread."""
    from scale_ray.live.handles import WorkflowHandle

    h = WorkflowHandle(0, from_spec(WorkflowSpec((TaskSpec(1.0, 0.0, 0.0),), "one")), 0.0)
    seen = []

    def boom(_):
        raise RuntimeError("event loop is closed")

    h.add_done_callback(boom)
    h.add_done_callback(lambda x: seen.append(("before", x.id)))
    assert seen == []
    h.record_completion(1.0)  # the raising callback is logged, the next one still runs
    h.add_done_callback(lambda x: seen.append(("after", x.id)))
    assert seen == [("before", 0), ("after", 0)] and h.done()
