"""`scale-ray bench serve`: the placement service over real HTTP on a local Ray, against the same
decisions made in process.

Starts Serve on 127.0.0.1 (a free port, access log off), deploys ``serve_apps.placement`` with
``--policy``, and measures with one keep-alive HTTP client (bodies serialised up front):

* ``/v1/place`` latency p50/p99 at N = 16, 48, 256, 1024 servers, one request at a time;
* ``/v1/place`` decisions per second with 32 requests in flight (asyncio client, N = 48);
* ``/v1/schedule`` decisions per second, 64 ready tasks per request (64 random-DAG workflows,
  128 idle servers), one request at a time; a decision is an assignment or a wait. The app runs
  without head-of-line blocking so every ready task gets a decision even when the policy waits
  (an untrained network often picks a server the task does not fit); half of these requests run
  one at a time (``schedule_decisions_per_s``), half with 4 in flight
  (``schedule_decisions_per_s_c4``);
* in process, in the same run: the whole ``/v1/place`` computation (server table, encoder,
  policy) per decision at N = 48 and 1024, and the policy alone on a ready observation.

Bodies are compact JSON with resource values rounded to 4 decimals, as a scheduler would send
them (a schedule body is about 46 kB, a place body at N = 48 about 5 kB, at N = 1024 about 107 kB).

``--requests`` is the number of measured HTTP requests, split 60% over the four latency sizes,
30% concurrent, 10% schedule; ``requests`` in the output also counts the warm-up requests
(20 per latency size, 32, 5). Every non-200 answer and every transport error, warm-up included,
counts in ``errors``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from envs.workload import make_source
from scale_ray.config import load_env
from scale_ray.ports import free_port
from serve_apps.decisions import decide, load, place, prepare_place
from serve_apps.schemas import PlaceRequest


log = logging.getLogger(__name__)

SIZES = (16, 48, 256, 1024)
CONCURRENCY = 32
SCHEDULE_TASKS = 64
SCHEDULE_SERVERS = 128
SCHEDULE_CONCURRENCY = 4  # a second /v1/schedule figure: several scheduler workers
WARMUP = 20
TIERS = ((1.0, 8.0, 30.0, 100.0, 2), (2.0, 32.0, 50.0, 200.0, 5), (4.0, 80.0, 80.0, 400.0, 1))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=2000,
                   help="measured HTTP requests in total (the acceptance run uses 10000)")
    p.add_argument("--policy", default="eft",
                   help="heuristic name, shipped artifact name or artifact directory")
    p.add_argument("--env-config", default=None, help="env YAML (default configs/env/paper.yaml)")
    p.add_argument("--port", type=int, default=0, help="HTTP port (0: a free one)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results to this JSON file")


# ------------------------------------------------------------------------------- request bodies
def _servers(n: int, rng: np.random.Generator, busy_share: float) -> list[dict]:
    ratio = np.array([t[4] for t in TIERS], dtype=float)
    tiers = rng.choice(len(TIERS), size=n, p=ratio / ratio.sum())
    out = []
    for i, k in enumerate(tiers):
        c, m, idle_w, busy_w, _ = TIERS[int(k)]
        busy = bool(rng.random() < busy_share)
        out.append({"id": f"node-{i}", "compute": c, "memory_gb": m,
                    "remaining_s": round(float(rng.exponential(2.0)), 4) if busy else 0.0,
                    "power_w": busy_w if busy else idle_w, "busy_power_w": busy_w})
    out[0].update(compute=4.0, memory_gb=80.0)  # every task fits somewhere
    return out


def place_body(n: int, rng: np.random.Generator) -> dict:
    servers = _servers(n, rng, busy_share=0.4)
    return {"task": {"compute_gflop": round(float(rng.uniform(1, 8)), 3),
                     "memory_gb": round(float(np.clip(rng.normal(8, 6), 0.5, 64)), 3),
                     "output_gb": round(float(rng.exponential(0.5)), 3),
                     "successors": int(rng.integers(0, 4)),
                     "completion_ratio": round(float(rng.uniform(0, 1)), 3),
                     "parent_server": f"node-{int(rng.integers(n))}",
                     "parent_output_gb": round(float(rng.exponential(0.5)), 3)},
            "servers": servers}


def schedule_body(rng: np.random.Generator, env) -> dict:
    """64 fresh workflows of the env's random DAG generator (one root each) on idle servers."""
    source = make_source(env.workload)
    workflows = []
    for w in range(SCHEDULE_TASKS):
        spec = source.next_workflow(rng)
        tasks = [{"id": i, "compute_gflop": round(t.compute_gflop, 4),
                  "memory_gb": round(t.memory_gb, 4), "output_gb": round(t.output_gb, 4),
                  "parents": list(t.parents)}
                 for i, t in enumerate(spec.tasks)]
        workflows.append({"id": w, "arrival_s": float(w), "tasks": tasks})
    return {"workflows": workflows, "servers": _servers(SCHEDULE_SERVERS, rng, busy_share=0.0)}


