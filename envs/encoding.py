"""The one feature encoder (paper §4.1.1), shared by the simulator, Serve and the live scheduler.

Task features (5): compute demand, memory demand, number of successors, completion ratio of its
workflow, output data volume. Server features (5 each): compute capacity, memory capacity,
remaining time of the current task, current power draw, estimated transfer delay from the server
holding the task's first finished parent. All are divided by fixed constants from
:class:`envs.config.FeatureConfig` (never by N or batch statistics) and clipped to [0, clip];
compute and remaining time also by ``workload_scale`` (1 for the paper's workload; a real
family's typical task size relative to the paper's, so a trained policy sees familiar values).
Beyond the paper, ``features.backlog`` appends two task columns (:func:`backlog_features`): ready
tasks per accepting server and the workflow's age.

Two entry points share one implementation, :class:`ServerFeatures`: the simulator keeps one
up to date incrementally; :func:`encode` (plain descriptions, used by Serve and the live
scheduler) fills one from a server list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import FeatureConfig

TASK_FEATURES = ("compute_gflop", "memory_gb", "successors", "completion_ratio", "output_gb")
SERVER_FEATURES = ("compute", "memory_gb", "remaining_s", "power_w", "transfer_s")
TASK_DIM = len(TASK_FEATURES)
# beyond the paper (features.backlog): appended to the task vector (see backlog_features)
BACKLOG_FEATURES = ("ready_per_server", "workflow_age_s")
# The clip ufunc without np.clip's Python-level dispatch (about 3 us per call saved).
_clip_ufunc = getattr(np, "_core", getattr(np, "core", None)).umath.clip
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
    has_parent: bool | None = None    # a finished parent exists (default: parent_server given);
    # True with parent_server None means the parent's server is gone: transfer from everywhere
    # features.backlog only: ready tasks now (this one included) and its workflow's age
    ready_tasks: int = 1
    workflow_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ServerView:
    """What the policy needs to know about one server."""
    compute: float
    memory_gb: float
    remaining_s: float = 0.0  # time until its current task finishes (0 = idle)
    power_w: float = 0.0
    accepting: bool = True    # alive and not draining


def task_dim(f: FeatureConfig) -> int:
    """Width of the task feature vector under ``f`` (5, or 7 with ``features.backlog``)."""
    return TASK_DIM + (len(BACKLOG_FEATURES) if f.backlog else 0)


def backlog_features(ready_tasks: int, accepting_servers: int, workflow_age_s: float,
                     f: FeatureConfig) -> tuple[float, float]:
    """The two ``features.backlog`` task columns: ready tasks (the one being placed included)
    per accepting server (/ ``backlog_per_server``), and the age of the task's workflow,
    now - arrival (/ ``time_unit``); both clipped to [0, clip]."""
    per_server = ready_tasks / max(accepting_servers, 1)
    return (min(per_server / f.backlog_per_server, f.clip),
            min(max(workflow_age_s, 0.0) / f.time_unit, f.clip))


def with_backlog(task: np.ndarray, ready_tasks: int, accepting_servers: int,
                 workflow_age_s: float, f: FeatureConfig) -> np.ndarray:
    """``task`` (the paper's five, float32) with the two backlog columns appended (7,)."""
    return np.append(task, backlog_features(ready_tasks, accepting_servers, workflow_age_s, f)
                     ).astype(np.float32)


def encode_task(compute_gflop: float, memory_gb: float, successors: float,
                completion_ratio: float, output_gb: float, f: FeatureConfig) -> np.ndarray:
    """Task feature vector (5,) float32."""
    c = f.clip
    # min(max(v, 0.0), c) written as comparisons (the hot path of every decision; the same
    # value for every float, NaN and -0.0 included)
    a = compute_gflop / f.compute_unit
    b = memory_gb / f.memory_gb
    d = successors / f.successors
    e = completion_ratio
    g = output_gb / f.output_gb
    return np.array((c if a > c else (0.0 if a < 0.0 else a),
                     c if b > c else (0.0 if b < 0.0 else b),
                     c if d > c else (0.0 if d < 0.0 else d),
                     c if e > c else (0.0 if e < 0.0 else e),
                     c if g > c else (0.0 if g < 0.0 else g)), dtype=np.float32)


class ServerFeatures:
    """Server feature matrix kept up to date incrementally (the simulator's hot path).

    Static columns (compute, memory) and the power column change only when a server joins,
    leaves, starts or finishes; :meth:`render` fills the time-dependent columns (remaining busy
    time, transfer delay) and returns a fresh (n, 5) float32 array. Slots without a server are
    zero rows. Invariant: ``busy_until[slot] <= t`` for idle slots, so remaining time is
    ``max(busy_until - t, 0)``.
    """

    def __init__(self, n: int, f: FeatureConfig):
        self.f = f
        self.n = n
        # The rows between renders (public: the server table writes the power column when a
        # server starts or finishes). Column 4 holds 1.0 for present servers (scaled to the
        # transfer delay in the rendered copy), so padding rows stay zero without an extra mask.
        self.matrix = np.zeros((n, SERVER_DIM), dtype=np.float32)
        # Contiguous scratch rows for the time-dependent columns: a ufunc writing straight into a
        # strided column of the (n, 5) matrix costs about 1 us at N = 48, a contiguous one about
        # 0.4 us, and one strided assignment 0.2 us. Same dtype and operation order as writing
        # into the column, so the result is bit-identical.
        self._present = np.zeros(n, dtype=np.float32)
        self._rem = np.empty(n, dtype=np.float32)
        self._rem64 = np.empty(n, dtype=np.float64)
        self._transfer = np.empty(n, dtype=np.float32)
        self._inv_rem = 1.0 / f.time_unit
        self._transfer_unit = f.transfer_s
        self._clip = float(f.clip)

    def copy(self) -> "ServerFeatures":
        """An independent copy (a fork's server table); its scratch rows are fresh, so two
        copies never share them."""
        out = object.__new__(ServerFeatures)
        out.__dict__.update(self.__dict__)
        out.matrix = self.matrix.copy()
        out._present = self._present.copy()
        out._rem = np.empty_like(self._rem)
        out._rem64 = np.empty_like(self._rem64)
        out._transfer = np.empty_like(self._transfer)
        return out

    def set_server(self, slot: int, compute: float, memory_gb: float, power_w: float) -> None:
        f = self.f
        row = self.matrix[slot]
        row[0] = min(compute / f.server_compute, f.clip)
        row[1] = min(memory_gb / f.server_memory_gb, f.clip)
        row[3] = min(power_w / f.power_w, f.clip)
        row[4] = 1.0
        self._present[slot] = 1.0

    def set_servers(self, compute: np.ndarray, memory_gb: np.ndarray, power_w: np.ndarray) -> None:
        """Fill rows ``0..len(compute)-1`` at once (same arithmetic as :meth:`set_server`)."""
        f = self.f
        k = len(compute)
        feat = self.matrix
        feat[:k, 0] = np.minimum(np.asarray(compute, dtype=np.float64) / f.server_compute, f.clip)
        feat[:k, 1] = np.minimum(np.asarray(memory_gb, dtype=np.float64) / f.server_memory_gb, f.clip)
        feat[:k, 3] = np.minimum(np.asarray(power_w, dtype=np.float64) / f.power_w, f.clip)
        feat[:k, 4] = 1.0
        self._present[:k] = 1.0

    def power_feature(self, power_w: float) -> float:
        """The normalised power column value for ``power_w`` (precomputed by the simulator)."""
        return min(power_w / self.f.power_w, self.f.clip)

    def clear(self, slot: int) -> None:
        self.matrix[slot] = 0.0
        self._present[slot] = 0.0

    def render(self, busy_until: np.ndarray, t: float, transfer_s: float,
               parent_slot: int | None) -> np.ndarray:
        """Features at time ``t``; ``transfer_s`` applies to every server but ``parent_slot``."""
        out = self.matrix.copy()
        rem = self._rem  # remaining busy time: (busy_until - t) / remaining_s, clipped
        np.subtract(busy_until, t, out=self._rem64)  # then cast: cheaper than a casting ufunc
        rem[:] = self._rem64
        np.multiply(rem, self._inv_rem, out=rem)
        _clip_ufunc(rem, 0.0, self._clip, out=rem)
        out[:, 2] = rem
        if transfer_s:
            x = transfer_s / self._transfer_unit
            np.multiply(self._present, x if x < self._clip else self._clip, out=self._transfer)
            out[:, 4] = self._transfer
        else:
            out[:, 4] = 0.0
        if parent_slot is not None:
            out[parent_slot, 4] = 0.0
        return out


def encode(task: TaskView, servers: Sequence[ServerView], f: FeatureConfig,
           bandwidth_gb_s: float = 10.0, latency_s: float = 0.01, mask_infeasible: bool = True,
           n_pad: int | None = None) -> dict[str, np.ndarray]:
    """Observation dict ``{task, servers, action_mask}`` from plain descriptions.

    The same computation as the simulator's (:class:`ServerFeatures`). ``n_pad`` pads the server
    axis with zero rows (mask 0); default ``len(servers)``. ``mask_infeasible`` also masks servers
    whose memory is too small for the task.
    """
    n = len(servers)
    n_pad = n if n_pad is None else n_pad
    if n_pad < n:
        raise ValueError(f"n_pad: {n_pad} is smaller than the number of servers ({n})")
    buf = ServerFeatures(n_pad, f)
    memory = np.array([s.memory_gb for s in servers], dtype=np.float64)
    buf.set_servers(np.array([s.compute for s in servers], dtype=np.float64), memory,
                    np.array([s.power_w for s in servers], dtype=np.float64))
    remaining = np.zeros(n_pad)
    remaining[:n] = [s.remaining_s for s in servers]
    mask = np.zeros(n_pad, dtype=np.float32)
    ok = np.array([s.accepting for s in servers], dtype=bool)
    if mask_infeasible:
        ok &= memory >= task.memory_gb
    mask[:n] = ok
    transfer = 0.0
    has_parent = task.parent_server is not None if task.has_parent is None else task.has_parent
    if has_parent:
        transfer = task.parent_output_gb / bandwidth_gb_s + latency_s
    feat_task = encode_task(task.compute_gflop, task.memory_gb, task.successors,
                            task.completion_ratio, task.output_gb, f)
    if f.backlog:  # accepting servers: those in the list that are accepting
        feat_task = with_backlog(feat_task, task.ready_tasks, sum(1 for s in servers if s.accepting),
                                 task.workflow_age_s, f)
    return {
        "task": feat_task,
        "servers": buf.render(remaining, 0.0, transfer, task.parent_server),
        "action_mask": mask,
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
    t = np.asarray(obs["task"], dtype=np.float64)[..., :TASK_DIM]  # backlog features: not needed
    task_raw = t * np.array((f.compute_unit, f.memory_gb, f.successors, 1.0, f.output_gb))
    s = np.asarray(obs["servers"], dtype=np.float64)
    return task_raw, DecodedServers(
        compute=s[:, 0] * f.server_compute, memory_gb=s[:, 1] * f.server_memory_gb,
        remaining_s=s[:, 2] * f.time_unit, transfer_s=s[:, 4] * f.transfer_s,
        valid=np.asarray(obs["action_mask"]) > 0.5)
