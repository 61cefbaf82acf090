"""A test agent: a separate Ray driver that submits diamond workflows of *its own* primitives
(defined here, in ``__main__``: they reach the scheduler service by value) and prints, as JSON,
each workflow's state, response time and the runs its tasks recorded (node, start, end).

    python tests/service_agent.py ADDRESS WORKFLOWS SLEEP_S OUT.json
"""

import json
import sys
import time
import uuid

import ray

from scale_ray import client
from scale_ray.live import primitive


@primitive(compute_gflop=2.0, memory_gb=1.0)
def step(sleep_s, *parents):
    """Sleep, then return every run recorded so far on this branch plus this one."""
    t0 = time.time()
    time.sleep(sleep_s)
    runs = [r for p in parents for r in p]
    runs.append({"node": ray.get_runtime_context().get_node_id(), "start": t0, "end": time.time(),
                 "run": uuid.uuid4().hex})
    return runs


def main() -> None:
    address, count, sleep_s, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    ray.init(address=address, log_to_driver=False)
    handles = []
    for _ in range(count):
        a = step.bind(sleep_s)
        d = step.bind(sleep_s, step.bind(sleep_s, a), step.bind(sleep_s, a))
        handles.append(client.submit(d, "diamond"))
    res = []
    for h in handles:
        try:
            runs = h.result(timeout=300)
            res.append({"id": h.id, "state": "completed", "response_s": h.response_s,
                        "runs": list({r["run"]: r for r in runs}.values())})
        except Exception as e:  # noqa: BLE001 - reported to the test
            res.append({"id": h.id, "state": "error", "error": f"{type(e).__name__}: {e}"})
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
