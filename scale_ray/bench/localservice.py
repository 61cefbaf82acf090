"""A local multi-node cluster with the scheduler service deployed on it, for the service benches
and tests: deploy, kill the scheduler actor, a door or a busy node, and read the service's
metrics back from Ray's Prometheus endpoints."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from scale_ray import client
from scale_ray.live.cluster import LocalHeteroCluster
from scale_ray.ports import free_port
from serve_apps.metrics import parse_prometheus

__all__ = ["LocalService", "scrape_metrics", "successor_steps"]


class LocalService:
    """A local multi-node cluster with the scheduler service deployed on it (bench and tests).

    ``args``: :class:`serve_apps.scheduler.SchedulerArgs` as a mapping (a ``trace`` file is
    added). ``url`` is the HTTP base; this process is a connected driver."""

    def __init__(self, cluster: LocalHeteroCluster, args: dict[str, Any]):
        self.cluster = cluster
        self.trace_path = str(args.get("trace") or Path(cluster.temp_dir) / "service-trace.jsonl")
        self.args = {**args, "trace": self.trace_path}
        self.port = 0
        self.deploy_options: dict[str, Any] = {}  # SchedulerService.options of every deploy

    def start(self) -> "LocalService":
        from ray import serve

        self.port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port},
                    proxy_location="HeadOnly")
        self.deploy()
        return self

    def deploy(self, **deployment_options: Any) -> None:
        from ray import serve

        from serve_apps.scheduler import application

        opts = {"logging_config": {"enable_access_log": False}, **self.deploy_options,
                **deployment_options}
        serve.run(application(self.args, **opts), name="scheduler", route_prefix="/")

    def wait_accepting(self, timeout_s: float = 300.0) -> float:
        """Wait until the service offers every server it lists (their actors answered); the
        wall seconds it took. A stream started earlier measures actor start-up, not placement."""
        t0 = time.monotonic()
        while True:
            servers = client.cluster()["servers"]
            offered = sum(bool(s.get("accepting")) for s in servers)
            if servers and offered == len(servers):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the service offers {offered} of its {len(servers)} servers "
                                   f"after {timeout_s:.0f} s")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        from ray import serve

        serve.shutdown()

    def replica_pid(self) -> int:
        """The PID of the scheduler actor (``GET /v1/cluster`` as a Ray job sees it)."""
        return int(client.cluster()["scheduler_pid"])

    def kill_replica(self) -> float:
        """``kill -9`` the scheduler actor (Ray restarts it; it resumes from the journal; the
        doors answer 503 meanwhile); returns the kill's wall time."""
        os.kill(self.replica_pid(), signal.SIGKILL)
        return time.time()

    def kill_door(self) -> float:
        """``kill -9`` one door (a Serve replica: Serve replaces it, the scheduler goes on);
        returns the kill's wall time."""
        import ray

        actor = ray.get_actor(client.cluster()["door_actor"], namespace="serve")
        pid = int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=60))
        os.kill(pid, signal.SIGKILL)
        return time.time()

    def kill_busy_node(self) -> str | None:
        """Kill a node running a primitive now (not the service's node); its id, or None."""
        snap = client.cluster()
        own = {n.node_id for n in self.cluster.nodes}
        busy = [s["node"] for s in snap["servers"]
                if s["busy"] and s["node"] != snap["scheduler_node"] and s["node"] in own]
        if not busy:
            return None
        return self.cluster.kill_node(busy[0])


def successor_steps(old: str, killed_at: float, timeout_s: float = 120.0) -> dict:
    """Seconds from a kill of the scheduler actor (incarnation ``old``) until its restart's
    process started, its scheduler was up and it had resumed the journal (``GET /v1/cluster``
    ``resumed``)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        info = client.cluster()
        if info["incarnation"] != old:
            r = info["resumed"]
            return {k: r[k] - killed_at for k in ("actor_started", "policy_loaded",
                                                    "scheduler_started", "at")}
        time.sleep(0.2)
    return {}


def scrape_metrics(until: int | None = None, timeout_s: float = 45.0,
                   worker: str | None = None, needs: tuple[str, ...] = ()) -> dict[str, float]:
    """The service's metrics as Ray's Prometheus endpoints serve them (every alive node's
    metrics export port, ``/metrics``), polled until the ``decisions`` counter reads ``until``
    (the service's own count) or stops changing, and every series in ``needs`` is there (Ray
    exports each metric on its own schedule); the last scrape (``{}`` if none) after
    ``timeout_s``. ``worker``: only the series of that replica process (``GET /v1/cluster``
    ``scheduler_worker_id``; earlier incarnations' series stay on the endpoints)."""
    import httpx
    import ray

    key = "ray_scale_scheduler_decisions_total"
    deadline, last = time.time() + timeout_s, None
    while time.time() < deadline:
        got: dict[str, float] = {}
        for n in ray.nodes():
            port = n.get("MetricsExportPort")
            if not n.get("Alive") or not port:
                continue
            try:
                text = httpx.get(f"http://{n['NodeManagerAddress']}:{port}/metrics",
                                 timeout=5).text
            except httpx.HTTPError:
                continue
            for k, v in parse_prometheus(text, worker=worker).items():
                got[k] = got.get(k, 0.0) + v
        if key in got and (got[key] == until or (until is None and got == last)) and all(
                k in got for k in needs):
            return got
        last = got
        time.sleep(2.0)
    return last or {}
