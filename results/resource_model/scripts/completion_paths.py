"""Two ways for a driver to learn that its runs ended, K runs in flight (an async actor holds K
calls that end at random times over ~2 s; local Ray, its own temp dir): the live scheduler's
(``ray.wait(num_returns=1)`` over every run in flight, then ``ray.get``) and completion
callbacks (``ObjectRef.future()`` feeding a queue the thread reads, then ``ray.get``). CPU a
completion: the waiting thread's, and the whole driver process's (Ray's callback threads
included), medians of 3 alternated rounds. An experiment script
(results/resource_model/README.md), ~2 min:

    RAY_TMPDIR=$(mktemp -d) python results/resource_model/scripts/completion_paths.py 64 400 1000
"""
import asyncio
import queue
import random
import statistics
import sys
import tempfile
import time

import ray


@ray.remote(max_concurrency=10000)
class Holder:
    async def hold(self, s: float) -> float:
        await asyncio.sleep(s)
        return s

    def ready(self) -> int:
        return 1


def by_wait(refs: list) -> None:
    running = set(refs)
    while running:
        done, _ = ray.wait(list(running), num_returns=1, timeout=10, fetch_local=False)
        for r in done:
            ray.get(r)
            running.discard(r)


def by_callback(refs: list) -> None:
    q: queue.SimpleQueue = queue.SimpleQueue()
    for r in refs:
        r.future().add_done_callback(lambda _f, r=r: q.put(r))
    for _ in refs:
        ray.get(q.get(timeout=10))


def one(h, k: int, how) -> tuple[float, float]:
    rng = random.Random(k)
    refs = [h.hold.remote(0.5 + 2.0 * rng.random()) for _ in range(k)]
    t, p = time.thread_time(), time.process_time()
    how(refs)
    return (time.thread_time() - t) / k * 1e3, (time.process_time() - p) / k * 1e3


if __name__ == "__main__":
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="cp_", dir="/tmp"))
    h = Holder.remote()
    ray.get(h.ready.remote())
    for k in [int(a) for a in sys.argv[1:]] or [64, 400, 1000]:
        got: dict = {"wait": [], "callback": []}
        for _ in range(3):
            for name, how in (("wait", by_wait), ("callback", by_callback)):
                got[name].append(one(h, k, how))
        line = [f"K = {k:>4}:"]
        for name, xs in got.items():
            th = statistics.median(x[0] for x in xs)
            pr = statistics.median(x[1] for x in xs)
            line.append(f"{name} thread {th:.3f} / process {pr:.3f} ms a completion;")
        print(" ".join(line), flush=True)
    ray.shutdown()
