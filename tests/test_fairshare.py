"""Fair share by work (scale_ray.live.fairshare; issue 43 item 4): start tags per task, so one
tenant's 10,000-task workflow holds no more than its share and another tenant's new workflow is
placed at the next free server. The live scheduler's side: tests/test_service_isolation.py."""

from __future__ import annotations

from scale_ray.live.fairshare import FairShare


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


def test_a_programs_later_step_goes_on_from_its_program_not_behind_the_tenants_newer_work():
    """An agent program's step (``after``: where its earlier steps' tags ended) is tagged as if
    the program had come as one workflow: ahead of the tenant's own newer workflow, never
    before V; the tenant is still charged its work (its next workflow starts later by it)."""
    fs = FairShare()
    first = fs.admit("a", [1.0], [0], ())  # a program's first step
    end = fs.last_end
    newer = _admit(fs, "a", 2, 1.0)  # the same tenant's next workflow
    assert first == [0.0] and end == 1.0 and newer == [1.0, 2.0]
    step = fs.admit("a", [1.0, 1.0], [0, 1], (), after=end)
    assert step == [1.0, 2.0] and fs.last_end == 3.0  # ties the newer one, not behind it
    end = fs.last_end
    assert _admit(fs, "a", 1, 1.0) == [5.0]  # charged: 3 (first + newer) + 2 (the step)
    fs.started(4.0)
    late = fs.admit("a", [1.0], [0], [4.0], after=end)
    assert late == [4.0]  # never before V, the oldest run's tag
