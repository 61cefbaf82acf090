"""The simulator's pending events: one queue (:class:`EventQueue`, the only place an event is
pushed) and their kinds in one enum (:class:`Kind`).

An event is the tuple ``(t, kind, seq, a, b)``: its time, its kind, a sequence number (events at
the same time and of the same kind are processed in the order they were pushed), and two
arguments whose meaning the kind gives (:class:`Kind`). The heap orders by time, then kind (the
enum's order: at equal times a run's end is seen before a failure, a failure before an arrival),
then sequence. Readers (the planners' fast rollouts, forks, snapshots) use :meth:`EventQueue.peek`
and :meth:`EventQueue.runs` instead of the tuple layout.

Stdlib only.
"""

from __future__ import annotations

import heapq
import math
from heapq import heappush
from enum import IntEnum
from typing import Any, Callable, Iterator

__all__ = ["Kind", "EventQueue", "FINISH", "FAIL", "REMOVE", "ADD", "ARRIVAL", "JOIN", "LEAVE",
           "HEDGE", "SIZE"]


class Kind(IntEnum):
    """Event kinds, in the order events at equal times are processed; ``a``, ``b`` for each."""
    FINISH = 0   # a run ends: a = the slot, b = (the run's token, the task)
    FAIL = 1     # a server fails: a = the scheduled event (or None: random), b = server id
    REMOVE = 2   # a server is removed (drains): as FAIL
    ADD = 3      # servers join: a = the scheduled event or a tier name, b = None, or a sizer's
    #              launch joining: a = its tier name, b = the launch's billing key
    ARRIVAL = 4  # the next workflow arrives: a = b = None
    JOIN = 5     # a random join (dynamics.join_rate_s): a = b = None
    LEAVE = 6    # a random leave (dynamics.leave_rate_s): a = b = None
    HEDGE = 7    # a hedgeable run passed its quantile: as FINISH
    SIZE = 8     # a sizer's turn (envs.sim_scaling): a = b = None


# plain names for the hot paths (an enum attribute lookup costs more than a global)
FINISH, FAIL, REMOVE, ADD = Kind.FINISH, Kind.FAIL, Kind.REMOVE, Kind.ADD
ARRIVAL, JOIN, LEAVE, HEDGE, SIZE = Kind.ARRIVAL, Kind.JOIN, Kind.LEAVE, Kind.HEDGE, Kind.SIZE


class EventQueue:
    """A heap of events (module docstring) and the sequence counter; ``heap`` is readable as a
    list for the hot paths (``heap[0][0]``, the next time), never pushed to but here."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple] = []
        self.seq = 0

    def push(self, t: float, kind: Kind, a: Any, b: Any) -> None:
        self.seq = seq = self.seq + 1
        heappush(self.heap, (t, kind, seq, a, b))

    def pop(self) -> tuple:
        """The next event ``(t, kind, seq, a, b)``."""
        return heapq.heappop(self.heap)

    def peek(self) -> float:
        """Time of the next event; ``inf`` when none is pending."""
        return self.heap[0][0] if self.heap else math.inf

    def __len__(self) -> int:
        return len(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)

    def __iter__(self) -> Iterator[tuple]:
        """The pending events, in heap order (not sorted)."""
        return iter(self.heap)

    def runs(self, kind: Kind = FINISH) -> Iterator[tuple[float, int, int, int, Any]]:
        """``(t, seq, slot, token, task)`` of each pending ``kind`` event of a run (FINISH or
        HEDGE), in heap order."""
        for t, k, seq, slot, (token, task) in (e for e in self.heap if e[1] == kind):
            yield t, seq, slot, token, task

    def kinds(self) -> set[Kind]:
        """The kinds pending."""
        return {Kind(e[1]) for e in self.heap}

    def copy(self, run: Callable[[tuple], tuple] | None = None,
             reorder: bool = False) -> "EventQueue":
        """An independent queue; ``run(event)`` replaces each FINISH and HEDGE event (a fork
        remaps their tasks); ``reorder``: it may also have moved their times."""
        out = EventQueue()
        out.seq = self.seq
        if run is None:
            out.heap = list(self.heap)
        else:
            out.heap = [run(e) if e[1] == FINISH or e[1] == HEDGE else e for e in self.heap]
            if reorder:
                heapq.heapify(out.heap)
        return out

    def drop(self, kind: Kind) -> int:
        """Remove every pending ``kind`` event; how many were removed."""
        keep = [e for e in self.heap if e[1] != kind]
        gone = len(self.heap) - len(keep)
        if gone:
            heapq.heapify(keep)
            self.heap = keep
        return gone
