"""`scale-ray bench backlog`: what one placement round costs when no server is free, against
the size of the ready set.

The scheduler service and the live library run a round of the decision core (``envs.decision``)
after every event; when the cluster is saturated every server is busy and the ready set only
grows. For each backlog size the bench builds a decision core with ``--servers`` busy servers
and that many ready tasks (memory drawn as in the paper's workload), then times ``--rounds``
rounds of :meth:`envs.decision.DecisionCore.run_round` followed by the requeue the caller's
clock move makes. The reference, in the same process: the round as it was before (each ready
task checked against the servers and deferred one by one), reimplemented here.

Printed per backlog: mean microseconds per round for the core and the reference, and their ratio.
Target: the core's cost does not grow with the backlog.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from pathlib import Path

import numpy as np

from envs.decision import READY, DecisionCore, Rules
from envs.demands import MEMORY, SLOT
from envs.encoding import ServerView, slot_table

BACKLOGS = (10, 20_000, 200_000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ready", nargs="+", type=int, default=list(BACKLOGS),
                   help="ready tasks queued (default: %(default)s)")
    p.add_argument("--servers", type=int, default=64, help="servers, all busy")
    p.add_argument("--rounds", type=int, default=50, help="timed rounds per backlog")
    p.add_argument("--json", default=None, help="write the numbers to this JSON file")


class _Task:
    __slots__ = ("id", "memory_gb", "demands", "state", "waits", "key")

    def __init__(self, tid: int, memory_gb: float, key: tuple):
        self.id, self.memory_gb, self.state, self.waits, self.key = tid, memory_gb, READY, 0, key
        self.demands = ((MEMORY, memory_gb), (SLOT, 1.0))


def _core(servers: int, ready: int, seed: int = 0) -> DecisionCore:
    rng = np.random.default_rng(seed)
    # every server busy (a run until 1e9 s): no server is free
    table = slot_table([ServerView(float(rng.choice([1.0, 2.0, 4.0])), 80.0, 1e9, 100.0)
                        for _ in range(servers)])
    core = DecisionCore(table, Rules(head_of_line_blocking=False, ask_only_startable=True,
                                     mask_infeasible=True))
    for t in range(ready):
        task = _Task(t, float(rng.uniform(0.5, 16.0)), (float(rng.integers(0, 5)), t * 0.01))
        core.queue.push(task.key, t, task)
    return core


def _never(_task) -> int:  # the policy is never asked when nothing is free
    raise AssertionError("asked with no free server")


def _walking_round(core: DecisionCore) -> None:
    """The reference: the round before the backlog fix (each task checked and deferred)."""
    q, srv = core.queue, core.table
    heap = q.heap
    while heap:
        task = heap[0][2]
        if task.state != READY:
            heapq.heappop(heap)
            continue
        if not srv.fits_somewhere(task.demands):
            core.forced_waits += 1
            q.deferred.append(heapq.heappop(heap))
            continue
        break
    for e in q.deferred:
        heapq.heappush(q.heap, e)
    q.deferred.clear()


def _time(fn, rounds: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - t0) / rounds * 1e6


def run(args: argparse.Namespace) -> int:
    for k in args.ready:
        if k < 0:
            raise ValueError(f"--ready: {k} must be >= 0")
    if args.servers < 1 or args.rounds < 1:
        raise ValueError("--servers and --rounds must be >= 1")
    print(f"one placement round with {args.servers} busy servers (no server free); "
          f"{args.rounds} rounds each")
    print(f"{'ready tasks':>12}{'core us/round':>15}{'reference us':>15}{'ratio':>9}")
    out = []
    for k in args.ready:
        core = _core(args.servers, k)

        def round_() -> None:
            core.run_round(_never, lambda t, s: None)
            core.queue.requeue_deferred()  # the caller's clock moves

        us = _time(round_, args.rounds)
        assert len(core.queue) == k, "the backlog must survive the round"
        ref = _core(args.servers, k)
        ref_rounds = max(1, min(args.rounds, 2_000_000 // max(k, 1)))  # keep the reference short
        ref_us = _time(lambda: _walking_round(ref), ref_rounds)
        out.append({"ready": k, "core_us": us, "reference_us": ref_us,
                    "ratio": ref_us / us if us else float("inf")})
        print(f"{k:>12}{us:>15.1f}{ref_us:>15.1f}{ref_us / us:>8.0f}x")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"servers": args.servers, "rounds": args.rounds,
                                               "results": out}, indent=2))
    return 0
