"""envs.order: the ready-task orders, their re-keying, the config/policy conflict, and a round
whose cost does not depend on the backlog."""
from __future__ import annotations

import typing
import warnings

import pytest

from envs import order as orders
from envs.config import ConfigError, EnvConfig, MdpConfig, build, replace
from envs.decision import READY, DecisionCore, Rules
from envs.demands import Request
from envs.encoding import ServerView, slot_table
from envs.simulator import Simulator
from envs.workflow import TaskSpec, WorkflowSpec
from scale_ray.evaluation import env_for_policy, evaluate, split_order

CHAIN = WorkflowSpec((TaskSpec(4.0, 1.0, 0.0), TaskSpec(4.0, 1.0, 0.0, (0,)),
                      TaskSpec(4.0, 1.0, 0.0, (1,))), "chain3")
PAIR = WorkflowSpec((TaskSpec(1.0, 1.0, 0.0), TaskSpec(1.0, 1.0, 0.0)), "pair")


def _env(order: str | None, servers: int = 1, **mdp) -> EnvConfig:
    return build(EnvConfig, {"cluster": {"servers": servers, "tiers": [
        {"name": "only", "compute": 1.0, "memory_gb": 80.0, "ratio": 1}]},
        "mdp": {"order": order, "mask_infeasible": True, "ask_only_startable": True,
                "head_of_line_blocking": False, **mdp}})


def _start_order(order: str, arrivals) -> list[tuple[str, int]]:
    """(workflow name, task index) in the order one server starts them (EFT = slot 0)."""
    sim = Simulator(_env(order))
    sim.reset(0, arrivals=arrivals)
    seen = []
    while sim.current is not None:
        t = sim.current
        if sim.table.fits_now(0, t.demands):
            seen.append((t.wf.id, t.id - sim.workflows[t.wf.id].tasks[0].id))
        sim.step(0)
    return seen


def test_orders_literal_matches_the_module():
    hint = typing.get_type_hints(MdpConfig)["order"]
    assert typing.get_args(typing.get_args(hint)[0]) == orders.ORDERS


def test_hop_interleaves_fifo_finishes_the_oldest_workflow_first():
    # t=0: a 3-chain; t=0.5: a pair of independent tasks. One server, 4 s per chain task.
    arrivals = [(0.0, CHAIN), (0.5, PAIR)]
    # hop: the pair's tasks (rank 0) lose to the chain's next task (rank 1) only while it is
    # ready; after the chain's first task the chain's rank-1 task goes before the pair
    assert _start_order("hop", arrivals) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert _start_order("fifo", arrivals) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    # srpt: after the chain's first task it has 8 GFLOP left, the pair 2: the pair goes first
    assert _start_order("srpt", arrivals) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]
    # las: the chain has attained 4 s, the pair 0: the pair goes first
    assert _start_order("las", arrivals) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]
    # edf (factor 2): chain deadline 0 + 2 x 12 = 24, pair 0.5 + 2 x 1 = 2.5: the pair first
    assert _start_order("edf", arrivals) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]


def test_fifo_beats_hop_when_a_young_deep_workflow_arrives():
    # t=0: a pair (rank 0); t=0.1: a 3-chain (rank 2). hop starts the chain's head first.
    arrivals = [(0.0, PAIR), (0.0, PAIR), (0.1, CHAIN)]
    hop = _start_order("hop", arrivals)
    fifo = _start_order("fifo", arrivals)
    assert fifo == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    # hop: the chain's head (rank 2), then its rank-1 task, jump both pairs
    assert hop == [(0, 0), (2, 0), (2, 1), (0, 1), (1, 0), (1, 1), (2, 2)]


def test_dynamic_orders_rekey_without_rebuilding_the_queue():
    sim = Simulator(_env("srpt", servers=1))
    sim.reset(0, arrivals=[(0.0, CHAIN), (0.0, PAIR)])
    chain, pair = sim.workflows
    assert (chain.level, pair.level) == (pytest.approx(12.0), pytest.approx(2.0))  # GFLOP / 1
    while sim.current is not None and sim.t < 5.5:
        sim.step(0)
    # the pair ran first (2 GFLOP < 12; its first finish re-keyed it, its last finish needs no
    # key), then chain task 0 ran from 2 s to 6 s, where the clock stopped for the next decision
    assert pair.done == 2 and pair.level == pytest.approx(1.0)
    assert 6.0 <= sim.t < 6.2 and chain.done == 1
    assert chain.level == pytest.approx(8.0)  # one 4-GFLOP task done
    for tk in chain.tasks[1:]:
        assert tk.key[0] == pytest.approx(8.0)  # every unfinished task re-keyed, once
    while sim.current is not None:
        sim.step(0)
    assert sim.terminated and chain.level == pytest.approx(4.0)


_SLOT_TASK = Request(memory_gb=1.0).on_slot()


