"""envs.events: the simulator's one event queue and its kinds."""
from __future__ import annotations

import math

from envs.events import ARRIVAL, FAIL, FINISH, HEDGE, EventQueue, Kind


class _Task:
    def __init__(self, i):
        self.id = i


def test_events_come_out_by_time_then_kind_then_push_order():
    q = EventQueue()
    assert q.peek() == math.inf and not q
    q.push(2.0, ARRIVAL, None, None)
    q.push(1.0, ARRIVAL, None, None)
    q.push(1.0, FAIL, None, 3)
    q.push(1.0, FINISH, 0, (1, _Task(0)))
    q.push(1.0, FINISH, 1, (1, _Task(1)))
    assert q.peek() == 1.0 and len(q) == 5 and q.seq == 5
    out = [q.pop() for _ in range(5)]
    assert [(e[0], e[1], e[3]) for e in out] == [
        (1.0, FINISH, 0), (1.0, FINISH, 1), (1.0, FAIL, None), (1.0, ARRIVAL, None),
        (2.0, ARRIVAL, None)]
    assert list(Kind) == sorted(Kind) and Kind.FINISH == 0 and Kind.HEDGE == 7


def test_runs_drop_and_copies_are_independent():
    q = EventQueue()
    a, b = _Task(0), _Task(1)
    q.push(3.0, FINISH, 2, (7, a))
    q.push(1.0, HEDGE, 2, (7, a))
    q.push(2.0, FINISH, 4, (1, b))
    q.push(0.5, ARRIVAL, None, None)
    assert sorted(q.runs()) == [(2.0, 3, 4, 1, b), (3.0, 1, 2, 7, a)]
    assert [r[4] for r in q.runs(HEDGE)] == [a]
    assert q.kinds() == {FINISH, HEDGE, ARRIVAL}
    c = q.copy(lambda e: (e[0] - 2.5 if e[1] == FINISH else e[0], *e[1:]), reorder=True)
    assert c.peek() == -0.5 and q.peek() == 0.5  # the copy moved, the original did not
    assert q.drop(ARRIVAL) == 1 and q.peek() == 1.0 and c.kinds() == {FINISH, HEDGE, ARRIVAL}
    c.push(0.0, ARRIVAL, None, None)
    assert c.seq == 5 and q.seq == 4
