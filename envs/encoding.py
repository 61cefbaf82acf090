"""The one feature encoder (paper §4.1.1), shared by the simulator, Serve and the live scheduler.

Task features (5): compute demand, memory demand, number of successors, completion ratio of its
workflow, output data volume. Server features (5 each): compute capacity, memory capacity,
remaining time of the current task, current power draw, estimated transfer delay from the server
holding the task's first finished parent. All are divided by fixed constants from
:class:`envs.config.FeatureConfig` (never by N or batch statistics) and clipped to [0, clip].

Two entry points share one implementation: :func:`encode_arrays` (vectorised, used by the
simulator on its state arrays) and :func:`encode` (plain descriptions, used by Serve and live).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import FeatureConfig

TASK_FEATURES = ("compute_gflop", "memory_gb", "successors", "completion_ratio", "output_gb")
SERVER_FEATURES = ("compute", "memory_gb", "remaining_s", "power_w", "transfer_s")
TASK_DIM = len(TASK_FEATURES)
SERVER_DIM = len(SERVER_FEATURES)


@dataclass(frozen=True, slots=True)
class TaskView:
    """What the policy needs to know about the task being placed."""
    compute_gflop: float
    memory_gb: float
    output_gb: float = 0.0
    successors: int = 0
    completion_ratio: float = 0.0
    parent_server: int | None = None  # index into the server list of the first finished parent
    parent_output_gb: float = 0.0     # data that parent produced


@dataclass(frozen=True, slots=True)
class ServerView:
    """What the policy needs to know about one server."""
    compute: float
    memory_gb: float
    remaining_s: float = 0.0  # time until its current task finishes (0 = idle)
    power_w: float = 0.0
    accepting: bool = True    # alive and not draining


def transfer_times(n: int, parent_slot: int | None, parent_output_gb: float,
                   bandwidth_gb_s: float, latency_s: float) -> np.ndarray:
    """Per-server transfer delay d/B + L from the parent's server (0 on that server, 0 if none)."""
    out = np.zeros(n, dtype=np.float64)
    if parent_slot is not None:
        out.fill(parent_output_gb / bandwidth_gb_s + latency_s)
        out[parent_slot] = 0.0
    return out


def encode_task(compute_gflop: float, memory_gb: float, successors: float,
                completion_ratio: float, output_gb: float, f: FeatureConfig) -> np.ndarray:
    """Task feature vector (5,) float32."""
    v = np.array((compute_gflop / f.compute_gflop, memory_gb / f.memory_gb,
                  successors / f.successors, completion_ratio, output_gb / f.output_gb),
                 dtype=np.float32)
    return np.clip(v, 0.0, f.clip, out=v)


def encode_arrays(compute: np.ndarray, memory_gb: np.ndarray, remaining_s: np.ndarray,
                  power_w: np.ndarray, transfer_s: np.ndarray, present: np.ndarray,
                  f: FeatureConfig) -> np.ndarray:
    """Server feature matrix (n, 5) float32; rows where ``present`` is False are zero."""
    out = np.empty((compute.shape[0], SERVER_DIM), dtype=np.float32)
    out[:, 0] = compute
    out[:, 0] *= 1.0 / f.server_compute
    out[:, 1] = memory_gb
    out[:, 1] *= 1.0 / f.server_memory_gb
    out[:, 2] = remaining_s
    out[:, 2] *= 1.0 / f.remaining_s
    out[:, 3] = power_w
    out[:, 3] *= 1.0 / f.power_w
    out[:, 4] = transfer_s
    out[:, 4] *= 1.0 / f.transfer_s
    out *= present[:, None]
    np.clip(out, 0.0, f.clip, out=out)
    return out


def feasibility_mask(memory_gb: np.ndarray, accepting: np.ndarray, task_memory_gb: float,
                     mask_infeasible: bool) -> np.ndarray:
    """Action mask (float32, 1 = may be chosen): accepting servers, and with ``mask_infeasible``
    only those whose memory fits the task."""
    m = accepting.copy()
    if mask_infeasible:
        m &= memory_gb >= task_memory_gb
    return m.astype(np.float32)


def encode(task: TaskView, servers: Sequence[ServerView], f: FeatureConfig,
           bandwidth_gb_s: float = 10.0, latency_s: float = 0.01, mask_infeasible: bool = True,
           n_pad: int | None = None) -> dict[str, np.ndarray]:
    """Observation dict ``{task, servers, action_mask}`` from plain descriptions.

    ``n_pad`` pads the server axis with zero rows (mask 0); default: ``len(servers)``.
    """
    n = len(servers)
    n_pad = n if n_pad is None else n_pad
    if n_pad < n:
        raise ValueError(f"n_pad: {n_pad} is smaller than the number of servers ({n})")
    compute = np.zeros(n_pad)
    memory = np.zeros(n_pad)
    remaining = np.zeros(n_pad)
    power = np.zeros(n_pad)
    accepting = np.zeros(n_pad, dtype=bool)
    present = np.zeros(n_pad, dtype=bool)
    for i, s in enumerate(servers):
        compute[i], memory[i], remaining[i], power[i] = s.compute, s.memory_gb, s.remaining_s, s.power_w
        accepting[i] = s.accepting
        present[i] = True
    transfer = transfer_times(n_pad, task.parent_server, task.parent_output_gb, bandwidth_gb_s,
                              latency_s)
    transfer *= present
    return {
        "task": encode_task(task.compute_gflop, task.memory_gb, task.successors,
                            task.completion_ratio, task.output_gb, f),
        "servers": encode_arrays(compute, memory, remaining, power, transfer, present, f),
        "action_mask": feasibility_mask(memory, accepting, task.memory_gb, mask_infeasible),
    }


@dataclass(frozen=True, slots=True)
class DecodedServers:
    """Raw server quantities recovered from an observation (for heuristics)."""
    compute: np.ndarray
    memory_gb: np.ndarray
    remaining_s: np.ndarray
    transfer_s: np.ndarray
    valid: np.ndarray  # action mask as bool


def decode(obs: dict[str, np.ndarray], f: FeatureConfig) -> tuple[np.ndarray, DecodedServers]:
    """Undo the fixed normalisation: (task raw features (5,), server raw quantities).

    Exact except where a feature hit the clip bound.
    """
    t = np.asarray(obs["task"], dtype=np.float64)
    task_raw = t * np.array((f.compute_gflop, f.memory_gb, f.successors, 1.0, f.output_gb))
    s = np.asarray(obs["servers"], dtype=np.float64)
    return task_raw, DecodedServers(
        compute=s[:, 0] * f.server_compute, memory_gb=s[:, 1] * f.server_memory_gb,
        remaining_s=s[:, 2] * f.remaining_s, transfer_s=s[:, 4] * f.transfer_s,
        valid=np.asarray(obs["action_mask"]) > 0.5)
