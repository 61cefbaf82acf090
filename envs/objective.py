"""What "better" means: one module for the reward, the planner's cost, eval's paired comparison
and the benchmarks.

``objective`` (the env config's top-level key) is

* ``workflow``: the response of whole workflows (arrival to the finish of its last task), what
  an agent user waits for. The default of ``scale-ray eval --metric`` and of every summary.
* ``task``: the paper's proxy, the mean response of single tasks (arrival of the task's
  workflow to the task's finish). paper.yaml keeps it, so the reproduction stays exact.

Who reads it:

* the reward (``reward.kind: response``): the per-second penalty counts the tasks in the
  system (``task``) or the workflows in the system (``workflow``): :func:`open_count`;
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

from typing import Iterable

OBJECTIVES = ("workflow", "task")
#: paired/summary metric name -> the episode metric key (envs.episode.episode_metrics)
METRICS = {"workflow": "mean_workflow_response_s", "task": "mean_response_s",
           "workflow_p95": "p95_workflow_response_s", "workflow_p99": "p99_workflow_response_s"}
#: the same over every arrived task / workflow (unfinished ones at their age at the end)
CENSORED = {"workflow": "censored_workflow_response_s", "task": "censored_response_s",
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


def open_count(objective: str, open_tasks: int, open_workflows: int) -> int:
    """What the response reward's per-second penalty counts under ``objective``."""
    return open_workflows if objective == "workflow" else open_tasks


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
