"""Agent programs whose calls depend on earlier answers (``workload.source: programs``; issue 47).

Three shapes, mixed by weight (``workload.programs``, :class:`envs.config.ProgramsConfig`); every
call is a model call (``llm_gflop``) or a tool call (``tool_gflop``), memory and output drawn as
the paper's generator draws them (``workload.memory_gb``, ``output_gb``):

* ``react``: think, act, think, act, ..., answer: a chain of ``2 k + 1`` calls, ``k`` geometric
  with mean ``react_steps_mean`` (at least 1, at most ``max_steps``);
* ``plan``: a plan, a fan-out of ``fanout_min..fanout_max`` tool calls, then with probability
  ``replan_prob`` (at most ``max_replans`` times) a re-plan on their answers and another fan-out,
  then the answer;
* ``branch``: a router; with probability 1/2 a lookup (one tool call, one model call), else a
  fan-out as a plan's; then the answer.

The whole DAG is drawn when the program arrives (the same seed gives the same requests in every
mode), but under ``mdp.submission: program`` or ``per_call`` the order sees a call only once its
parents finished (``envs.programs``), so how long a loop runs or which branch a router takes is
unknown until it happens. A program's name is its shape: the kind whose finished programs
``envs.programs.WorkEstimate`` learns from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import DistConfig, WorkloadConfig
from .workflow import TaskSpec, WorkflowSpec

SHAPES = ("react", "plan", "branch")


def _one(dist: DistConfig, rng: np.random.Generator) -> float:
    if dist.dist == "normal":
        v = rng.normal(dist.mean, dist.std) if dist.std > 0 else dist.mean
    elif dist.dist == "exponential":
        v = rng.exponential(dist.mean) if dist.mean > 0 else 0.0
    else:
        v = dist.mean
    v = max(v, dist.min)
    return float(v if dist.max is None else min(v, dist.max))


@dataclass
class ProgramSource:
    """The generator (module docstring); ``next_workflow(rng)`` draws one program."""

    cfg: WorkloadConfig

    def __post_init__(self) -> None:
        p = self.cfg.programs
        w = np.array([p.react, p.plan, p.branch], dtype=float)
        self._p = w / w.sum()

    def forget_drawn(self) -> None:
        """Nothing is drawn ahead."""

    def next_workflow(self, rng: np.random.Generator) -> WorkflowSpec:
        shape = SHAPES[int(rng.choice(3, p=self._p))]
        calls: list[TaskSpec] = []
        getattr(self, "_" + shape)(rng, calls)
        return WorkflowSpec(tuple(calls), shape)

    # ------------------------------------------------------------------ shapes
    def _call(self, rng: np.random.Generator, calls: list[TaskSpec], llm: bool,
              parents: tuple[int, ...]) -> int:
        c, p = self.cfg, self.cfg.programs
        calls.append(TaskSpec(_one(p.llm_gflop if llm else p.tool_gflop, rng),
                              _one(c.memory_gb, rng), _one(c.output_gb, rng), parents,
                              "llm" if llm else "tool", kind="llm" if llm else "tool"))
        return len(calls) - 1

    def _fanout(self, rng: np.random.Generator, calls: list[TaskSpec], after: int) -> tuple:
        p = self.cfg.programs
        k = int(rng.integers(p.fanout_min, p.fanout_max + 1))
        return tuple(self._call(rng, calls, False, (after,)) for _ in range(k))

    def _react(self, rng: np.random.Generator, calls: list[TaskSpec]) -> None:
        p = self.cfg.programs
        steps = min(int(rng.geometric(1.0 / p.react_steps_mean)), p.max_steps)
        last = self._call(rng, calls, True, ())
        for _ in range(steps):
            tool = self._call(rng, calls, False, (last,))
            last = self._call(rng, calls, True, (tool,))

    def _plan(self, rng: np.random.Generator, calls: list[TaskSpec]) -> None:
        p = self.cfg.programs
        fan = self._fanout(rng, calls, self._call(rng, calls, True, ()))
        for _ in range(p.max_replans):
            if rng.random() >= p.replan_prob:
                break
            fan = self._fanout(rng, calls, self._call(rng, calls, True, fan))
        self._call(rng, calls, True, fan)

    def _branch(self, rng: np.random.Generator, calls: list[TaskSpec]) -> None:
        router = self._call(rng, calls, True, ())
        if rng.random() < 0.5:
            ends: tuple = (self._call(rng, calls, True,
                                      (self._call(rng, calls, False, (router,)),)),)
        else:
            ends = self._fanout(rng, calls, router)
        self._call(rng, calls, True, ends)