def _servers(n: int, busy: bool = False):
    """``n`` servers of one slot (speed 1, 80 GB); busy ones run until 1e9 s."""
    return slot_table([ServerView(1.0, 80.0, 1e9 if busy else 0.0) for _ in range(n)])


def test_rekeyed_entries_are_dropped_as_stale():
    core = DecisionCore(_servers(1), Rules(False, True, True))

    class T:
        def __init__(self, i, key):
            self.id, self.key, self.memory_gb, self.state, self.waits = i, key, 1.0, READY, 0
            self.demands = _SLOT_TASK

    a, b = T(0, (1.0,)), T(1, (2.0,))
    for t in (a, b):
        core.queue.push(t.key, t.id, t)
    a.key = (3.0,)  # a re-key: a new entry, the old one is stale
    core.queue.push(a.key, a.id, a)
    task, _ = core.next_task()
    assert task is b and len(core.queue) == 2  # a's stale entry popped


def test_a_config_and_a_policy_that_need_different_orders_fail_naming_both():
    with pytest.raises(orders.OrderConflict, match=r"policy 'heft' needs mdp.order='upward_rank'"
                       r".*config sets mdp.order='fifo'"):
        evaluate(_env("fifo", servers=4), ["heft"], [4], 1, workers=1)
    with pytest.raises(orders.OrderConflict, match="heft"):
        split_order("heft@las", EnvConfig())  # parsing is fine; running it is the conflict
        evaluate(EnvConfig(), ["heft@las"], [4], 1, workers=1)
    # unset: the policy's own order; no policy need: hop
    from policies import get_policy
    assert env_for_policy(EnvConfig(), get_policy("heft", EnvConfig())).mdp.order == "upward_rank"
    assert env_for_policy(EnvConfig(), get_policy("eft", EnvConfig())).mdp.order == "hop"
    # the bug the order module fixed: eval of eft under upward_rank ran hop
    env = replace(EnvConfig(), mdp={"order": "upward_rank"})
    assert env_for_policy(env, get_policy("eft", env)).mdp.order == "upward_rank"


def test_first_level_is_an_alias_that_warns():
    with pytest.warns(FutureWarning, match="mdp.first_level is deprecated"):
        cfg = build(EnvConfig, {"mdp": {"first_level": "upward_rank"}})
    assert cfg.mdp.order == "upward_rank" and cfg.mdp.first_level is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        replace(cfg, workload={"horizon_s": 50.0})  # no second warning on derived configs
    with pytest.raises(ConfigError, match="contradicts"):
        build(EnvConfig, {"mdp": {"first_level": "hop", "order": "fifo"}})


def test_split_order_runs_a_policy_under_another_order():
    spec, env = split_order("eft@las", EnvConfig())
    assert spec == "eft" and env.mdp.order == "las"
    assert split_order("results/x@y/policy", EnvConfig())[0] == "results/x@y/policy"


class _CountingTask:
    """A ready task that counts how often a round reads it."""
    reads = 0

    def __init__(self, i):
        self.id, self.memory_gb, self.waits, self.key = i, 1.0, 0, (float(i),)
        self.demands = _SLOT_TASK
        self._state = READY

    @property
    def state(self):
        _CountingTask.reads += 1
        return self._state


@pytest.mark.parametrize("hol", [False, True])
def test_a_round_with_no_free_server_does_not_walk_the_backlog(hol):
    table = _servers(4, busy=True)
    core = DecisionCore(table, Rules(hol, True, True))
    tasks = [_CountingTask(i) for i in range(20_000)]
    for t in tasks:
        core.queue.push(t.key, t.id, t)
    _CountingTask.reads = 0
    core.run_round(lambda t: pytest.fail("asked"), lambda t, s: None)
    core.queue.requeue_deferred()
    assert _CountingTask.reads <= 2  # the head only, not 20,000 tasks
    assert len(core.queue) == 20_000 and not core.queue.deferred
    # and the order survives: a server frees up, the smallest key comes first
    table.finish(next(iter(table.running[2])), 2)
    task, _ = core.next_task()
    assert task is tasks[0]


def test_defer_all_then_new_arrivals_keep_one_heap():
    core = DecisionCore(_servers(1, busy=True), Rules(False, True, True))
    ts = [_CountingTask(i) for i in range(0, 100, 2)]
    for t in ts:
        core.queue.push(t.key, t.id, t)
    assert core.next_task()[0] is None
    late = [_CountingTask(i) for i in range(1, 20, 2)]  # arrive while the backlog is deferred
    for t in late:
        core.queue.push(t.key, t.id, t)
    core.queue.requeue_deferred()
    core.table.finish(next(iter(core.table.running[0])), 0)
    got = []
    while True:
        t, _ = core.next_task()
        if t is None:
            break
        got.append(t.id)
        core.queue.block_head()  # set aside: look at the next one
    assert got == sorted(t.id for t in ts + late)


