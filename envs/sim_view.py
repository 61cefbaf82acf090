"""The simulator's public, read-only view (SimPy's ``env.now`` style): what a
planner (``policies.lookahead``, ``policies.fast_rollout``, the fast EFT of
``policies.heuristics``), a snapshot (``envs.snapshot.describe``) or a diagnostic reads from a
running :class:`envs.simulator.Simulator` without touching its private state.

The view is defined on the :class:`Simulator` class itself: its properties (``now``, ``events``,
``server_ids``, ``slot_by_server_id``, ``forced_waits``, ``current_waits``, ``bandwidth_gb_s``,
``latency_s``, ``transfer_delays``, ``mean_compute``, ``speed_by_memory``, ``dynamic_order``,
``time_cap``, ``max_decisions``, ``run_model``, ``finish_hidden``, ``stragglers``, ``busy``) and
methods (``slot_of``, ``expected_end``); most are names for an attribute of the simulator or of
one of its parts, made with :func:`view`.

Besides these, the simulator's public attributes are part of the view: ``cfg``, ``t``,
``n_slots``, ``current``, ``tasks``, ``workflows``, ``running``, ``busy_until``, ``present``,
``idle_w``, ``busy_w``, ``srv_tier``, ``decisions``, ``outstanding``, and the decision core
``core`` with its server table ``servers`` (``compute_l``, ``memory_l``, ``accept_l``,
``busy_l``, ``max_accept_mem``) and ready queue ``core.queue``, the parts ``slots``,
``arrivals``, ``hedges`` and ``cluster`` (``cluster.lost``: runs lost to failures).

Read-only: the lists returned are the simulator's own (no copy, for the planners' hot paths);
writing to them corrupts the episode. Change the simulator only through ``step``, ``reset``,
``fork``, ``drop_arrivals`` and ``load_snapshot``.
"""

from __future__ import annotations

from operator import attrgetter

__all__ = ["view"]


def view(path: str, doc: str | None = None) -> property:
    """A read-only property reading the attribute at dotted ``path`` of its object (``"t"``,
    ``"core.forced_waits"``); ``doc``: its docstring."""
    return property(attrgetter(path), doc=doc)
