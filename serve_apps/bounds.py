"""Per-task caps of the scheduler service, checked when a workflow is submitted (HTTP and handle
alike): what one task may ask for, so that no tenant can hold a server for good with one
accepted task (``SchedulerTuning.max_task_*``, ``max_args_*``). A task over a cap is a 422
``too_large`` naming the field and the cap; nothing is queued.

The caps are not checked again when a journaled workflow is resumed: lowering one must not make
accepted work unrestorable.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from .schemas import RequestError

__all__ = ["check_tasks", "check_args", "args_depth"]


def _too_large(loc: Sequence[Any], what: str, value: float, cap: float, knob: str) -> RequestError:
    return RequestError(tuple(loc), f"{what} {value:g} is over this service's cap of {cap:g} "
                                    f"({knob})", "too_large")


def check_tasks(tasks: Iterable[tuple[Sequence[Any], float, float]], tuning: Any,
                slowest_gflop_s: float | None, time_scale: float) -> None:
    """``tasks``: ``(loc, compute_gflop, memory_gb)`` of each task (``loc`` the field's path
    without its last part). Caps: compute (``max_task_gflop``), memory
    (``max_task_memory_gb``) and the run it implies on the slowest server
    (``max_task_run_s``, model s; ``slowest_gflop_s`` None: no server known, not checked)."""
    for loc, gflop, mem in tasks:
        if gflop > tuning.max_task_gflop:
            raise _too_large((*loc, "compute_gflop"), "compute_gflop", gflop,
                             tuning.max_task_gflop, "max_task_gflop")
        if mem > tuning.max_task_memory_gb:
            raise _too_large((*loc, "memory_gb"), "memory_gb", mem, tuning.max_task_memory_gb,
                             "max_task_memory_gb")
        if slowest_gflop_s:
            run_s = gflop / slowest_gflop_s
            if run_s > tuning.max_task_run_s:
                raise RequestError(
                    (*loc, "compute_gflop"),
                    f"compute_gflop {gflop:g} runs {run_s:.4g} model s on this cluster's slowest "
                    f"server ({slowest_gflop_s:g} GFLOP/s; {run_s * time_scale:.4g} wall s at "
                    f"time_scale {time_scale:g}), over this service's cap of "
                    f"{tuning.max_task_run_s:g} s (max_task_run_s)", "too_large")


def args_depth(value: Any, limit: int) -> int:
    """Container levels of a JSON value (a scalar 0, ``[]`` 1, ``[[1]]`` 2), counted up to
    ``limit`` (iteratively: any depth is safe to measure)."""
    depth, level = 0, [value]
    while level and depth < limit:
        boxes = [v for v in level if isinstance(v, (list, dict))]
        if not boxes:
            break
        depth += 1
        level = [x for b in boxes for x in (b.values() if isinstance(b, dict) else b)]
    return depth


def check_args(loc: Sequence[Any], args: list, kwargs: dict, tuning: Any) -> None:
    """A task's JSON ``args`` and ``kwargs``: each at most ``max_args_depth`` container levels
    inside its own list / dict, and together at most ``max_args_bytes`` as compact JSON."""
    cap = tuning.max_args_depth
    for name, value in (("args", args), ("kwargs", kwargs)):
        if args_depth(value, cap + 2) - 1 > cap:
            raise RequestError((*loc, name), f"nested more than {cap} levels deep (this "
                                             f"service's cap, max_args_depth)", "too_large")
    size = sum(len(json.dumps(v, separators=(",", ":"))) for v in (args, kwargs))
    if size > tuning.max_args_bytes:
        raise RequestError((*loc, "args"), f"args and kwargs take {size} bytes as JSON, over "
                                           f"this service's cap of {tuning.max_args_bytes} "
                                           f"(max_args_bytes)", "too_large")