@pytest.mark.parametrize("order,first", [(None, "old"), ("hop", "young"), ("srpt", "old"),
                                         ("edf", "old")])
def test_the_live_scheduler_keys_its_queue_with_the_same_module(order, first):
    """The live library's order (no Ray: workflows admitted by hand): unset it is fifo, the
    serving default; the config's order otherwise; heft under fifo is refused naming both."""
    from policies import get_policy
    from scale_ray.config import load_env
    from scale_ray.live import LiveConfig, LiveScheduler
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.workflow import from_spec

    env = load_env(None, [f"mdp.order={order}"] if order else [], servers=4)
    sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=1.0))
    assert sched.order.name == (order or orders.SERVING_ORDER)
    old, young = WorkflowHandle(0, from_spec(PAIR), 0.0), WorkflowHandle(1, from_spec(CHAIN), 0.0)
    old.submitted_wall, young.submitted_wall = 100.0, 105.0
    for h in (old, young):  # old: shallow, 2 GFLOP; young: a 3-chain, 12 GFLOP, rank 2
        sched.admission.admit(h)
        for t in h.live_record.tasks:
            if not t.waiting_for:
                sched.placement.push(t)
    head = sched.placement.queue.heap[0][2]
    assert head.wf.handle is (old if first == "old" else young)
    with pytest.raises(orders.OrderConflict, match="heft"):
        LiveScheduler(get_policy("heft", env), load_env(None, ["mdp.order=fifo"]),
                      LiveConfig(time_scale=1.0))


def test_edf_has_one_lower_bound_memory_aware_in_every_driver():
    """The critical-path bound of ``edf`` (and the slowdown metric): each task on the fastest
    server whose memory holds it. A 32-GB task cannot run on the fast 16-GB server: 8 GFLOP at
    2 GFLOP/s, then its 8-GB child at 4: 6 s (the fastest server for both would say 4 s, as
    the live scheduler and /v1/schedule once did). The simulator's build and /v1/schedule's
    listed-task level agree."""
    from envs.episode import build_workflow

    servers = orders.by_speed([(2.0, 64.0), (4.0, 16.0)])
    assert servers == ((4.0, 16.0), (2.0, 64.0))
    assert orders.speed_for(32.0, servers) == 2.0 and orders.speed_for(100.0, servers) == 4.0
    spec = WorkflowSpec((TaskSpec(8.0, 32.0, 0.0), TaskSpec(8.0, 8.0, 0.0, (0,))), "mem")
    costs = orders.Costs.of([(2.0, 2.0, 64.0, False), (4.0, 4.0, 16.0, False)])
    assert costs.fastest == servers
    assert costs.lower_bound_s([8.0, 8.0], [32.0, 8.0], [False, False], [(), (0,)]) == 6.0
    edf = orders.make("edf", edf_factor=2.0)
    wf, _ = build_workflow(spec, 0, 0, 1.0, edf, costs)
    assert wf.lower_bound == 6.0 and wf.level == 1.0 + 2.0 * 6.0
    keyed = edf.arrive(orders.Graph([8.0, 8.0], [32.0, 8.0], [0.0, 0.0], [False, False],
                                    [[1], []], [[], [0]]), 1.0, 0, costs)
    assert keyed.level == wf.level


def test_live_levels_are_in_model_seconds_as_in_the_simulator():
    """One time unit: at ``time_scale`` 0.5 a workflow submitted 5 wall seconds after the start
    arrived at 10 model seconds; its ``edf`` deadline is 10 + factor x the simulator's bound
    (model seconds), and under ``las`` a run of 1 wall second attains 2 model seconds."""
    from policies import get_policy
    from scale_ray.config import load_env
    from scale_ray.live import LiveConfig, LiveScheduler
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.workflow import from_spec
    from envs.episode import build_workflow

    for name in ("edf", "las"):
        env = load_env(None, [f"mdp.order={name}"], servers=4)
        sched = LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=0.5))
        h = WorkflowHandle(0, from_spec(CHAIN), 0.0)
        h.submitted_wall = sched.clock_origin + 5.0
        sched.admission.admit(h)
        wf = h.live_record
        assert wf.arrival == pytest.approx(10.0)
        if name == "edf":
            sim_wf, _ = build_workflow(CHAIN, 0, 0, 10.0, sched.order, sched.admission.costs)
            assert wf.level == pytest.approx(sim_wf.level)
            assert wf.level == pytest.approx(10.0 + env.mdp.edf_factor * sim_wf.lower_bound)
        else:
            t = wf.tasks[0]
            t.started = 100.0
            sched.completions.rekey(wf, t, 101.0)
            assert wf.level == pytest.approx(2.0)
            assert wf.tasks[1].key[0] == pytest.approx(2.0)
