"""One agent process of ``scale-ray bench service``: a separate Ray driver that submits its share
of the workload to the scheduler service with :func:`scale_ray.client.submit`, at its arrival
times, then waits for every workflow and writes what it saw as JSON.

    python -m scale_ray.bench.service_client --address ADDR --input IN.json --output OUT.json

``IN.json``: ``{"time_scale": S, "workflows": [{"t": model s, "dag": live DAG record}]}``.
Workflows get emulated bodies. A start barrier: once connected (Ray and the service's handle)
the client writes ``OUT.json.ready`` and waits for ``IN.json.go``, which holds the wall-clock
start (``time.time()``) of every client: a client that started slowly (imports, Ray's driver
start on a busy machine) would otherwise submit its first workflows late, all at once.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from envs.loaders.livedag import parse_dag_workflow
from scale_ray import client


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--app", default=client.DEFAULT_APP)
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    import ray

    job = json.loads(Path(args.input).read_text())
    specs = [(w["t"], parse_dag_workflow(w["dag"], k, args.input))
             for k, w in enumerate(job["workflows"])]
    ray.init(address=args.address, log_to_driver=False)
    client.cluster(args.app)  # connect the handle before the clock starts
    start, ts = wait_for_start(args.input, args.output, args.timeout), job["time_scale"] or 1.0
    handles, out = [], []
    for tm, spec in specs:
        delay = start + tm * ts - time.time()
        if delay > 0:
            time.sleep(delay)
        handles.append(client.submit(spec, app=args.app))
    deadline = time.monotonic() + args.timeout
    for h in handles:
        rec = {"id": h.id, "submit_latency_s": h.submit_latency_s}
        try:
            ok = h.wait(max(1.0, deadline - time.monotonic()))
            rec.update(state=h.final_record["state"] if ok else "timeout", response_s=h.response_s,
                       error=h.final_record["error"] if ok else None)
        except client.WorkflowLost as e:
            rec.update(state="lost", response_s=None, error=str(e))
        out.append(rec)
    Path(args.output).write_text(json.dumps(out))
    ray.shutdown()
    return 0


def wait_for_start(inp: str, out: str, timeout_s: float) -> float:
    """Say this client is ready (``OUT.ready``), then wait for the start time in ``IN.go``."""
    Path(out + ".ready").write_text("ready")
    go = Path(inp + ".go")
    deadline = time.monotonic() + timeout_s
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{go}: no start time after {timeout_s:.0f} s")
        time.sleep(0.05)
    return float(go.read_text())


if __name__ == "__main__":
    raise SystemExit(main())