def _compact(body: dict) -> bytes:
    """Compact JSON, as a program (not a person) would send it."""
    return json.dumps(body, separators=(",", ":")).encode()


# ------------------------------------------------------------------------------- measurements
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class _Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.first_error: str | None = None

    def record(self, ok: bool, what: str = "") -> None:
        self.requests += 1
        if not ok:
            self.errors += 1
            self.first_error = self.first_error or what


def _checked(tally: _Tally, send) -> None:
    """An unmeasured (warm-up) request: still counted, and a failure is an error."""
    try:
        r = send()
        tally.record(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}")
    except Exception as e:  # noqa: BLE001
        tally.record(False, repr(e))


def _latency(client, bodies: list[bytes], count: int, tally: _Tally) -> list[float]:
    headers = {"content-type": "application/json"}
    for i in range(WARMUP):
        _checked(tally, lambda: client.post("/v1/place", content=bodies[i % len(bodies)], headers=headers))
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        try:
            r = client.post("/v1/place", content=bodies[i % len(bodies)], headers=headers)
            ok, what = r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
        except Exception as e:  # noqa: BLE001 - any transport failure is an error
            ok, what = False, repr(e)
        out.append((time.perf_counter() - t0) * 1e3)
        tally.record(ok, what)
    return out


def _decisions(ans: dict) -> int:
    """Policy decisions in a /v1/schedule answer: assignments and waits (not blocked tasks)."""
    return len(ans["assignments"]) + sum(1 for u in ans["unassigned"] if u["reason"] == "wait")


async def _concurrent(base_url: str, path: str, bodies: list[bytes], count: int, tally: _Tally,
                      concurrency: int) -> tuple[float, int]:
    """(requests per second, decisions) with ``concurrency`` requests in flight."""
    import httpx

    headers = {"content-type": "application/json"}
    decisions = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        async def worker(k: int, n: int) -> None:
            nonlocal decisions
            for i in range(n):
                try:
                    r = await client.post(path, content=bodies[(k + i) % len(bodies)], headers=headers)
                    ok = r.status_code == 200
                    if ok and path == "/v1/schedule":
                        decisions += _decisions(r.json())
                    elif ok:
                        decisions += 1
                    tally.record(ok, f"HTTP {r.status_code}: {r.text[:200]}")
                except Exception as e:  # noqa: BLE001
                    tally.record(False, repr(e))

        warm = await asyncio.gather(*(client.post(path, content=bodies[0], headers=headers)
                                      for _ in range(concurrency)), return_exceptions=True)
        for r in warm:  # warm the connections (they count as requests too)
            tally.record(getattr(r, "status_code", None) == 200, repr(r)[:200])
        share = [count // concurrency + (k < count % concurrency) for k in range(concurrency)]
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k, n) for k, n in enumerate(share)))
        return count / (time.perf_counter() - t0), decisions


