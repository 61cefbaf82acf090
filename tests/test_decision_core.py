"""The decision core (envs.decision): the ready order, the rules of a placement round and the
observation, through its public methods. The simulator, Serve's /v1/schedule and the live
scheduler all drive this one core, so these tests cover the rules for all three."""
from __future__ import annotations

import numpy as np
import pytest

from envs.config import FeatureConfig
from envs.decision import DONE, EMPTY, HOL_WAIT, READY, DecisionCore, ReadyQueue, Rules
from envs.demands import Request
from envs.encoding import PaperEncoder, ServerView, TaskFacts, TaskView, encode, slot_table
from envs.nodes import NodeTable


class T:
    """A task as the core sees it."""

    def __init__(self, tid: int, memory_gb: float = 1.0, key: tuple = (0,)):
        self.id, self.memory_gb, self.key = tid, memory_gb, key
        self.state, self.waits = READY, 0
        self.demands = Request(memory_gb=memory_gb).on_slot()


def table(memory: list[float], busy: list[bool] | None = None,
          accepting: list[bool] | None = None) -> NodeTable:
    """Servers of one slot (compute 10, power 100 idle / 200 busy); a busy one runs 5 s more."""
    n = len(memory)
    busy = busy or [False] * n
    accepting = [True] * n if accepting is None else accepting
    return slot_table([ServerView(10.0, m, 5.0 if b else 0.0, 200.0 if b else 100.0, a, 200.0)
                       for m, b, a in zip(memory, busy, accepting)])


def core_with(tasks: list[T], st: NodeTable, **rules) -> DecisionCore:
    core = DecisionCore(st, Rules(**rules))
    for t in tasks:
        core.queue.push(t.key, t.id, t)
    return core


def test_queue_orders_by_key_then_tie_and_drops_stale_tasks():
    q = ReadyQueue()
    a, b, c = T(0, key=(-2, 1.0)), T(1, key=(-3, 5.0)), T(2, key=(-2, 0.5))
    for t in (a, b, c):
        q.push(t.key, t.id, t)
    core = DecisionCore(table([8.0]), Rules())
    core.queue = q
    b.state = DONE  # finished elsewhere: dropped when it reaches the top
    task, why = core.next_task()
    assert task is c and why == EMPTY
    assert q.ready_count(c.id) == 2  # c and a; the stale b is not counted


def test_a_task_that_fits_no_accepting_server_is_blocked_until_the_server_set_changes():
    st = table([4.0, 16.0], accepting=[True, False])
    big, small = T(0, memory_gb=8.0, key=(-1,)), T(1, memory_gb=2.0, key=(0,))
    core = core_with([big, small], st)
    task, _ = core.next_task()
    assert task is small and [e[2] for e in core.queue.blocked] == [big]
    st.set_accepting(1, True)
    core.queue.requeue_blocked()
    assert core.next_task()[0] is big


def test_ask_only_startable_waits_without_asking_with_and_without_head_of_line_blocking():
    st = table([4.0, 16.0], busy=[False, True])
    big, small = T(0, memory_gb=8.0, key=(-1,)), T(1, memory_gb=2.0, key=(0,))
    hol = core_with([big, small], st, head_of_line_blocking=True, ask_only_startable=True)
    assert hol.next_task() == (None, HOL_WAIT) and hol.forced_waits == 1
    free = core_with([T(0, 8.0, (-1,)), small], table([4.0, 16.0], busy=[False, True]),
                     head_of_line_blocking=False, ask_only_startable=True)
    task, _ = free.next_task()
    assert task is small and free.forced_waits == 1 and len(free.queue.deferred) == 1
    asked = core_with([T(0, 8.0)], table([4.0, 16.0], busy=[False, True]))
    assert asked.next_task()[0] is not None  # the switch off: the policy is asked


@pytest.mark.parametrize("hol", [True, False])
def test_a_pick_is_valid_only_when_accepting_idle_and_fitting(hol):
    st = table([4.0, 16.0, 16.0], busy=[False, True, False], accepting=[True, True, False])
    t = T(0, memory_gb=8.0)
    core = core_with([t], st, head_of_line_blocking=hol)
    for slot in (0, 1, 2, 3, -1):  # too small, busy, draining, out of range
        assert core.next_task()[0] is t
        assert core.resolve(t, slot) is False
        core.queue.requeue_deferred()
    assert t.waits == 5 == core.waits and core.decisions == 5
    st2 = table([4.0, 16.0])
    t2 = T(1, memory_gb=8.0)
    core2 = core_with([t2], st2, head_of_line_blocking=hol)
    assert core2.next_task()[0] is t2 and core2.resolve(t2, 1) is True
    assert len(core2.queue) == 0 and t2.waits == 0


