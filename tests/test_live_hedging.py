"""Hedged copies of stragglers in the live scheduler (issue 31, scale_ray/live/runs.py): the
first run wins, the loser is cancelled and its server freed, unmarked primitives never run
twice, the trace has both runs and no double booking. One 3-node local cluster for the module;
the validation tests need no cluster."""

from __future__ import annotations

import time

import pytest
from processes import local_cluster

from envs.config import ConfigError, build
from envs.demands import Request
from policies import get_policy
from scale_ray.bench.service import double_booked, reruns
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler, Primitive
from scale_ray.live.cluster import NodeInfo
from scale_ray.live.nodes import LiveServer
from scale_ray.live.workflow import WorkflowError, emulated_body

THREE_TIERS = ["cluster.servers=3",
               "cluster.tiers=[{name: small, compute: 1.0, memory_gb: 8, count: 1},"
               " {name: medium, compute: 2.0, memory_gb: 32, count: 1},"
               " {name: large, compute: 4.0, memory_gb: 80, count: 1}]"]
TS = 0.25  # wall s per model s


def straggler(name: str, hedge: bool, run_gflop: float, copy_gflop: float = 1.0) -> Primitive:
    """An emulated primitive that declares 1 GFLOP but whose first run takes ``run_gflop``."""
    p = Primitive(emulated_body, compute_gflop=1.0, name=name, hedge=hedge, emulate=True)
    p.run_gflop, p.copy_gflop = run_gflop, copy_gflop
    return p


def test_primitive_and_config_validate_hedge_and_kind():
    with pytest.raises(WorkflowError, match="hedge must be true or false"):
        Primitive(emulated_body, hedge="yes")
    with pytest.raises(WorkflowError, match="kind must be a non-empty string"):
        Primitive(emulated_body, kind="")
    p = Primitive(emulated_body, name="search_3", hedge=True)
    assert (p.kind, p.hedge) == ("search", True)
    q = p.options(compute_gflop=2.0)
    assert (q.kind, q.hedge, q.compute_gflop) == ("search", True, 2.0)
    assert Primitive(emulated_body, name="x", kind="llm").kind == "llm"
    with pytest.raises(ConfigError, match="hedge"):
        build(LiveConfig, {"hedge": "sometimes"}, "live")
    with pytest.raises(ConfigError, match="hedge_quantile"):
        build(LiveConfig, {"hedge_quantile": 1.0}, "live")


def test_a_copy_goes_to_the_fastest_idle_server_that_fits():
    env = load_env(None, THREE_TIERS)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=TS, hedge="all"))
    tiers = [(1.0, 8.0, "small", 30.0, 100.0), (2.0, 32.0, "medium", 50.0, 200.0),
             (4.0, 80.0, "large", 80.0, 400.0)]
    servers = [LiveServer(i, NodeInfo(f"node{i}", 1, *tiers[i]), 0) for i in range(3)]
    for s in servers:
        s.offered = True
    sched.set_alive(servers)

    class T:  # what copy_server reads of a task: its demands (one slot), its server
        server = None
        demands = Request(memory_gb=16.0).on_slot()
    assert sched.runs.copy_server(T()) is servers[2]  # the large one
    other = T()
    servers[2].take(other, sched.placement.origin + 1.0)
    sched.placement.hold(servers[2], other)
    assert sched.runs.copy_server(T()) is servers[1]  # busy: the next fastest that fits
    T.demands = Request(memory_gb=40.0).on_slot()
    assert sched.runs.copy_server(T()) is None  # only the busy large server has 40 GB
    T.demands = Request(memory_gb=1.0).on_slot()
    T.server = servers[1]
    assert sched.runs.copy_server(T()) is servers[0]  # never its own server


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster(THREE_TIERS)


def _run(env, cfg: LiveConfig, prim: Primitive):
    events: list[dict] = []
    with LiveScheduler(get_policy("eft", env), env, cfg, trace=events.append) as sched:
        h = sched.submit([prim.bind(0)], "one")
        assert h.result(timeout=60) == 1  # emulated_body(0): the value of either run
        assert sched.drain(timeout=30)
        # the loser's server is free again once it returned (cancelled runs stop early)
        deadline = time.monotonic() + 10
        while sched.runs.losers and time.monotonic() < deadline:
            time.sleep(0.05)
        counters = dict(sched.counters)
        busy = [s.sid for s in sched.alive_servers if s.running]
    return h, events, counters, busy


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["actor", "task"])
def test_a_straggler_is_copied_the_copy_wins_and_the_loser_is_cancelled(cluster, executor):
    c, env = cluster
    # EFT puts it on the large server (4 GFLOP/s): 200 GFLOP there take 12.5 s wall; its copy
    # (1 GFLOP) on the medium one takes 0.125 s once the run passes its 0.9-quantile (~0.1 s)
    h, events, counters, busy = _run(env, LiveConfig(time_scale=TS, hedge="marked",
                                                     executor=executor),
                                     straggler("slow", True, 200.0))
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and [bool(e.get("hedge")) for e in starts] == [False, True]
    assert starts[0]["server"] != starts[1]["server"]
    finish = [e for e in events if e["event"] == "finish"]
    cancel = [e for e in events if e["event"] == "cancel"]
    assert len(finish) == 1 and finish[0]["server"] == starts[1]["server"]  # the copy won
    assert len(cancel) == 1 and cancel[0]["server"] == starts[0]["server"]
    # the cancelled run stopped long before its 12.5 s: its server was freed
    assert (cancel[0]["t"] - starts[0]["t"]) * TS < 6.0, cancel
    assert h.response_s < 6.0
    assert counters["hedge_copies"] == 1 and counters["hedge_wins"] == 1
    assert counters["hedge_copy_s"] > 0 and counters["hedge_waste_s"] > 0
    assert busy == [] and double_booked(events) == 0 and reruns(events) == 0


