"""The scheduler service on clusters of its own tests (issue 18), in a module without a
module-scoped cluster so that no other cluster is up meanwhile:

* with Ray's fake autoscaler (`ray start --head` with a `fake_multinode` provider, its own temp
  dir and ports), demand the service reports through ``autoscale_hints`` adds nodes, the service
  places work on them, and idle ones are released;
* `scale-ray bench service` end to end on a small local cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import fake_autoscaler_head

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fake_autoscaler_nodes_are_used_and_released_through_the_service():
    from ray import serve

    from envs.workflow import TaskSpec, WorkflowSpec
    from scale_ray import client
    from scale_ray.live.cluster import live_nodes
    from scale_ray.ports import free_port
    from serve_apps.scheduler import application

    with fake_autoscaler_head("scale-service-test"):
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()},
                    proxy_location="HeadOnly")
        try:
            serve.run(application({"policy": "eft", "env_config": None, "live": {
                "time_scale": 0.2, "autoscale_hints": True, "backlog_s": 0.5, "node_refresh_s": 0.2,
                "actor_idle_s": 2.0}}), name="scheduler", route_prefix="/")
            assert live_nodes() == []  # nothing to run on yet: demand must add nodes
            chain = WorkflowSpec(tuple(TaskSpec(8.0, 1.0, 0.0, (i - 1,) if i else ())
                                       for i in range(4)), "chain")
            hs = [client.submit(chain) for _ in range(6)]
            assert all(h.result(timeout=200) == 10 for h in hs)
            used = {n for h in hs for n in (t["node"] for t in h.status()["tasks"])}
            assert len(used) >= 2, f"expected several autoscaled nodes to run tasks, got {used}"
            deadline = time.time() + 120
            while live_nodes() and time.time() < deadline:
                time.sleep(1)
            assert live_nodes() == [], "idle autoscaled nodes did not go away"
            assert client.cluster()["counters"]["actors_reaped"] >= len(used)
        finally:
            serve.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_service_writes_the_documented_keys(tmp_path):
    """`scale-ray bench service` end to end on a small cluster (its own, after this module's);
    without the node kill (Ray default's run would wait out Ray's heartbeat timeout: ~70 s
    more), which test_bench_service_kills_the_replica_twice_and_loses_nothing covers."""
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "scale_ray.cli", "bench", "service", "--nodes", "4",
                          "--servers-per-node", "2", "--workflows", "6", "--time-scale", "0.05",
                          "--policy", "eft", "--kill-at", "-1", "--json", str(out)],
                         capture_output=True, text=True, timeout=560, cwd=str(REPO))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert {"clients", "workflows_submitted", "workflows_completed", "workflows_failed",
            "double_booked", "mean_workflow_response_s", "p95_workflow_response_s",
            "ray_default_mean_workflow_response_s", "rel_diff_vs_ray_default",
            "submit_latency_ms"} <= set(r)
    assert r["clients"] == 2 and r["workflows_submitted"] == r["workflows_completed"] == 12
    assert r["double_booked"] == 0 and r["ray_default_workflows_completed"] == 12
    assert set(r["submit_latency_ms"]) == {"p50", "p99"} and r["submit_latency_ms"]["p50"] > 0
    # the headline is the relation of the two runs' means (value / reference - 1)
    assert r["rel_diff_vs_ray_default"] == pytest.approx(
        r["mean_workflow_response_s"] / r["ray_default_mean_workflow_response_s"] - 1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_service_kills_the_replica_twice_and_loses_nothing(tmp_path):
    """`scale-ray bench service --kill-replica-at`: the replica is killed -9 twice mid-run (and
    a busy node once); every workflow completes, none is lost or double-booked. With
    ``--no-ray-default`` no reference runs and no ``ray_default_*`` key is written."""
    out = tmp_path / "kills.json"
    run = subprocess.run([sys.executable, "-m", "scale_ray.cli", "bench", "service", "--nodes", "4",
                          "--servers-per-node", "2", "--workflows", "15", "--time-scale", "0.1",
                          "--policy", "eft", "--kill-replica-at", "0.2", "0.6", "--no-ray-default",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=560, cwd=str(REPO))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["replica_kills"] == 2 and len(r["resume_s"]) == 2
    assert r["workflows_submitted"] == r["workflows_completed"] == 30
    assert r["workflows_lost"] == 0 and r["double_booked"] == 0
    assert all(s is not None and 0 < s < 60 for s in r["resume_s"])
    assert {"actor_started", "policy_loaded", "scheduler_started", "at"} == set(
        r["resume_steps_s"][0])
    assert not [k for k in r if k.startswith("ray_default") or k == "rel_diff_vs_ray_default"]
    assert "ray-default" not in run.stdout and r["setting"] == "paper"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_service_flood_keeps_tenants_apart(tmp_path):
    """`scale-ray bench service --tenants 2 --flood N` on a small cluster: the victim's
    workflows wait about one flood task at most, every cross-tenant read and cancel is refused,
    the flood's extra workflow is a 429, and nothing answers 5xx."""
    out = tmp_path / "flood.json"
    run = subprocess.run([sys.executable, "-m", "scale_ray.cli", "bench", "service", "--tenants",
                          "2", "--flood", "1000", "--nodes", "4", "--servers-per-node", "2",
                          "--victim-workflows", "4", "--window-s", "3", "--policy", "eft",
                          "--json", str(out)], capture_output=True, text=True, timeout=560,
                         cwd=str(REPO))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["cross_tenant_reads_refused"] == r["cross_tenant_cancels_refused"] == 10
    assert r["rejected_429"] == 1 and r["http_5xx"] == 0
    assert r["unauthenticated_refused"] == r["unauthenticated_attempts"] == 2
    assert r["victim_wait_s"]["max"] <= 2.0 + r["server_free_s"]
    assert r["decisions_per_s_under_backlog"] > 0 and r["replica_rss_mb"]["before"] > 0
    from serve_apps.tenants import tenant_label  # tenant names are hashed in metrics

    assert r["metrics_scraped"][
        f'ray_scale_scheduler_rejected_total{{reason="quota",tenant="{tenant_label("flood")}"}}'] == 1
