"""The simulator's public, read-only view (SimPy's ``env.now`` style): what a
planner (``policies.lookahead``, ``policies.fast_rollout``, the fast EFT of
``policies.heuristics``), a snapshot (``envs.snapshot.describe``) or a diagnostic reads from a
running :class:`envs.simulator.Simulator` without touching its private state.

Besides these, the simulator's public attributes are part of the view: ``cfg``, ``t``,
``n_slots``, ``current``, ``tasks``, ``workflows``, ``running``, ``busy_until``, ``present``,
``idle_w``, ``busy_w``, ``srv_tier``, ``decisions``, ``outstanding``, and the decision core
``core`` with its server table ``servers`` (``compute_l``, ``memory_l``, ``accept_l``,
``busy_l``, ``max_accept_mem``) and ready queue ``core.queue``.

Read-only: the lists returned are the simulator's own (no copy, for the planners' hot paths);
writing to them corrupts the episode. Change the simulator only through ``step``, ``reset``,
``fork`` and ``load_snapshot``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .events import EventQueue

__all__ = ["StateView"]


class StateView:
    """Read-only properties of :class:`envs.simulator.Simulator` (a mixin; module docstring)."""

    @property
    def forced_waits(self) -> int:
        """Waits made without asking (``mdp.ask_only_startable``)."""
        return self.core.forced_waits

    @property
    def current_waits(self) -> int:
        """How often the policy's pick for the current task did not start it (its waits so far;
        what ``policies.guard`` bounds)."""
        return 0 if self.current is None else self.current.waits

    @property
    def now(self) -> float:
        """The clock (model seconds)."""
        return self.t

    @property
    def events(self) -> "EventQueue":
        """The pending events (``envs.events.EventQueue``: ``peek()``, ``runs()``, ``seq``)."""
        return self.event_q

    @property
    def server_ids(self) -> Sequence[int]:
        """Per slot, the id of the server in it (-1: empty)."""
        return self._sid_l

    @property
    def slot_by_server_id(self) -> dict[int, int]:
        """Server id -> its slot, for the servers present."""
        return self._slot_of

    def slot_of(self, sid: int) -> int | None:
        """The slot of server ``sid`` (None: not present)."""
        return self._slot_of.get(sid)

    @property
    def bandwidth_gb_s(self) -> float:
        return self._bw

    @property
    def latency_s(self) -> float:
        return self._lat

    @property
    def transfer_delays(self) -> bool:
        """``mdp.transfer_delays_start``: a start waits for its inputs."""
        return self._transfer_delays

    @property
    def mean_compute(self) -> float:
        """The mean server speed HEFT's upward rank and the cost of unstarted work use."""
        return self._mean_compute

    @property
    def dynamic_order(self) -> bool:
        """Whether the ready queue's keys move as work finishes (``srpt``, ``las``)."""
        return self._dynamic

    @property
    def time_cap(self) -> float:
        """The clock at which the episode is truncated."""
        return self._t_cap

    @property
    def max_decisions(self) -> int:
        return self._max_decisions

    @property
    def run_model(self) -> Any:
        """The run-time model (``envs.run_model.RunModel``) or None when runs take their
        nominal time exactly."""
        return getattr(self, "_rt", None)

    @property
    def finish_hidden(self) -> bool:
        """Whether running tasks' true ends are hidden from deciders (run-time noise, or
        ``runtime.overhead_s``): a fork or a planner's rollout ends them when expected
        (:meth:`expected_end`)."""
        return getattr(self, "_rt", None) is not None or getattr(self, "_overhead", 0.0) > 0

    def expected_end(self, slot: int) -> float:
        """When the task running on ``slot`` ends as deciders see it (never in the past)."""
        return max(float(self.busy_until[slot]), self.t)

    @property
    def stragglers(self) -> Sequence[tuple[int, Any]]:
        """(token, task) of the runs past their hedge quantile not yet copied
        (``envs.hedging``)."""
        return self.hedges.stragglers
