"""``scale-ray cluster up|down|status``: a local heterogeneous Ray cluster to try the scheduler.

``up`` starts a detached process (``python -m scale_ray.live.localcluster STATE``) that holds a
:class:`~scale_ray.live.cluster.LocalHeteroCluster`: a head without CPUs and one raylet per
``servers_per_node`` servers of each tier, advertising the ``scale_*`` resources, under its own
temp dir and with token authentication (a fresh token unless ``RAY_AUTH_TOKEN`` is set). Once the
cluster is up the process writes the state file (address, token, temp dir, the PIDs of every
process it started) and waits; ``up`` prints how to connect. ``down`` asks that process to stop
its cluster (SIGTERM), then kills, by PID, whatever of ours is still alive: only what ``up``
started, never anything else. ``status`` says whether it runs.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from envs.config import ClusterConfig, ConfigError, TierConfig

from .cluster import LocalHeteroCluster
from .raylocal import AUTH_MODE_VAR, AUTH_TOKEN_VAR, pid_alive

DEFAULT_TIERS = "small:2,medium:4,large:2"
__all__ = ["parse_tiers", "default_state_path", "up", "down", "status", "DEFAULT_TIERS"]


def default_state_path() -> Path:
    """``~/.scale_ray/cluster.json``."""
    return Path.home() / ".scale_ray" / "cluster.json"


def parse_tiers(spec: str, cluster: ClusterConfig) -> ClusterConfig:
    """``small:4,medium:8,large:2`` -> ``cluster`` with those server counts (tiers named in the
    env config; capacities from it)."""
    counts: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, n = item.partition(":")
        if not sep or not n.strip().isdigit():
            raise ConfigError(f"--tiers: expected NAME:COUNT[,NAME:COUNT...], got {item!r}")
        known = [t.name for t in cluster.tiers]
        if name not in known:
            raise ConfigError(f"--tiers: unknown tier {name!r}; the env config has {known}")
        counts[name] = int(n)
    if not counts or sum(counts.values()) < 1:
        raise ConfigError(f"--tiers: {spec!r} names no server")
    if sum(counts.values()) > 256:
        raise ConfigError(f"--tiers: {sum(counts.values())} servers; at most 256 on one machine")
    tiers = tuple(replace(t, count=counts.get(t.name, 0)) for t in cluster.tiers)
    return replace(cluster, tiers=tiers, servers=sum(counts.values()))


def _pids(cluster: LocalHeteroCluster) -> list[int]:
    """PIDs of every Ray process the cluster started (head and server nodes)."""
    c = cluster.ray_cluster
    nodes = [c.head_node, *c.worker_nodes] if c is not None else []
    out = []
    for node in nodes:
        for infos in getattr(node, "all_processes", {}).values():
            for info in infos:
                proc = getattr(info, "process", None)
                if proc is not None and proc.pid:
                    out.append(int(proc.pid))
    return out


def _serve(state: Path, spec: dict[str, Any]) -> int:
    """The detached process: start the cluster, write the state file, wait for SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster_cfg = ClusterConfig(**{**spec["cluster"], "tiers": tuple(
        _tier(t) for t in spec["cluster"]["tiers"])})
    lc = LocalHeteroCluster(cluster_cfg, spec["servers_per_node"], temp_dir=spec["temp_dir"])
    t0 = time.perf_counter()
    try:
        lc.start(connect=False)
        info = {"address": lc.address, "token": os.environ.get(AUTH_TOKEN_VAR, ""),
                "temp_dir": lc.temp_dir, "pid": os.getpid(), "pids": _pids(lc),
                "servers": {t.name: t.count for t in cluster_cfg.tiers if t.count},
                "nodes": len(lc.nodes), "servers_per_node": spec["servers_per_node"],
                "started_s": round(time.perf_counter() - t0, 1)}
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(state)
        while not stop.wait(1.0):
            pass
    finally:
        lc.shutdown()
        try:
            if json.loads(state.read_text()).get("pid") == os.getpid():
                state.unlink()
        except (OSError, ValueError):
            pass
    return 0


def _tier(d: dict[str, Any]) -> TierConfig:
    return TierConfig(**d)


def status(state: Path) -> dict[str, Any] | None:
    """The state of the cluster ``up`` started (None: none runs)."""
    try:
        info = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    return info if pid_alive(int(info.get("pid", 0) or 0)) else None


def up(cluster: ClusterConfig, servers_per_node: int, state: Path, timeout_s: float = 180.0,
       log_path: Path | None = None) -> dict[str, Any]:
    """Start the cluster in a detached process and wait until it is up; its state (address,
    token, ...). Raises RuntimeError when one already runs or the start fails (with its log)."""
    if status(state) is not None:
        raise RuntimeError(f"a cluster started by `scale-ray cluster up` already runs "
                           f"(state {state}); `scale-ray cluster down` first")
    state.parent.mkdir(parents=True, exist_ok=True)
    state.unlink(missing_ok=True)
    temp_dir = tempfile.mkdtemp(prefix="scl_", dir="/tmp")  # short: Ray's socket paths
    env = dict(os.environ)
    env[AUTH_MODE_VAR] = "token"
    env.setdefault(AUTH_TOKEN_VAR, secrets.token_hex(32))
    spec = {"cluster": {"servers": cluster.servers, "bandwidth_gb_s": cluster.bandwidth_gb_s,
                        "latency_s": cluster.latency_s,
                        "tiers": [asdict(t) for t in cluster.tiers]},
            "servers_per_node": servers_per_node, "temp_dir": temp_dir}
    log_path = log_path or state.with_suffix(".log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "scale_ray.live.localcluster", str(state),
                                 json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = status(state)
        if info is not None and info.get("pid") == proc.pid:
            info["log"] = str(log_path)
            return info
        if proc.poll() is not None:
            tail = log_path.read_text()[-3000:]
            raise RuntimeError(f"the cluster process exited ({proc.returncode}) before the "
                               f"cluster was up; its log ({log_path}):\n{tail}")
        time.sleep(0.3)
    proc.terminate()
    raise RuntimeError(f"the cluster was not up after {timeout_s:g} s; log: {log_path}")


def down(state: Path, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """Stop the cluster ``up`` started (None when none runs): SIGTERM to its process, which
    shuts its Ray processes down; any of their PIDs still alive after that are killed."""
    try:
        info = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    pid = int(info.get("pid", 0) or 0)
    if pid and pid_alive(pid, reap=True):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid, reap=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid, reap=True):
            os.kill(pid, signal.SIGKILL)
    killed = 0
    for p in info.get("pids", []):
        if pid_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    state.unlink(missing_ok=True)
    info["killed_leftovers"] = killed
    return info


if __name__ == "__main__":  # the detached process of `up`
    sys.exit(_serve(Path(sys.argv[1]), json.loads(sys.argv[2])))