def _schedule(client, bodies: list[bytes], count: int, tally: _Tally) -> tuple[float, float]:
    """(decisions per second, mean decisions per request)."""
    headers = {"content-type": "application/json"}
    for i in range(min(WARMUP, 5)):
        _checked(tally, lambda: client.post("/v1/schedule", content=bodies[i % len(bodies)],
                                            headers=headers))
    decisions = 0
    t0 = time.perf_counter()
    for i in range(count):
        try:
            r = client.post("/v1/schedule", content=bodies[i % len(bodies)], headers=headers)
            ok = r.status_code == 200
            if ok:
                decisions += _decisions(r.json())
            tally.record(ok, f"HTTP {r.status_code}: {r.text[:200]}")
        except Exception as e:  # noqa: BLE001
            tally.record(False, repr(e))
    wall = time.perf_counter() - t0
    return decisions / wall, decisions / max(1, count)


def _in_process(lp, bodies: dict[int, list[dict]], seconds: float = 1.0) -> dict[str, Any]:
    """Per-decision ms in process: the full /v1/place computation and the policy alone."""
    full, policy_only = {}, {}
    for n, raw in bodies.items():
        reqs = [PlaceRequest.model_validate(b) for b in raw]
        obs = [prepare_place(r, lp, 1 << 30).obs for r in reqs]
        for label, fn, items in (("full", lambda r: place(r, lp, 1 << 30), reqs),
                                 ("policy", lambda o: decide(lp, o), obs)):
            for it in items[:5]:
                fn(it)
            k, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fn(items[k % len(items)])
                k += 1
            ms = (time.perf_counter() - t0) / k * 1e3
            (full if label == "full" else policy_only)[str(n)] = ms
    return {"inprocess_ms": full, "inprocess_policy_ms": policy_only}


