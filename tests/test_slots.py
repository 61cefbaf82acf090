"""The simulator's parts on their own: envs.slots.Slots (the per-slot records, their two views
kept equal, the copy a fork takes independent of the original) and envs.sim_arrivals.Arrivals
(where workflows come from)."""

import numpy as np
import pytest

from envs.config import EnvConfig, TierConfig
from envs.sim_arrivals import Arrivals
from envs.slots import Slots

TIER = TierConfig(name="a", compute=2.0, memory_gb=8.0, idle_w=10.0, busy_w=50.0, ratio=1.0)


def _views_agree(s: Slots) -> None:
    assert s.srv_id.tolist() == s.sid_l
    assert s.present.tolist() == s.present_l
    assert s.idle_w.tolist() == s.idle_w_l and s.busy_w.tolist() == s.busy_w_l
    assert {sid: slot for slot, sid in enumerate(s.sid_l) if sid >= 0} == s.slot_of
    assert s.count == sum(s.present_l)


def test_add_takes_the_first_free_slot_and_drop_frees_it():
    s = Slots(3)
    assert [s.add(TIER) for _ in range(3)] == [(0, 0), (1, 1), (2, 2)]
    _views_agree(s)
    assert s.drop(1) == 1
    _views_agree(s)
    assert s.add(TIER) == (1, 3)  # ids are never reused
    assert s.srv_tier == ["a", "a", "a"] and s.idle_w_l == [10.0] * 3
    _views_agree(s)
    with pytest.raises(RuntimeError, match="padded to 3 servers"):
        s.add(TIER)


def test_a_copy_maps_running_tasks_and_shares_nothing_mutable():
    s = Slots(2)
    s.add(TIER)
    s.running[0], s.run_start[0] = "task", 1.5
    c = s.copy(lambda t: t.upper())
    assert c.running == ["TASK", None] and c.run_start == [1.5, 0.0]
    c.drop(0)
    c.add(TIER)
    c.set_power(1, 1.0, 2.0)
    assert s.sid_l == [0, -1] and s.slot_of == {0: 0} and s.count == 1 and s.next_id == 1
    assert s.idle_w_l == [10.0, 0.0] and np.array_equal(s.present, [True, False])
    for k, v in vars(s).items():
        if isinstance(v, (list, dict, np.ndarray)):
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
