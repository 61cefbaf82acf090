"""The env configs of the real-DAG workload families (``configs/env/workloads/<family>.yaml``):
which file selects a family, its validated EnvConfig, and the ``features.workload_scale`` of a set
of workflows. Used by `scale-ray eval --workload`, `scale-ray workloads` and the family comparison
(:mod:`scale_ray.workload_compare`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence

from envs import loaders
from envs.config import EnvConfig, WorkloadConfig
from scale_ray.config import CONFIG_DIR, load_env

WORKLOAD_CONFIG_DIR = CONFIG_DIR / "env" / "workloads"


def family_names() -> list[str]:
    """Names of the real-DAG workload families (``--list-workloads``)."""
    return loaders.family_names()


def workload_config_path(family: str) -> tuple[Path, bool]:
    """(env config of ``family``, whether the source must be overridden). A finer family
    (``wfinstances-montage``) without its own file uses its parent's (``wfinstances.yaml``)."""
    names = family_names()
    if family not in names:
        raise ValueError(f"--workload: unknown family {family!r}; known: {', '.join(names)}")
    own = WORKLOAD_CONFIG_DIR / f"{family}.yaml"
    if own.is_file():
        return own, False
    parent = WORKLOAD_CONFIG_DIR / f"{family.split('-')[0]}.yaml"
    if parent.is_file():
        return parent, True
    raise ValueError(f"--workload: no env config for {family!r} (looked for {own} and {parent})")


def workload_env_args(family: str, env_config: str | None,
                      sets: Sequence[str]) -> tuple[str, list[str]]:
    """The ``--env-config`` and ``--set`` list that select ``family`` (for `scale-ray eval`)."""
    if env_config is not None:
        raise ValueError("--workload and --env-config are exclusive: --workload picks "
                         "configs/env/workloads/<family>.yaml (use --set to change it)")
    path, override = workload_config_path(family)
    return str(path), ([f"workload.source={family}"] if override else []) + list(sets)


def family_env(family: str, sets: Sequence[str] = ()) -> EnvConfig:
    """The validated EnvConfig of ``family``."""
    path, sets2 = workload_env_args(family, None, sets)
    return load_env(path, sets2)


def workload_scale(workflows: Sequence[Any]) -> float:
    """``features.workload_scale`` for these workflows: their mean task compute over the mean
    of the paper's generator (``workload.compute_gflop.mean``, 4 GFLOP), to 3 significant
    digits. With it a trained policy sees their compute and busy times in the units it was
    trained in (docs/workloads.md, "Features that transfer")."""
    tasks = [t.compute_gflop for wf in workflows for t in wf.tasks]
    k = statistics.fmean(tasks) / WorkloadConfig().compute_gflop.mean
    return float(f"{k:.3g}")
