"""What the agent sees of the simulator's current decision (``sim.observer``, a part the
simulator owns; never written after construction, so a fork shares it): the task's feature vector
(``envs.encoding``; with the backlog columns when ``features.backlog``) and the server table's
features and action mask (``envs.decision.ServerTable.observe``). It owns the encoder's settings
(features, network, masking); each call is given the task and what the simulator knows now."""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import EnvConfig
from .decision import ReadyQueue, ServerTable, task_vector
from .encoding import encode_task, task_dim

__all__ = ["Observer"]


class Observer:
    """The observation of a decision (module docstring)."""

    IMMUTABLE = True  # never written after construction: a fork shares it (envs.fork.immutable)

    def __init__(self, cfg: EnvConfig) -> None:
        self.f = cfg.features
        self.n = cfg.padded_servers
        self.bw, self.lat = cfg.cluster.bandwidth_gb_s, cfg.cluster.latency_s
        self.mask_infeasible = cfg.mdp.mask_infeasible

    def empty(self) -> dict[str, np.ndarray]:
        """The observation once the episode is over: zeros."""
        n = self.n
        return {"task": np.zeros(task_dim(self.f), np.float32),
                "servers": np.zeros((n, 5), np.float32), "action_mask": np.zeros(n, np.float32)}

    def observe(self, task: Any, t: float, shown: tuple[int, float], queue: ReadyQueue,
                table: ServerTable, slot_of: dict[int, int]) -> dict[str, np.ndarray]:
        """The observation of deciding ``task`` (``envs.episode.TaskRecord``) at ``t``:
        ``shown``, its successors and its workflow's completion as deciders see them
        (``mdp.submission``); ``queue``, the ready queue; ``table``, the server table;
        ``slot_of``, server id -> slot."""
        f = self.f
        kids, done = shown
        if f.backlog:
            vec = task_vector(f, task.compute, task.memory_gb, kids, done,
                              task.output, queue.ready_count(task.id),
                              int(table.accepting.sum()), t - task.wf.arrival)
        else:
            vec = encode_task(task.compute, task.memory_gb, kids, done, task.output, f)
        fp = task.first_parent
        transfer, parent_slot = 0.0, None
        if fp is not None:
            transfer = fp.output / self.bw + self.lat
            parent_slot = slot_of.get(fp.sid)
        return table.observe(vec, t, transfer, parent_slot, task.memory_gb, self.mask_infeasible)