# ------------------------------------------------------------------------------- driver
def run(args: argparse.Namespace) -> int:
    if args.requests < 100:
        raise ValueError(f"--requests: {args.requests} must be >= 100")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = load_env(args.env_config)
    lp = load(args.policy, env)  # fails fast on a bad --policy, before Ray starts
    rng = np.random.default_rng(args.seed)
    place_bodies = {n: [place_body(n, rng) for _ in range(16)] for n in SIZES}
    raw = {n: [_compact(b) for b in bs] for n, bs in place_bodies.items()}
    sched_raw = [_compact(schedule_body(rng, env)) for _ in range(8)]
    n_lat = int(args.requests * 0.6) // len(SIZES)
    n_conc = int(args.requests * 0.3)
    n_sched = args.requests - n_lat * len(SIZES) - n_conc
    tally = _Tally()
    latency, dps, sched_dps, per_req, sched_dps_c4 = _through_serve(
        args, lp, raw, sched_raw, (n_lat, n_conc, n_sched), tally)
    print("  in process", file=sys.stderr)
    try:  # the same torch threading as a replica (PlacementArgs.torch_threads)
        from policies.artifact import set_inference_threads
        set_inference_threads(1)
    except ImportError:
        pass
    inproc = _in_process(lp, {48: place_bodies[48], 1024: place_bodies[1024]})
    result = {
        "policy": lp.info["name"], "policy_version": lp.info["version"],
        "latency_ms": latency, "decisions_per_s_c32": dps,
        "schedule_decisions_per_s": sched_dps, "schedule_decisions_per_request": per_req,
        f"schedule_decisions_per_s_c{SCHEDULE_CONCURRENCY}": sched_dps_c4,
        "schedule_servers": SCHEDULE_SERVERS, **inproc,
        "requests": tally.requests, "errors": tally.errors, "first_error": tally.first_error,
        "cpus": os.cpu_count(),
    }
    print(format_result(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if tally.errors == 0 else 1


def format_result(r: dict) -> str:
    lines = [f"policy {r['policy']} ({r['policy_version']}), {r['requests']} requests, "
             f"{r['errors']} errors, {r['cpus']} CPUs"]
    lines.append(f"{'N':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for n, v in r["latency_ms"].items():
        lines.append(f"{n:>6} {v['p50']:>8.2f} {v['p99']:>8.2f} {v['mean']:>8.2f}")
    ip, pol = r["inprocess_ms"], r["inprocess_policy_ms"]
    for n in ip:
        http = r["latency_ms"].get(n, {}).get("p50")
        ratio = f"; HTTP p50 / in-process = {http / ip[n]:.0f}x" if http else ""
        lines.append(f"in process N={n}: {ip[n]:.3f} ms per decision (policy alone "
                     f"{pol[n]:.3f} ms){ratio}")
    lines.append(f"/v1/place at concurrency {CONCURRENCY}: {r['decisions_per_s_c32']:.0f} decisions/s")
    lines.append(f"/v1/schedule ({SCHEDULE_TASKS} tasks/request, {r['schedule_servers']} servers): "
                 f"{r['schedule_decisions_per_s']:.0f} decisions/s "
                 f"({r['schedule_decisions_per_request']:.1f} decisions/request); with "
                 f"{SCHEDULE_CONCURRENCY} in flight "
                 f"{r.get(f'schedule_decisions_per_s_c{SCHEDULE_CONCURRENCY}', float('nan')):.0f}")
    if r["errors"]:
        lines.append(f"first error: {r['first_error']}")
    return "\n".join(lines)


__all__ = ["add_arguments", "run", "place_body", "schedule_body", "format_result"]


def _through_serve(args: argparse.Namespace, lp, raw: dict, sched_raw: list,
                   counts: tuple[int, int, int], tally: "_Tally"):
    """Ray + Serve on a private local cluster: /v1/place latency per N, /v1/place with
    CONCURRENCY in flight, /v1/schedule alone and with SCHEDULE_CONCURRENCY in flight."""
    import httpx
    import ray
    from ray import serve

    from serve_apps.placement import application

    n_lat, n_conc, n_sched = counts
    port = args.port or free_port()
    temp = tempfile.mkdtemp(prefix="scale-bench-serve-", dir="/tmp")
    print(f"starting Ray + Serve on 127.0.0.1:{port} (policy {lp.info['name']} "
          f"{lp.info['version']})", file=sys.stderr)
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, _temp_dir=temp,
             logging_level=logging.WARNING, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = application({"policy": args.policy, "env_config": args.env_config,
                           "head_of_line_blocking": False,
                           "tuning": {"max_servers": 4096, "max_tasks": 4096}},
                          logging_config={"enable_access_log": False, "log_level": "WARNING"})
        serve.run(app, name="placement", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        latency: dict[str, dict[str, float]] = {}
        with httpx.Client(base_url=base, timeout=60) as client:
            for n in SIZES:
                print(f"  /v1/place latency, N={n}: {n_lat} requests", file=sys.stderr)
                ms = _latency(client, raw[n], n_lat, tally)
                latency[str(n)] = {"p50": _pct(ms, 50), "p99": _pct(ms, 99), "mean": float(np.mean(ms))}
            print(f"  /v1/place, {CONCURRENCY} in flight: {n_conc} requests", file=sys.stderr)
            dps, _ = asyncio.run(_concurrent(base, "/v1/place", raw[48], n_conc, tally, CONCURRENCY))
            print(f"  /v1/schedule, {SCHEDULE_TASKS} tasks each: {n_sched} requests", file=sys.stderr)
            sched_dps, per_req = _schedule(client, sched_raw, n_sched // 2, tally)
            rps4, dec4 = asyncio.run(_concurrent(base, "/v1/schedule", sched_raw, n_sched - n_sched // 2,
                                                 tally, SCHEDULE_CONCURRENCY))
            sched_dps_c4 = rps4 * dec4 / (n_sched - n_sched // 2)
    finally:
        serve.shutdown()
        ray.shutdown()
    return latency, dps, sched_dps, per_req, sched_dps_c4
