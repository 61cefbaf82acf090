"""Test helper: the processes a test started itself, found by its own temp dir (never by name)."""

from __future__ import annotations

import os
from pathlib import Path


def pids_using(temp_dir: str) -> list[int]:
    """PIDs (not this one) whose command line names ``temp_dir``: the processes of a cluster the
    test started with that temp dir, and nothing else on the machine."""
    needle = temp_dir.encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def wait_for_port(port: int, procs: list, what: str, timeout: float = 90) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections; if it does not in ``timeout`` s or one
    of ``procs`` (``subprocess.Popen`` started with ``start_new_session``) exits first, stop them
    and raise with the tail of the first one's output."""
    import socket
    import time

    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                stop_own(procs, None)
                try:
                    out = procs[0].communicate(timeout=30)[0] if procs else b""
                except Exception:  # noqa: BLE001 - the output is only for the message
                    out = b""
                raise RuntimeError(f"{what} did not start:\n"
                                   f"{(out or b'').decode(errors='replace')[-3000:]}") from None
            time.sleep(1)


def stop_own(procs: list, temp_dir: str | None) -> None:
    """Stop the processes this test started (``procs``, last first, by process group) and then
    anything left whose command line names ``temp_dir``; remove ``temp_dir``."""
    import shutil
    import signal
    import subprocess

    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    if temp_dir is None:
        return
    for pid in pids_using(temp_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


def no_ray_connection() -> None:
    """Disconnect an embedded Ray another test module may have left up: our clusters need a
    fresh driver."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def cpuless_head_cluster(prefix: str):
    """A ``ray.cluster_utils.Cluster`` whose head has no CPUs (its own temp dir and ports), on a
    fresh driver; returns ``(cluster, temp_dir)``. The caller adds nodes and shuts it down."""
    import tempfile

    from ray.cluster_utils import Cluster

    from scale_ray.live.raylocal import prepare_local_ray

    no_ray_connection()
    prepare_local_ray()
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    return Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "temp_dir": tmp}), tmp


def local_cluster(overrides: list[str]):
    """A generator for a fixture: a ``LocalHeteroCluster`` of ``load_env(None, overrides)``'s
    cluster (its own temp dir and ports) on a fresh driver; yields ``(cluster, env)`` and shuts
    the cluster down afterwards."""
    from scale_ray.config import load_env
    from scale_ray.live.cluster import LocalHeteroCluster

    no_ray_connection()
    env = load_env(None, overrides)
    c = LocalHeteroCluster(env.cluster).start()
    try:
        yield c, env
    finally:
        c.shutdown()


def fake_autoscaler_head(name: str, max_workers: int = 3):
    """A context manager: ``ray start --head`` with Ray's fake autoscaler (Ray's `fake_multinode` provider; node
    type ``medium``: one scale server of compute 2, 32 GB, 1 CPU; up to ``max_workers`` of them,
    released after 6 s idle), its own temp dir and ports, no token auth. Connects this process
    (``ray.init``) and yields the GCS port; afterwards disconnects and stops only the processes
    of that temp dir."""
    import contextlib
    import json
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    @contextlib.contextmanager
    def run():
        import ray

        from scale_ray.ports import free_port

        no_ray_connection()
        port = free_port()  # outside Ray's worker ports (guide §8) and the ephemeral range
        client_port = free_port(exclude={port})
        temp_dir = tempfile.mkdtemp(prefix="scla_", dir="/tmp")
        cfg_path = Path(temp_dir) / "autoscaler.json"
        medium = {"CPU": 1, "scale_slot": 1, "scale_compute": 2.0, "scale_memory_gb": 32.0}
        cfg_path.write_text(json.dumps({
            "cluster_name": name, "max_workers": max_workers, "idle_timeout_minutes": 0.1,
            "upscaling_speed": 1.0,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True,
                         "gcs_address": f"127.0.0.1:{port}"},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
                "medium": {"resources": medium, "node_config": {}, "min_workers": 0,
                           "max_workers": max_workers}},
            "head_node_type": "ray.head.default",
            "auth": {"ssh_user": "ubuntu"}, "docker": {}, "file_mounts": {},
            "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [],
            "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
            "head_start_ray_commands": [], "worker_start_ray_commands": [],
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
            yield port
        finally:
            ray.shutdown()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in pids_using(temp_dir):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                time.sleep(2)
            shutil.rmtree(temp_dir, ignore_errors=True)

    return run()
