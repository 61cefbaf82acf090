"""`scale-ray bench service --http-doors 1 2`: the scheduler service's HTTP throughput with 1 and
2 doors (Serve replicas in front of the one scheduler actor; docs/serving.md, "One writer, many
doors").

On a local multi-node cluster (``--nodes`` servers) the service is deployed once per doors count
(``time_scale`` 0: emulated runs take no time, so the scheduler is not the limit of a task's
life). An asyncio client keeps ``--http-concurrency`` requests in flight and sends, per doors
count, ``--http-requests`` of each kind after a warm-up of 50:

* ``POST /v1/workflows``: a one-task emulated workflow (authenticated, parsed, journaled,
  placed);
* ``GET /v1/workflows/{id}?result=false``: a record of one of those workflows.

JSON keys per doors count (``doors``: a list): ``post_per_s``, ``get_per_s``, ``post_p50_ms``,
``post_p99_ms``, ``get_p50_ms``, ``get_p99_ms``, ``errors``; and ``post_ratio``, ``get_ratio``
(the last doors count over the first). On a machine with few cores the doors and the actor share
them: the ratio says what a second door buys *there*.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from scale_ray.config import load_env
from scale_ray.live.cluster import LocalHeteroCluster

from .localservice import LocalService

log = logging.getLogger(__name__)
WARM_UP = 50


async def _drive(url: str, method: str, paths: list[str], body: dict | None,
                 concurrency: int) -> tuple[list[float], list[Any], int]:
    """Every path once, ``concurrency`` in flight: latencies (s), the JSON answers, errors."""
    import httpx

    lat: list[float] = []
    answers: list[Any] = [None] * len(paths)
    errors = 0
    queue: asyncio.Queue = asyncio.Queue()
    for i, p in enumerate(paths):
        queue.put_nowait((i, p))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        async def worker() -> None:
            nonlocal errors
            while not queue.empty():
                i, p = queue.get_nowait()
                t = time.perf_counter()
                try:
                    r = await http.request(method, p, json=body)
                except httpx.HTTPError:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t)
                if r.status_code >= 300:
                    errors += 1
                else:
                    answers[i] = r.json()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, answers, errors


def _measure(url: str, requests: int, concurrency: int) -> dict[str, Any]:
    doc = {"name": "one", "tasks": [{"name": "a", "compute_gflop": 1.0}]}
    out: dict[str, Any] = {"errors": 0}
    asyncio.run(_drive(url, "POST", ["/v1/workflows"] * WARM_UP, doc, concurrency))
    t = time.perf_counter()
    lat, answers, err = asyncio.run(_drive(url, "POST", ["/v1/workflows"] * requests, doc,
                                           concurrency))
    wall = time.perf_counter() - t
    out["errors"] += err
    out.update(post_per_s=len(lat) / wall, post_p50_ms=1e3 * float(np.percentile(lat, 50)),
               post_p99_ms=1e3 * float(np.percentile(lat, 99)))
    ids = [a["id"] for a in answers if a]
    paths = [f"/v1/workflows/{ids[i % len(ids)]}?result=false" for i in range(requests)]
    t = time.perf_counter()
    lat, _, err = asyncio.run(_drive(url, "GET", paths, None, concurrency))
    wall = time.perf_counter() - t
    out["errors"] += err
    out.update(get_per_s=len(lat) / wall, get_p50_ms=1e3 * float(np.percentile(lat, 50)),
               get_p99_ms=1e3 * float(np.percentile(lat, 99)))
    return out


def run(args: argparse.Namespace) -> int:
    counts = list(args.http_doors)
    if not counts or any(not 1 <= d <= 16 for d in counts):
        raise ValueError(f"--http-doors: door counts in [1, 16], got {counts}")
    if not 1 <= args.http_concurrency <= 1000 or args.http_requests < 10:
        raise ValueError("--http-concurrency in [1, 1000] and --http-requests >= 10")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = load_env(args.env_config, [], servers=args.nodes)
    out: dict[str, Any] = {"servers": env.cluster.servers, "policy": args.policy,
                           "concurrency": args.http_concurrency,
                           "requests": args.http_requests, "doors": []}
    t0 = time.perf_counter()
    with LocalHeteroCluster(env.cluster, args.servers_per_node) as cluster:
        svc = LocalService(cluster, {"policy": args.policy, "env_config": args.env_config,
                                     "live": {"time_scale": 0.0}})
        svc.start()
        try:
            for d in counts:
                svc.deploy(num_replicas=d)  # (idle servers' actors are reaped: the
                # warm-up's workflows start them again)
                row = {"doors": d, **_measure(svc.url, args.http_requests,
                                              args.http_concurrency)}
                out["doors"].append(row)
                print(f"{d} door(s): POST {row['post_per_s']:.0f}/s (p50 "
                      f"{row['post_p50_ms']:.1f} ms, p99 {row['post_p99_ms']:.1f} ms), GET "
                      f"{row['get_per_s']:.0f}/s (p50 {row['get_p50_ms']:.1f} ms, p99 "
                      f"{row['get_p99_ms']:.1f} ms), errors {row['errors']}", flush=True)
        finally:
            svc.stop()
    first, last = out["doors"][0], out["doors"][-1]
    out["post_ratio"] = last["post_per_s"] / first["post_per_s"]
    out["get_ratio"] = last["get_per_s"] / first["get_per_s"]
    out["wall_s"] = time.perf_counter() - t0
    print(f"{last['doors']} vs {first['doors']} door(s): POST x{out['post_ratio']:.2f}, GET "
          f"x{out['get_ratio']:.2f} ({args.http_concurrency} in flight, {args.http_requests} "
          f"requests each)", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if all(r["errors"] == 0 for r in out["doors"]) else 1
