"""Issue 72 (6): ``scale-ray bench live --setting autoscale``: our sizing against Ray's
autoscaler path on a local cluster whose nodes come and go (scale_ray/bench/autoscale_live.py)."""

from __future__ import annotations

import argparse
import time

import pytest

from envs.accounting import slo_report
from scale_ray.bench.autoscale_live import (LIVE_NODES, ElasticCluster, _Rec, live_env, peak,
                                            requests)


def test_the_live_env_is_autoscale_yaml_on_small_nodes_and_its_requests_replay():
    env = live_env(600, 0.6)
    assert {t.name: t.spec().resources.get("CPU") for t in env.cluster.tiers} == {
        k: v["resources"]["CPU"] for k, v in LIVE_NODES.items()}
    assert env.cluster.servers == 3 and env.workload.horizon_s == 600
    assert env.sizing.slo.p95_s == 60 and env.sizing.slo.window_s == 300
    a, b = requests(env, 0), requests(env, 0)
    assert a and [t for t, _ in a] == [t for t, _ in b]
    assert all(0 <= t < 600 for t, _ in a) and [t for t, _ in a] == sorted(t for t, _ in a)
    assert requests(env, 1) != a


def test_records_feed_the_slo_report_and_peak_reads_the_timeline():
    env = live_env(600, 0.6)
    recs = [_Rec(10.0, 40.0), _Rec(20.0, None), _Rec(310.0, 330.0)]
    r = slo_report(recs, env.sizing.slo, 600.0)
    assert r["windows"] == 2 and r["window_p95_s"][0] == float("inf")  # a lost one misses
    assert r["window_p95_s"][1] == pytest.approx(20.0) and r["attainment"] == 0.5
    assert peak([(0.0, {"a": 1, "b": 0}), (5.0, {"a": 3, "b": 1}), (9.0, {"a": 2, "b": 2})]) \
        == {"a": 3, "b": 2}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_elastic_cluster_launches_after_the_delay_removes_and_bills():
    from processes import no_ray_connection

    import ray

    no_ray_connection()
    env = live_env(600, 0.6)
    ts = 0.05
    with ElasticCluster(env, ts, seed=0) as cl:
        assert cl.counts() == {"cpu16": 1, "a10g": 1, "a100": 1}
        t0 = time.perf_counter()
        cl.launch("cpu16", 2)
        assert cl.launching["cpu16"] == 2 and cl.counts()["cpu16"] == 1
        while cl.counts()["cpu16"] < 3:
            cl.wait(time.perf_counter() + 0.1)
            assert time.perf_counter() - t0 < 60
        # joined no sooner than the tier's shortest launch delay (model s x time scale)
        assert time.perf_counter() - t0 >= env.cluster.tier("cpu16").launch_s.min * ts
        assert cl.launching["cpu16"] == 0
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert set(cl.nodes) <= alive
        cl.launch("cpu16", 10)  # capped at max_nodes
        assert cl.launching["cpu16"] == LIVE_NODES["cpu16"]["max_nodes"] - 3
        gone = next(nid for nid, (tier, _) in cl.nodes.items() if tier == "cpu16")
        cl.remove(gone)
        cl.pump()
        assert gone not in cl.nodes and cl.counts()["cpu16"] == 2
        cost = cl.cost()
        assert cost["cost"] > 0 and cost["node_hours"]["cpu16"] > 0
        assert [c["cpu16"] for _, c in cl.timeline][-3:] == [2, 3, 2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bench_runs_both_arms_and_loses_nothing(tmp_path):
    """A short run of both arms (two minutes of load at time scale 0.1): every request
    completes in each arm, and the JSON holds the headline keys and each arm's twin."""
    import json

    from processes import no_ray_connection

    from scale_ray.bench import autoscale_live

    no_ray_connection()
    out = tmp_path / "a.json"
    args = argparse.Namespace(time_scale=0.1, autoscale_horizon_s=120.0, autoscale_rate=0.6,
                              seed=0, timeout_s=300.0, json=str(out))
    assert autoscale_live.run(args) == 0
    r = json.loads(out.read_text())
    assert r["workflows_lost"] == 0
    for key in ("rel_cost_vs_ray_autoscaler", "slo_attainment", "ray_autoscaler_slo_attainment",
                "max_twin_gap_points"):
        assert r[key] is not None
    # the machine's load and each arm's live / twin ratio decide whether the run may be read
    v = r["validity"]
    assert set(v["live_vs_twin"]) == {"model/eft", "ray/ray"} and v["load_1m_peak"] > 0
    assert v["valid"] == (not v["reasons"])
    for arm in ("model/eft", "ray/ray"):
        live, twin = r["arms"][arm]["live"], r["arms"][arm]["twin"]
        assert live["workflows_completed"] == live["workflows_submitted"] == r["requests"]
        assert live["cost"] > 0 and twin["cost"] > 0