def test_a_round_without_blocking_defers_a_wait_and_places_the_tasks_behind_it():
    st = table([16.0, 16.0, 16.0])
    tasks = [T(i, key=(-i,)) for i in range(3)]  # order: 2, 1, 0
    core = core_with(tasks, st, head_of_line_blocking=False)
    picks = {2: 5, 1: 0, 0: 1}  # task 2 picks a slot that does not exist: a wait
    started, waited = [], []

    def start(t, slot):
        started.append((t.id, slot))
        st.start(slot, t, t.demands, 3.0)

    core.run_round(lambda t: picks[t.id], start, lambda t, why: waited.append((t.id, why)))
    assert started == [(1, 0), (0, 1)] and waited == [(2, "wait")]
    assert st.busy.tolist() == [True, True, False] and not core.queue.deferred  # requeued
    assert core.next_task()[0] is tasks[2]


def test_a_round_with_head_of_line_blocking_stops_at_the_first_wait():
    st = table([16.0, 16.0])
    tasks = [T(i, key=(i,)) for i in range(3)]
    core = core_with(tasks, st, head_of_line_blocking=True)
    started, waited = [], []

    def start(t, slot):
        started.append(t.id)
        st.start(slot, t, t.demands, 1.0)

    core.run_round(lambda t: 0, start, lambda t, why: waited.append((t.id, why)))
    # task 0 starts on slot 0; task 1 picks the now busy slot 0: it waits, task 2 is blocked
    assert started == [0] and waited == [(1, "wait"), (2, "blocked")] and tasks[1].waits == 1


def _paper_reference(task: TaskView, servers: list[ServerView], f: FeatureConfig,
                     transfer_s: float, masked: bool) -> dict[str, np.ndarray]:
    """The paper observation written out from DESIGN's formulas (docs/simulator.md), one node
    at a time in float64 then cast: the encoder's vectorised float32 path must match it."""
    c = f.clip

    def clip(v: float) -> float:
        return min(max(v, 0.0), c)

    vec = [clip(task.compute_gflop / f.compute_unit), clip(task.memory_gb / f.memory_gb),
           clip(task.successors / f.successors), clip(task.completion_ratio),
           clip(task.output_gb / f.output_gb)]
    rows, mask = [], []
    for k, s in enumerate(servers):
        transfer = 0.0 if k == task.parent_server else clip(transfer_s / f.transfer_s)
        rows.append([clip(s.compute / f.server_compute), clip(s.memory_gb / f.server_memory_gb),
                     clip(np.float32(s.remaining_s) / np.float32(f.time_unit)),
                     clip(s.power_w / f.power_w), transfer])
        mask.append(float(s.accepting and (not masked or s.memory_gb >= task.memory_gb)))
    return {"task": np.array(vec, np.float32), "servers": np.array(rows, np.float32),
            "action_mask": np.array(mask, np.float32)}


def test_paper_observation_matches_its_formulas_and_a_start_draws_busy_power():
    rng = np.random.default_rng(0)
    f = FeatureConfig()
    for _ in range(50):
        n = int(rng.integers(1, 12))
        mem = rng.choice([4.0, 8.0, 16.0, 64.0], n)
        comp = rng.choice([10.0, 20.0, 40.0], n)
        rem = np.where(rng.random(n) < 0.5, rng.random(n) * 30, 0.0)
        acc = rng.random(n) < 0.8
        idle, busy = rng.random(n) * 300, rng.random(n) * 500
        power = np.where(rem > 0, busy, idle)
        views = [ServerView(c, m, r, p, bool(a), b) for c, m, r, p, a, b in
                 zip(comp, mem, rem, power, acc, busy)]
        task_mem = float(rng.choice([2.0, 8.0, 32.0]))
        parent = None if rng.random() < 0.3 else int(rng.integers(0, n))
        masked = bool(rng.random() < 0.5)
        task = TaskView(12.0, task_mem, 1.5, 2, 0.25, parent, 1.5)
        got = encode(task, views, f, 10.0, 0.01, mask_infeasible=masked)
        want = _paper_reference(task, views, f, 1.5 / 10.0 + 0.01 if parent is not None
                                else 0.0, masked)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=k)
        # a start marks the node busy and draws busy power, as the simulator does
        st = slot_table(views)
        enc = PaperEncoder(f, n, masked)
        facts = TaskFacts(12.0, task_mem)
        probe = T(0, task_mem)
        idle_slots = [i for i in range(n) if st.fits_now(i, probe.demands)]
        if idle_slots:
            i = idle_slots[0]
            st.start(i, probe, probe.demands, 7.0)
            assert st.busy[i] and not st.fits_now(i, probe.demands)
            obs = enc.observe(st, probe, facts, 0.0)
            assert obs["servers"][i, 3] == np.float32(min(busy[i] / f.power_w, f.clip))
            assert obs["servers"][i, 2] == np.float32(min(7.0 / f.time_unit, f.clip))


def test_table_copy_is_independent():
    st = table([8.0, 16.0])
    cp = st.copy()
    t = T(0, 4.0)
    cp.start(0, t, t.demands, 4.0)
    cp.set_accepting(1, False)
    assert st.busy.tolist() == [False, False] and st.accept_l == [True, True]
    assert st.busy_until[0] == 0.0 and cp.busy_until[0] == 4.0