@pytest.mark.slow
def test_traces_record_the_estimate_at_start_and_the_run_at_finish(cluster):
    c, env = cluster
    h, events, counters, _ = _run(env, LiveConfig(time_scale=TS, estimator="online",
                                                  hedge="off"), straggler("est", False, 8.0))
    start = next(e for e in events if e["event"] == "start")
    finish = next(e for e in events if e["event"] == "finish")
    assert start["estimate_s"] > 0  # 1 GFLOP declared on the large server: about 0.25 model s
    assert 8.0 / 4.0 <= finish["run_s"] < 8.0 / 4.0 + 2.0  # it slept 8 GFLOP there (2 model s)


@pytest.mark.slow
def test_an_unmarked_primitive_never_runs_twice_and_all_copies_it(cluster):
    c, env = cluster
    h, events, counters, _ = _run(env, LiveConfig(time_scale=TS, hedge="marked"),
                                  straggler("plain", False, 24.0))
    assert [e["event"] for e in events if e["event"] in ("start", "cancel")] == ["start"]
    assert counters["hedge_copies"] == 0
    h, events, counters, _ = _run(env, LiveConfig(time_scale=TS, hedge="off"),
                                  straggler("marked_but_off", True, 24.0))
    assert counters["hedge_copies"] == 0
    # hedge=all: every task may be copied
    h, events, counters, _ = _run(env, LiveConfig(time_scale=TS, hedge="all"),
                                  straggler("plain", False, 200.0))
    assert counters["hedge_copies"] == 1 and double_booked(events) == 0


@pytest.mark.parametrize("gone", ["original", "copy"])
def test_a_node_lost_under_one_run_drops_that_run_only(gone):
    """No Ray: the scheduler's records of a hedged task whose original (or copy) server leaves
    the cluster. The other run carries the task; nothing is placed again; a cancelled run on a
    gone server frees it."""
    from envs.workflow import TaskSpec, WorkflowSpec
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.runs import _Run
    from scale_ray.live.tasks import RUNNING
    from scale_ray.live.workflow import from_spec

    env = load_env(None, THREE_TIERS)
    events: list[dict] = []
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=TS, hedge="all"),
                          trace=events.append)
    tiers = [(1.0, 8.0, "small", 30.0, 100.0), (2.0, 32.0, "medium", 50.0, 200.0),
             (4.0, 80.0, "large", 80.0, 400.0)]
    servers = [LiveServer(i, NodeInfo(f"node{i}", 1, *tiers[i]), 0) for i in range(3)]
    sched.set_alive(servers)
    sched.admission.admit(WorkflowHandle(0, from_spec(WorkflowSpec((TaskSpec(1.0, 1.0, 0.0),))), 0.0))
    t = sched.placement.queue.heap[0][2]
    a, b = servers[2], servers[1]
    t.state, t.server, t.status, t.token, t.started = RUNNING, a, "ref-a", 1, 0.0
    t.copy = _Run(b, "val-b", "ref-b", 0.5, 0.1, 0.0, 0.1)
    a.take(t, 0.1)
    b.take(t, 0.1)
    sched.running.update({"ref-a": (t, 1), "ref-b": (t, 1)})
    lost_srv, kept = (a, b) if gone == "original" else (b, a)
    assert sched.runs.server_gone(lost_srv) == []  # nothing lost: the other run goes on
    assert t.state == RUNNING and t.copy is None and t.server is kept
    assert t.is_copy == (gone == "original")
    assert lost_srv.task is None and kept.task is t
    assert list(sched.running) == ["ref-b" if gone == "original" else "ref-a"]
    assert sched.counters["lost"] == 0  # not placed again: the other run goes on
    assert [e["event"] for e in events[1:]] == ["cancel"]  # after the arrival
    assert events[1]["reason"] == "server_fail" and events[1]["server"] == lost_srv.sid
    # a cancelled run (a loser) on a server that leaves: forgotten, the server freed
    c = servers[0]
    c.take(t, 0.1)
    sched.runs.losers["ref-c"] = (t, _Run(c, "val-c", "ref-c", 0.0, 0.1, 0.0, 0.1))
    assert sched.runs.server_gone(c) == []
    assert not sched.runs.losers and c.task is None and t.state == RUNNING


@pytest.mark.slow
def test_bench_live_quality_runs_noisy_hint_free_and_hedged(cluster):
    """bench live --noise 1 --hints none --estimator online --hedge all (tiny): the live runs
    execute the noisy runs, learn, hedge; the twin simulates the same settings."""
    import argparse

    from scale_ray.bench.live import quality, runtime_env

    c, env = cluster
    args = argparse.Namespace(workflows=6, time_scale=0.05, executor="actor", load=0.6, seed=0,
                              noise=1.0, hints="none", estimator="online", hedge="all")
    assert runtime_env(env, args).runtime.hedge == "all"
    q = quality(env, ["eft", "ray-default"], args, c)
    assert q["eft"]["workflows_completed"] == 6 and q["ray-default"]["workflows_completed"] == 6
    assert q["eft"]["estimator"]  # it learned from the completions
    assert q["twin"]["eft"]["completed_workflows"] == 6
    assert "hedge_copies" in q["eft"] and "hedge_copies" in q["twin"]["eft"]
