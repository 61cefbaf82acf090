"""The scheduler service on a cluster that autoscales (issue 18): with Ray's fake autoscaler
(`ray start --head` with a `fake_multinode` provider, its own temp dir and ports), demand the
service reports through ``autoscale_hints`` adds nodes, the service places work on them, and
idle ones are released. In a module of its own: no other cluster may be up meanwhile."""

from __future__ import annotations

import time

import pytest
from processes import fake_autoscaler_head


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
