"""What the decision core (``envs.decision``) reads in the lookahead planner's fast rollouts
(``policies.fast_rollout``): a task (:class:`RolloutTask`, kept across decisions by
:class:`TaskViews`) and the servers (:class:`RolloutServers`), so that the rollouts run the
core's own round instead of a copy of it."""

from __future__ import annotations

from envs.decision import READY


class RolloutTask:
    """A task as the decision core reads it (state, key, demands, waits), by local index ``i``.
    One object per present task, shared by a decision's rollouts: each rollout resets the
    states it starts from. Its ``demands`` are its memory: on servers of one slot the only
    demand besides the slot (what :class:`RolloutServers` checks)."""
    __slots__ = ("i", "state", "key", "demands", "waits")

    def __init__(self, i: int, key, memory_gb: float) -> None:
        self.i, self.key, self.demands, self.state, self.waits = i, key, memory_gb, READY, 0


class TaskViews:
    """The :class:`RolloutTask` of each present task, kept from one decision to the next (the
    planner holds one): most of a decision's tasks were present at the last one, and
    allocating two thousand objects a decision (N = 1024) costs more than reusing them. Only
    the objects are reused: each decision sets every field it reads."""

    def __init__(self) -> None:
        self.by_id: dict[int, RolloutTask] = {}

    def get(self, tids, keys, mems) -> list[RolloutTask]:
        old, new, out = self.by_id, {}, []
        for i, (tid, k, m) in enumerate(zip(tids, keys, mems)):
            tk = old.get(tid)
            if tk is None:
                tk = RolloutTask(i, k, m)
            else:
                tk.i, tk.key, tk.demands = i, k, m  # ids repeat across episodes
            new[tid] = tk
            out.append(tk)
        self.by_id = new
        return out


class RolloutServers:
    """A rollout's servers of one slot as the decision core reads a table
    (``envs.nodes.NodeTable``'s ``state``, ``fits_now`` and ``full`` for a task whose demands
    are a slot and its memory): accept, busy and memory lists, the largest idle memory from the
    idle classes (by memory, largest first)."""
    __slots__ = ("n", "accept_l", "busy_l", "memory_l", "max_accept_mem", "idle", "cmr", "rk")

    def could_hold(self, memory_gb: float) -> bool:
        return memory_gb <= self.max_accept_mem + 1e-9

    def fits_somewhere(self, memory_gb: float) -> bool:
        idle = self.idle
        for k in self.rk:
            if idle[k]:
                return self.cmr[k] + 1e-9 >= memory_gb
        return False

    def fits_now(self, i: int, memory_gb: float) -> bool:
        return (0 <= i < self.n and self.accept_l[i] and not self.busy_l[i]
                and self.memory_l[i] + 1e-9 >= memory_gb)

    def full(self) -> bool:
        return not any(self.idle)
