"""Fair share by work (scale_ray.live.fairshare; issue 43 item 4): start tags per task, so one
tenant's 10,000-task workflow holds no more than its share and another tenant's new workflow is
placed at the next free server. The live scheduler's side: tests/test_service_isolation.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from envs.config import replace
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler, collect
from scale_ray.live.fairshare import LANE_LOOK, FairShare, TenantOrder
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.programs import Program
from scale_ray.live.tasks import READY, RUNNING
from scale_ray.live.workflow import Primitive, emulated_body


def _admit(fs, tenant, n, w=1.0, running=()):
    return fs.admit(tenant, [w] * n, list(range(n)), running)


def test_a_big_workflow_is_a_sequence_of_work_and_a_newcomer_starts_at_the_oldest_run():
    fs = FairShare()
    big = _admit(fs, "a", 10_000, 0.5)
    assert big[:3] == [0.0, 0.5, 1.0] and big[-1] == 4999.5
    assert _admit(fs, "a", 1, 0.0) == [5000.0]  # a's next workflow starts at its finish tag
    running = big[10:14]  # four servers run a's tasks 10..13
    for tag in running:
        fs.started(tag)
    b = _admit(fs, "b", 2, 3.0, running)
    assert b == [5.0, 8.0]  # V = the oldest run's tag: b's first task beats a's queued tasks
    assert b[0] < big[14]
    # the old rule tagged whole workflows (a's 10,000 tasks shared one tag, 0, and b tied
    # with it, behind a's backlog by arrival); here b is ahead of all but 10 of them
    assert sum(t < b[0] for t in big) == 10


def test_five_big_workflows_queue_behind_each_other_not_in_front_of_a_newcomer():
    fs = FairShare()
    bigs = [_admit(fs, "a", 10_000, 0.2) for _ in range(5)]
    assert abs(bigs[4][0] - 8000.0) < 1e-6  # the fifth starts after the four before it
    fs.started(bigs[0][0])
    b = _admit(fs, "b", 1, 0.1, [bigs[0][0]])
    assert b == [0.0]


def test_an_idle_group_banks_no_credit_and_a_flood_queues_behind_itself():
    fs = FairShare()
    _admit(fs, "b", 1, 1.0)
    for tag in _admit(fs, "a", 100, 1.0):
        fs.started(tag)  # a ran 100 tasks while b was idle
    late = _admit(fs, "b", 1, 1.0)  # nothing runs now: V is the last started tag
    assert late == [99.0]  # not 1.0: b does not get 98 s of a's past service as credit
    again = _admit(fs, "a", 1, 1.0)
    assert again == [100.0]


def test_tasks_are_tagged_in_the_order_given_and_work_is_what_moves_a_tag():
    fs = FairShare()
    tags = fs.admit("a", [1.0, 5.0, 0.0, 2.0], [3, 1, 0, 2], ())
    assert tags == [7.0, 2.0, 8.0, 0.0]
    one = FairShare()  # one tenant: tags grow with arrival (the plain order)
    assert [_admit(one, "", 1, 1.0)[0] for _ in range(3)] == [0.0, 1.0, 2.0]


def test_tags_advance_in_steps_so_a_small_workflow_is_one_tag():
    """Exact per-task tags interleaved two equal clients' workflows task by task; in steps of
    quantum_s a workflow smaller than a step is one tag (the configured order decides within
    it), and a flood keeps a newcomer behind at most one step of its work."""
    import pytest

    fs = FairShare(20.0)
    a = _admit(fs, "a", 5, 2.0)
    assert a == [0.0] * 5 and _admit(fs, "a", 1, 0.0) == [10.0]  # finish tag 10: whole work
    b = _admit(fs, "b", 5, 2.0, running=[a[0]])
    assert b == [0.0] * 5  # V = 0: the same tag as a's; a's older workflow goes first
    flood = _admit(fs, "f", 1000, 1.0)  # tags 0 (x20), 20 (x20), ...
    assert flood[:20] == [0.0] * 20 and flood[20] == 20.0 and flood[-1] == 980.0
    for tag in flood[40:42]:
        fs.started(tag)
    late = _admit(fs, "v", 1, 1.0, running=flood[40:42])
    assert late == [40.0] and sum(t <= late[0] for t in flood[42:]) <= 20  # one step at most
    assert FairShare().admit("x", [1.0, 2.0], [0, 1], ()) == [0.0, 1.0]  # 0: a tag per task
    with pytest.raises(ValueError, match="quantum_s"):
        FairShare(-1.0)


class _Task:  # what TenantOrder reads of a live task
    def __init__(self, gid, tenant, order_key, share):
        self.gid, self.share, self.key, self.state = gid, share, (share, *order_key), READY
        self.wf = SimpleNamespace(handle=SimpleNamespace(tenant=tenant), failed=False)
        self.lane = None


def test_a_tenants_tags_are_dealt_out_again_in_the_configured_order():
    """Two levels: a task older in the order (an agent program's later step) takes its
    tenant's earliest queued tag, the newer ones move up by one; the tenant's tags are the
    same set, so another tenant's are untouched; a started task holds its tag."""
    lanes = TenantOrder()
    a = [_Task(k, "a", (k + 1.0,), float(k)) for k in range(4)]  # arrival k + 1, tag k
    b = _Task(9, "b", (0.5,), 1.5)
    for t in (*a, b):
        assert lanes.enter(t) == []  # already in order
    a[0].state = RUNNING  # started: it keeps tag 0 and leaves the lane
    step = _Task(10, "a", (0.0,), 4.0)  # its program arrived first; tagged as a newcomer
    moved = lanes.enter(step)
    assert moved == a[1:] and [t.share for t in (a[0], step, *a[1:])] == [0, 1, 2, 3, 4]
    assert all(t.key == (t.share, *t.key[1:]) for t in (step, *a))
    assert b.share == 1.5 and b.key == (1.5, 0.5)
    late = _Task(11, "a", (9.0,), 0.5)  # newest in the order with an early tag: moves back
    assert lanes.enter(late) == [step, *a[1:]]
    assert [t.share for t in (step, *a[1:], late)] == [0.5, 1, 2, 3, 4]
    a[3].key = (a[3].share, -1.0)  # re-keyed (a dynamic order): first now, and only once
    assert lanes.enter(a[3]) == [step, a[1], a[2]]
    assert [t.share for t in (a[3], step, a[1], a[2], late)] == [0.5, 1, 2, 3, 4]


def test_the_tenant_order_walks_a_bounded_part_of_a_long_lane():
    lanes = TenantOrder()
    flood = [_Task(k, "a", (1.0, k), 1.0 + k) for k in range(10 * LANE_LOOK)]
    for t in flood:
        lanes.enter(t)
    step = _Task(-1, "a", (0.0,), 1e9)
    assert len(lanes.enter(step)) == LANE_LOOK  # the earliest LANE_LOOK move up one
    assert step.share == 1.0 and flood[LANE_LOOK].share == 1.0 + LANE_LOOK


def test_an_agent_programs_later_step_goes_before_its_tenants_newer_workflows():
    """Live (fair share on, one tenant, fifo): a program's second step, submitted after two
    newer workflows of the tenant, is queued first, as without the fair share (through the
    service, programs were 7-25 % slower than per call when a step queued behind them)."""
    env = replace(load_env(None, servers=2), mdp={"order": "fifo"})
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(
        time_scale=1.0, fair_share=True, fair_share_quantum_s=0.0))
    sched.clock_origin = sched.placement.origin = 0.0
    prim = Primitive(emulated_body, 4.0)
    prog = Program(sched, "p", "a", 0.0, started_wall=0.0)

    def admit(at, program=None):
        h = WorkflowHandle(int(at * 10), collect([prim.bind(0)]), at)
        h.tenant, h.program = "a", program
        sched.admission.admit(h)
        return h.live_record.tasks[0]

    first = admit(0.0, prog)
    first.state = RUNNING
    newer = [admit(1.0), admit(2.0)]
    step = admit(3.0, prog)
    queue = sorted(e for e in sched.placement.queue.heap
                   if e[0] == e[2].key and e[2].state == READY)
    assert [e[2] for e in queue] == [step, *newer]
    assert sorted(t.share for t in (step, *newer)) == sorted(t.share for t in (*newer, step))
