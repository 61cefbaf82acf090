"""What "better" means: one module for the reward, the planner's cost, eval's paired comparison
and the benchmarks.

``objective`` (the env config's top-level key) is

* ``workflow``: the response of whole workflows (arrival to the finish of its last task), what
  an agent user waits for. The default of ``scale-ray eval --metric`` and of every summary.
* ``task``: the paper's proxy, the mean response of single tasks (arrival of the task's
  workflow to the task's finish). paper.yaml keeps it, so the reproduction stays exact.

Who reads it:

* the reward (``reward.kind: response``): the per-second penalty counts the tasks in the
  system (``task``) or the workflows in the system (``workflow``): :class:`Objective`,
  which also gives the paper's reward of a start;
* the lookahead planner's rollout cost: the sum of the tasks' (estimated) completions, or of
  each workflow's last one: :func:`completion_cost`;
* eval's paired comparison and the benchmarks: the metric keys of :data:`METRICS` (the tails,
  ``workflow_p95`` and ``workflow_p99``, are paired metrics too) and their censored variants
  (:data:`CENSORED`: every arrived task or workflow, an unfinished one at its age when the
  episode ended, so a truncated episode is not a survivor-biased one);
* the guard's wait rule (``policies.guard``): a wait is kept only when the task's expected
  finish beats starting now. Under both objectives that is the same test, since a task that
  finishes later can only delay its workflow.

Stdlib only.
"""

from __future__ import annotations

import math
from typing import Iterable

OBJECTIVES = ("workflow", "task")
#: paired/summary metric name -> the episode metric key (envs.episode.episode_metrics)
METRICS = {"workflow": "mean_workflow_response_s", "task": "mean_task_response_s",
           "workflow_p95": "p95_workflow_response_s", "workflow_p99": "p99_workflow_response_s"}
#: the same over every arrived task / workflow (unfinished ones at their age at the end)
CENSORED = {"workflow": "censored_workflow_response_s", "task": "censored_task_response_s",
            "workflow_p95": "censored_p95_workflow_response_s",
            "workflow_p99": "censored_p99_workflow_response_s"}
DEFAULT_METRIC = "workflow"
#: the columns every table and summary leads with, in this order
HEADLINE = ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s")


def metric_key(metric: str) -> str:
    """The episode metric of ``metric`` (:data:`METRICS`); a clear error for another name."""
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"--metric: {metric!r} is not one of {list(METRICS)}") from None


class Objective:
    """What better means for one env config: the reward of a decision, the per-second wait
    penalty, and the planner's rollout cost, under ``name`` (:data:`OBJECTIVES`).

    ``reward``: the env's reward section (``envs.config.RewardConfig``; read, not imported:
    this module stays stdlib-only). The simulator owns one; the planner's rollouts use
    :meth:`cost` through :func:`completion_cost`."""

    __slots__ = ("name", "per_workflow", "w1", "t0_s", "w2", "t0c_s", "w3", "e0_j",
                 "invalid_penalty", "penalty_rate")
    IMMUTABLE = True  # never written after __init__: a simulator's fork shares it (envs.fork)

    def __init__(self, name: str, reward) -> None:
        if name not in OBJECTIVES:
            raise ValueError(f"objective: {name!r} is not one of {list(OBJECTIVES)}")
        self.name = name
        self.per_workflow = name == "workflow"
        r = reward
        self.w1, self.t0_s, self.w2, self.t0c_s, self.w3, self.e0_j = (
            r.w1, r.t0_s, r.w2, r.t0c_s, r.w3, r.e0_j)
        self.invalid_penalty = r.invalid_penalty
        #: the response reward's penalty per open task (or workflow) per second; 0: none
        self.penalty_rate = r.wait_penalty_per_s if r.kind == "response" else 0.0

    def start_reward(self, exec_s: float, comm_s: float, busy_w: float) -> float:
        """The paper's reward (eq. 2) of a start: w1 exp(-T_exec/T0) - w2 T_comm/T0c
        - w3 E/E0, with E the server's busy power times the run."""
        reward = self.w1 * math.exp(-exec_s / self.t0_s)
        if comm_s:
            reward -= self.w2 * comm_s / self.t0c_s
        if self.w3:
            reward -= self.w3 * busy_w * exec_s / self.e0_j
        return reward

    def open_count(self, open_tasks: int, open_workflows: int) -> int:
        """What the per-second penalty counts: open workflows, or open tasks."""
        return open_workflows if self.per_workflow else open_tasks

    def penalty(self, dt: float, open_tasks: int, open_workflows: int) -> float:
        """The response reward's penalty for ``dt`` seconds at these open counts."""
        return self.penalty_rate * dt * self.open_count(open_tasks, open_workflows)

    def cost(self, completions: Iterable[tuple[int, float]]) -> float:
        """The planner's cost of a rollout (:func:`completion_cost`)."""
        return completion_cost(self.name, completions)


def completion_cost(objective: str, completions: Iterable[tuple[int, float]]) -> float:
    """The planner's cost of a rollout from ``(workflow id, completion time)`` per task:
    ``task`` sums the tasks' completions; ``workflow`` sums each workflow's latest one."""
    if objective == "task":
        return sum(c for _, c in completions)
    last: dict[int, float] = {}
    for w, c in completions:
        if c > last.get(w, -1.0):
            last[w] = c
    return sum(last.values())
