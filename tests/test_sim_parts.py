"""The simulator's parts on their own: the node table's positions (envs.nodes.NodeTable: a
node takes the first free one, leaves it free, a copy shares nothing mutable), the node
dynamics (envs.sim_cluster.Cluster: ids never reused) and envs.sim_arrivals.Arrivals (where
workflows come from)."""

import numpy as np
import pytest

from envs.config import EnvConfig, TierConfig
from envs.decision import ReadyQueue
from envs.events import EventQueue
from envs.hedging import Hedges
from envs.nodes import NodeTable
from envs.sim_arrivals import Arrivals
from envs.sim_cluster import Cluster

TIER = TierConfig(name="a", compute=2.0, memory_gb=8.0, idle_w=10.0, busy_w=50.0, ratio=1.0)


class _Run:
    demands = (("memory", 1.0), ("slot", 1.0))


def _views_agree(t: NodeTable) -> None:
    """The table's numpy and list views say the same."""
    for i in range(t.n):
        assert bool(t.busy[i]) == bool(t.running[i]), i
        if t.running[i]:
            assert t.busy_until[i] == max(t.running[i].values())
        assert t.present_l[i] == (t.specs[i] is not None)


def test_nodes_take_the_first_free_position_and_ids_are_never_reused():
    table = NodeTable([], capacity=3, shapes=[TIER.spec()])
    cl = Cluster(EnvConfig(), np.random.default_rng(0), table, ReadyQueue(), EventQueue(),
                 None, None)
    for _ in range(3):
        cl.add(TIER, 0.0, None)
    assert cl.slot_of == {0: 0, 1: 1, 2: 2} and cl.count == 3
    _views_agree(table)
    cl.drop(1, "server_remove", 1.0, None)
    assert table.free_position() == 1 and list(table.positions()) == [0, 2]
    cl.add(TIER, 2.0, None)
    assert cl.slot_of == {0: 0, 3: 1, 2: 2} and table.ids == [0, 3, 2]  # id 1 is gone for good
    assert table.idle_w == [10.0] * 3 and table.busy_w == [50.0] * 3
    _views_agree(table)
    with pytest.raises(RuntimeError, match="padded to 3 nodes"):
        cl.add(TIER, 3.0, None)


def test_a_table_copy_maps_running_tasks_and_shares_nothing_mutable():
    table = NodeTable([TIER.spec()], capacity=2)
    run = _Run()
    table.start(0, run, run.demands, 1.5)
    c = table.copy(lambda t, i: "copy")
    assert list(c.running[0].items()) == [("copy", 1.5)] and c.busy[0]
    c.finish("copy", 0)
    c.set_node(1, TIER.spec(), 7)
    c.clear(0)
    _views_agree(c)
    _views_agree(table)
    assert table.ids == [0, None] and table.running[0] == {run: 1.5} and table.busy[0]
    assert table.busy_until[0] == 1.5 and not table.present_l[1]
    shared = {"names", "index", "_compiled"}  # fixed at construction; the compiled demands
    for k, v in vars(table).items():
        if isinstance(v, (list, dict, np.ndarray, set)) and k not in shared:
            assert getattr(c, k) is not v, k


def test_arrivals_part_copies_stops_and_resamples_independently():
    """envs.sim_arrivals.Arrivals: a copy draws the same future from its own generators; stop
    ends it; resample draws from the given generator states, forgetting what was drawn ahead;
    scripted arrivals come in time order and bad times are refused."""
    def make(seed, scripted=None):
        return Arrivals(EnvConfig(), np.random.default_rng(seed), np.random.default_rng(seed + 1),
                        scripted)

    a = make(1)
    t1 = a.next_time(0.0)
    c = a.copy()
    assert c.rng_arrivals is not a.rng_arrivals and c.process is not a.process
    times_c = [c.next_time(t1) for _ in range(3)]
    assert [a.next_time(t1) for _ in range(3)] == times_c  # the same future, drawn apart
    assert c.next_workflow().name == a.next_workflow().name
    states = (np.random.default_rng(7).bit_generator.state,
              np.random.default_rng(8).bit_generator.state)
    a.resample(states)
    c.resample(states)
    b = make(99)  # other generators set to the same states: the same next arrival
    b.resample(states)
    assert a.next_time(5.0) == c.next_time(5.0) == b.next_time(5.0)
    c.stop()
    assert c.done and c.next_time(0.0) is None and not a.done
    wf = make(0).next_workflow()
    s = make(0, [(2.0, wf), (1.0, wf)])
    assert s.next_time(0.0) == 1.0 and s.next_workflow() is wf and s.next_time(1.0) == 2.0
    s.next_workflow()
    assert s.next_time(2.0) is None and s.done
    with pytest.raises(ValueError, match="finite and >= 0"):
        make(0, [(-1.0, wf)])
