"""The feature encoder in Ray's resource model (``envs.nodes``): what a learned policy sees of a
task and of each node when it places the task (the slot model's encoder is ``envs.encoding``).

Every feature is divided by a fixed constant (never by N or batch statistics, so a policy trained
on 16 nodes reads 64 or 256 the same way) and clipped to ``[0, CLIP]``.

Task features (:data:`TASK_FEATURES`): its compute (seconds at speed 1), its CPU, GPU and memory
demands, whether it is GPU work, its request's completion ratio and age, its children. (What a
node policy is given, ``envs.node_sim.Policy``: the table, the task and the clock.)

Node features (:data:`NODE_FEATURES`), for this task on each node: its run there (compute / the
node's speed for the task's kind), how long until it fits there (0: now; :data:`CLIP`: never),
whether it fits now, the node's free CPU, GPU and memory fractions, its speed for the task's kind,
the tasks it runs, whether it has a GPU. Run and start together are what EFT minimises, so a
policy can learn EFT, and waiting for a faster node, from these columns alone.

NumPy and stdlib only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .nodes import GPU, MEMORY, NodeTable

__all__ = ["TASK_FEATURES", "NODE_FEATURES", "TASK_DIM", "NODE_DIM", "CLIP", "TIME_UNIT_S",
           "encode_task", "encode_nodes"]

TASK_FEATURES = ("compute_s", "cpu", "gpu", "memory_gb", "gpu_work", "completion_ratio",
                 "request_age_s", "children")
NODE_FEATURES = ("run_s", "start_in_s", "fits_now", "free_cpu", "free_gpu", "free_memory",
                 "speed", "running", "has_gpu")
TASK_DIM, NODE_DIM = len(TASK_FEATURES), len(NODE_FEATURES)
CLIP = 10.0
TIME_UNIT_S = 10.0  # seconds (agents.yaml: calls of 3-4 s at speed 1, requests of 10-30 s)
CPU_UNIT = 16.0  # CPUs (agents.yaml's largest node)
MEMORY_UNIT_GB = 64.0
SPEED_UNIT = 4.0
RUNNING_UNIT = 16.0
CHILDREN_UNIT = 8.0


def encode_task(task: Any, now: float) -> np.ndarray:
    """The task's features (:data:`TASK_FEATURES`)."""
    d = dict(task.demands)
    wf = task.wf
    x = np.array([task.compute / TIME_UNIT_S, d.get("CPU", 0.0) / CPU_UNIT, d.get(GPU, 0.0),
                  d.get(MEMORY, 0.0) / MEMORY_UNIT_GB, float(GPU in d),
                  wf.done / max(len(wf.tasks), 1), (now - wf.arrival) / TIME_UNIT_S,
                  len(task.children) / CHILDREN_UNIT],
                 dtype=np.float32)
    return np.minimum(np.maximum(x, 0.0), CLIP, out=x)


def encode_nodes(table: NodeTable, task: Any, now: float, out: np.ndarray) -> np.ndarray:
    """Each node's features for ``task`` into the first ``table.n`` rows of ``out`` (n_max x
    :data:`NODE_DIM`, float32; the padding rows are zeroed), and the action mask: 1 where the
    task fits now (the valid picks). Waits are left out of the action space: a wait costs no
    time at its step, so under a per-step discount a policy learns to put costs off by waiting
    (a first run of configs/train/scale_nodes.yaml did: no episode ended in 62,000 steps),
    and EFT, which never waits, is not beaten by waiting here (results/resource_model)."""
    n = table.n
    out[:] = 0.0
    mask = np.zeros(out.shape[0], dtype=np.float32)
    demands = task.demands
    i_cpu, i_mem = table.index.get("CPU"), table.index.get(MEMORY)
    for i in range(n):
        row = out[i]
        total, free = table.total[i], table.free[i]
        row[3] = free[i_cpu] / total[i_cpu] if i_cpu is not None and total[i_cpu] > 0 else 0.0
        g_total = table.gpu_total[i]
        row[4] = sum(table.gpus[i]) / g_total if g_total > 0 else 0.0
        row[5] = free[i_mem] / total[i_mem] if i_mem is not None and total[i_mem] > 0 else 0.0
        row[6] = table.speed(i, demands) / SPEED_UNIT
        row[7] = len(table.running[i]) / RUNNING_UNIT
        row[8] = float(table.has_gpu[i])
        start = table.earliest_fit(i, demands, now)
        if math.isinf(start):
            row[0] = row[1] = CLIP
            continue
        row[0] = table.run_time(i, task) / TIME_UNIT_S
        row[1] = (start - now) / TIME_UNIT_S
        if start <= now:
            row[2] = mask[i] = 1.0
    np.minimum(np.maximum(out, 0.0, out=out), CLIP, out=out)
    return mask
