"""The simulator's per-slot records (``sim.slots``, a part the simulator owns and its fork
copies): which server sits in each slot of the padded cluster (its id, tier and power, whether
it is present), what it runs and since when, and server id -> slot. The decision core's server
table (``envs.decision.ServerTable``) holds what the rules and the encoder read (speed, memory,
accepting, busy, features); these are what only the simulator and its metrics need.

Each record is kept twice on purpose, as a numpy array for vector reads (``present``,
``srv_id``, the power columns) and as a Python list for the event loop's scalar reads (a list
index is several times cheaper than a numpy one); :meth:`add` and :meth:`drop` write both.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .config import TierConfig


class Slots:
    """Per-slot records of ``n`` slots (module docstring); ``count`` servers present, ids
    handed out from ``next_id``."""

    def __init__(self, n: int) -> None:
        self.srv_id = np.full(n, -1, dtype=np.int64)
        self.srv_tier = [""] * n
        self.idle_w = np.zeros(n)
        self.busy_w = np.zeros(n)
        self.present = np.zeros(n, dtype=bool)  # alive (possibly draining); accepting: the core
        self.sid_l = [-1] * n
        self.idle_w_l = [0.0] * n
        self.busy_w_l = [0.0] * n
        self.present_l = [False] * n
        self.running: list[Any] = [None] * n   # the task each slot runs (TaskRecord) or None
        self.run_start = [0.0] * n             # when the slot's current run began
        self.slot_of: dict[int, int] = {}      # server id -> slot, for the servers present
        self.next_id = 0
        self.count = 0

    def add(self, tier: TierConfig) -> tuple[int, int]:
        """A new server of ``tier`` in the first free slot: ``(slot, server id)``. Raises
        RuntimeError when every slot is taken."""
        free = np.flatnonzero(~self.present)
        if free.size == 0:
            raise RuntimeError(f"no free server slot: the observation is padded to "
                               f"{self.present.size} servers (set env.n_max higher)")
        slot = int(free[0])
        sid = self.next_id
        self.next_id += 1
        self.srv_id[slot] = self.sid_l[slot] = sid
        self.srv_tier[slot] = tier.name
        self.set_power(slot, tier.idle_w, tier.busy_w)
        self.present[slot] = self.present_l[slot] = True
        self.slot_of[sid] = slot
        self.count += 1
        return slot, sid

    def set_power(self, slot: int, idle_w: float, busy_w: float) -> None:
        """The slot's idle and busy power (W)."""
        self.idle_w[slot] = self.idle_w_l[slot] = idle_w
        self.busy_w[slot] = self.busy_w_l[slot] = busy_w

    def drop(self, slot: int) -> int:
        """The server in ``slot`` leaves; returns its id."""
        sid = int(self.srv_id[slot])
        self.present[slot] = self.present_l[slot] = False
        self.srv_id[slot] = self.sid_l[slot] = -1
        del self.slot_of[sid]
        self.count -= 1
        return sid

    def copy(self, task: Callable[[Any], Any]) -> "Slots":
        """An independent copy; ``task`` maps each running task to the copy's task."""
        out = object.__new__(Slots)
        for k, v in vars(self).items():
            setattr(out, k, v.copy() if isinstance(v, (list, dict, np.ndarray)) else v)
        out.running = [None if t is None else task(t) for t in self.running]
        return out
