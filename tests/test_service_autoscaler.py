"""The scheduler service on a cluster that autoscales (issue 18): with Ray's fake autoscaler
(`ray start --head` with a `fake_multinode` provider, its own temp dir and ports), demand the
service reports through ``autoscale_hints`` adds nodes, the service places work on them, and
idle ones are released. In a module of its own: no other cluster may be up meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def _no_ray_connection() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fake_autoscaler_nodes_are_used_and_released_through_the_service():
    import ray
    from ray import serve

    from envs.workflow import TaskSpec, WorkflowSpec
    from processes import pids_using
    from scale_ray import client
    from scale_ray.live.cluster import live_nodes
    from scale_ray.ports import free_port
    from serve_apps.scheduler import application

    _no_ray_connection()
    port = free_port()
    client_port = free_port(exclude={port})
    temp_dir = tempfile.mkdtemp(prefix="sclsvc_", dir="/tmp")
    cfg_path = Path(temp_dir) / "autoscaler.json"
    medium = {"CPU": 1, "scale_slot": 1, "scale_compute": 2.0, "scale_memory_gb": 32.0}
    cfg_path.write_text(json.dumps({
        "cluster_name": "scale-service-test", "max_workers": 3, "idle_timeout_minutes": 0.1,
        "upscaling_speed": 1.0,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": f"127.0.0.1:{port}"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "medium": {"resources": medium, "node_config": {}, "min_workers": 0, "max_workers": 3}},
        "head_node_type": "ray.head.default",
        "auth": {"ssh_user": "ubuntu"}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }))
    envv = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    try:
        started = subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=0",
                                  f"--autoscaling-config={cfg_path}", f"--temp-dir={temp_dir}",
                                  "--include-dashboard=false",
                                  f"--ray-client-server-port={client_port}"],
                                 env=envv, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, f"ray start failed: {started.stderr[-2000:]}"
        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(address=f"127.0.0.1:{port}")
        serve.start(http_options={"host": "127.0.0.1", "port": free_port(exclude={port, client_port})},
                    proxy_location="HeadOnly")
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
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            for pid in pids_using(temp_dir):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
