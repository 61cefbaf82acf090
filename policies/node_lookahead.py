"""A rollout planner in Ray's resource model (``envs.nodes``): the lookahead planner of
``policies.lookahead`` for nodes that run every task that fits.

For the task to place it takes the base rule's pick and the ``k`` - 1 other nodes where the task
fits now with the earliest finish (EFT's ranking: the run the rules plan with,
``NodeTable.run_time``; ties by node index), and for each one places the task there on a fork of
the episode (``envs.node_sim._Episode.fork``: the present work, no new arrivals, running tasks
ending when expected) and lets the base rule place the rest of the present work until it is
done. The cost of a candidate is the sum of the open requests' completion times in that rollout (the
``workflow`` objective, ``envs.objective``); the cheapest wins, the base rule's pick on a tie.
With one candidate (or ``k = 1``) it is the base rule. The base is ``eft`` (``scale-ray bench
headroom``) or, through ``policies.node_learned.node_decider`` (``live.node_rule:
lookahead[:K]``, ``bench live``), ``eft_spread``: live, ties spread over the nodes keep Ray's
workers warm, where EFT's lowest-index ties pack runs onto few nodes (results/resource_model). A
task that fits nowhere now is left to the base rule (a wait); the planner never waits on its
own, so it cannot wait without bound.

Its cost is bounded: with more than :data:`MAX_OPEN_PER_NODE` open requests a node (a burst, a
flooded cluster) it is the base rule (counted in ``skipped``) until the backlog drains: a
rollout runs the whole present work, so in a burst of 120 requests on 8 nodes each call cost
123 ms, now 2-3 ms. In agents.yaml's episodes at N = 16, GPU load 0.6 and 0.8, the bound
changes no decision (``scale-ray bench headroom --policies lookahead`` prints how many it
took; results/resource_model/README.md).

It plans on the rules' view: with ``learn_speeds`` its rollouts use the estimator's run times,
never the true ones. Cost per decision: ``k`` rollouts of the present work (``scale-ray bench
headroom --policies lookahead`` prints each episode's seconds).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from envs.nodes import NodeTable

from .node_rules import eft

__all__ = ["NodeLookahead", "MAX_OPEN_PER_NODE"]

MAX_OPEN_PER_NODE = 4  # above this many open requests a node, plan with the base rule


class NodeLookahead:
    """The planner (module docstring). ``plan(episode, task)`` -> node index; as a plain rule
    (``(table, task, now, rng)``, no episode to fork) it is the base rule."""

    def __init__(self, k: int = 4, base: Callable = eft,
                 max_open_per_node: float = MAX_OPEN_PER_NODE):
        if k < 1:
            raise ValueError(f"lookahead: k must be >= 1, got {k!r}")
        if not max_open_per_node > 0:
            raise ValueError(f"lookahead: max_open_per_node must be > 0, got "
                             f"{max_open_per_node!r}")
        self.k, self.base, self.max_open_per_node = k, base, max_open_per_node
        self.rollouts = 0  # rollouts made so far
        self.changed = 0  # picks that differ from the base rule's
        self.skipped = 0  # asks answered by the base rule alone: too many open requests

    def __call__(self, table: NodeTable, task: Any, now: float, rng: np.random.Generator) -> int:
        return self.base(table, task, now, rng)

    def candidates(self, table: NodeTable, task: Any) -> list[int]:
        """The ``k`` nodes where ``task`` fits now with the earliest finish (ties: index)."""
        fit = table.fitting(task.demands)
        fit.sort(key=lambda i: (table.run_time(i, task), i))
        return fit[:self.k]

    def plan(self, ep: Any, task: Any) -> int:
        first = self.base(ep.table, task, ep.now, ep.r_pol)
        if ep.open > self.max_open_per_node * ep.table.n:  # a burst: bounded cost
            self.skipped += 1
            return first
        cands = self.candidates(ep.table, task)
        if len(cands) <= 1:
            return first
        best, pick = None, first
        for i in [first] + [c for c in cands if c != first][:self.k - 1]:
            cost = self.rollout(ep, task, i)
            if best is None or cost < best - 1e-9:
                best, pick = cost, i
        self.changed += pick != first
        return pick

    def rollout(self, ep: Any, task: Any, node: int) -> float:
        """The sum of the open requests' completion times when ``task`` starts on ``node`` now
        and the base rule places the rest of the present work."""
        self.rollouts += 1
        fork = ep.fork(self.base)
        copy = fork.task(task)
        if not fork.core.resolve(copy, node):  # (a candidate fits now: never)
            raise RuntimeError(f"lookahead: task {task.id} does not fit node {node} in its fork")
        fork.start(copy, node)
        fork.run(now_first=True)
        return sum(w.finish for w in fork.requests)
