"""The scheduler thread's CPU in Ray's client calls, apart from its own work.

``LiveScheduler.summary()`` has ``thread_cpu_s`` (all of the thread's CPU) and, inside it,
``ray_client_cpu_s``: the CPU of the calls any Ray driver makes for the same tasks — a run's
submission (``.options(...).remote()``), ``ray.wait`` and ``ray.get`` of returned runs, and
``ray.nodes()`` when the node set is read. The difference is the scheduler's own work (the
decision core, the node table, admission, completions). ``scale-ray bench live --setting
agents`` prints both per task (docs/benchmarks.md)."""

from __future__ import annotations

import time
from typing import Any

COUNTER = "ray_client_cpu_s"


class RayCalls:
    """``with meter: <one Ray client call>`` adds the thread CPU it took to
    ``counters[COUNTER]``. Not reentrant: wrap leaf calls only."""

    __slots__ = ("counters", "_c0")

    def __init__(self, counters: dict[str, Any]):
        self.counters = counters
        counters.setdefault(COUNTER, 0.0)
        self._c0 = 0.0

    def __enter__(self) -> None:
        self._c0 = time.thread_time()

    def __exit__(self, *exc: Any) -> None:
        self.counters[COUNTER] += time.thread_time() - self._c0
