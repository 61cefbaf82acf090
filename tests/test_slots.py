"""envs.slots.Slots: the simulator's per-slot records, their two views kept equal, the copy a
fork takes independent of the original."""

import numpy as np
import pytest

from envs.config import TierConfig
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
