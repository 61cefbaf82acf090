"""The live scheduler's DAG files (``scale-ray run-workflows --dag``), JSON or YAML::

    {"workflows": [{"name": str, "tasks": [{"name", "compute_gflop", "memory_gb", "output_gb",
                                            "parents": [names]}]}]}

or one workflow mapping (``{"name", "tasks"}``) at the top level. The demands are given, not
mapped: ``compute_gflop`` > 0 (at most 1e9 GFLOP, 1e7 s on a 100 GFLOP/s server), ``memory_gb``
and ``output_gb`` >= 0 (at most 1e6 GB, 1 PB; default 0). Tasks may be listed in any order;
cycles, unknown parents, duplicate names, unknown keys and bad values are rejected naming the
file, workflow and task. Nodes are not marked estimated. Optional per task: ``kind`` (the
primitive it calls; the simulator's run-time model learns per kind, envs/runtime.py) and
``hedge`` (true: it may be backed up when it straggles, ``runtime.hedge: marked``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import MAX_MEMORY_GB, MAX_RUNTIME_S, Loaded, OnInvalid, collect, rel

MAX_COMPUTE_GFLOP = MAX_RUNTIME_S * 100.0  # 1e7 s on a 100 GFLOP/s server
TASK_KEYS = ("name", "compute_gflop", "memory_gb", "output_gb", "parents", "kind", "hedge")
LIMITS = {"compute_gflop": (True, MAX_COMPUTE_GFLOP), "memory_gb": (False, MAX_MEMORY_GB),
          "output_gb": (False, MAX_MEMORY_GB)}


def check_hint(name: str, fname: str, value: Any, positive: bool, hi: float | None = None) -> float:
    """A finite number >= 0 (> 0 when ``positive``; at most ``hi``), else WorkflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value <= 0) or (hi is not None and value > hi):
        rule = "> 0" if positive else ">= 0"
        rule += f" and <= {hi:g}" if hi is not None else ""
        raise WorkflowError(f"primitive {name!r}: {fname} must be a finite number {rule}, got {value!r}")
    return float(value)


def _task(wf: str, rec: Any, i: int, where: str) -> tuple[str, TaskSpec, list[str]]:
    if not isinstance(rec, Mapping):
        raise WorkflowError(f"{where}: workflow {wf!r}: tasks[{i}] must be a mapping")
    unknown = sorted(set(rec) - set(TASK_KEYS))
    if unknown:
        raise WorkflowError(f"{where}: workflow {wf!r}: tasks[{i}]: unknown key {unknown[0]!r}; "
                            f"allowed keys: {sorted(TASK_KEYS)}")
    name = str(rec.get("name", f"t{i}"))
    if "compute_gflop" not in rec:
        raise WorkflowError(f"{where}: workflow {wf!r}: task {name!r}: compute_gflop is required")
    vals = {}
    for key, (positive, hi) in LIMITS.items():
        try:
            vals[key] = check_hint(name, key, rec.get(key, 0.0), positive, hi)
        except WorkflowError as e:
            raise WorkflowError(f"{where}: workflow {wf!r}: {e}") from None
    parents = rec.get("parents", [])
    if not isinstance(parents, list) or not all(isinstance(p, (str, int)) for p in parents):
        raise WorkflowError(f"{where}: workflow {wf!r}: task {name!r}: parents must be a list of "
                            f"task names")
    kind = rec.get("kind", "")
    if not isinstance(kind, str) or len(kind) > 200:
        raise WorkflowError(f"{where}: workflow {wf!r}: task {name!r}: kind must be a string of "
                            f"at most 200 characters, got {kind!r}")
    hedge = rec.get("hedge", False)
    if not isinstance(hedge, bool):
        raise WorkflowError(f"{where}: workflow {wf!r}: task {name!r}: hedge must be true or "
                            f"false, got {hedge!r}")
    return name, TaskSpec(vals["compute_gflop"], vals["memory_gb"], vals["output_gb"], (), name,
                          False, kind, hedge), [str(p) for p in parents]


def workflow_records(data: Any, where: str) -> list[Any]:
    """The workflow mappings of a parsed DAG file (``workflows`` list or one workflow)."""
    if isinstance(data, Mapping) and "workflows" in data:
        wfs = data["workflows"]
        if not isinstance(wfs, list) or not wfs:
            raise WorkflowError(f"{where}: 'workflows' must be a non-empty list")
        return wfs
    if isinstance(data, Mapping) and "tasks" in data:
        return [data]
    raise WorkflowError(f"{where}: expected a mapping with 'workflows' or 'tasks'")


def parse_dag_workflow(wf: Any, k: int, where: str) -> WorkflowSpec:
    """One workflow mapping (``workflows[k]``) -> WorkflowSpec."""
    if not isinstance(wf, Mapping) or not isinstance(wf.get("tasks"), list) or not wf["tasks"]:
        raise WorkflowError(f"{where}: workflows[{k}] needs a non-empty 'tasks' list")
    name = str(wf.get("name", f"workflow{k}"))
    nodes: dict[str, TaskSpec] = {}
    edges: list[tuple[str, str]] = []
    for i, rec in enumerate(wf["tasks"]):
        tname, spec, parents = _task(name, rec, i, where)
        if tname in nodes:
            raise WorkflowError(f"{where}: workflow {name!r}: duplicate task name {tname!r}")
        nodes[tname] = spec
        edges.extend((p, tname) for p in parents)
    for p, c in edges:
        if p not in nodes:
            raise WorkflowError(f"{where}: workflow {name!r}: task {c!r} names unknown parent {p!r}")
    return topological_spec(name, nodes, edges, where)


def parse_dag(data: Any, where: str = "<dag>") -> list[WorkflowSpec]:
    """Workflows from the live DAG format (already parsed JSON/YAML); the first invalid one
    raises WorkflowError naming ``where``."""
    return [parse_dag_workflow(wf, k, where) for k, wf in enumerate(workflow_records(data, where))]


def load_live_doc(path: Path, doc: Any, on_invalid: OnInvalid = "raise") -> Loaded:
    """The workflows of ``doc`` (the parsed file ``path``); each workflow is one record."""
    where = rel(path)
    wfs = workflow_records(doc, where)
    return collect(path, [(f"{where}: workflows[{k}]",
                           lambda wf=wf, k=k: parse_dag_workflow(wf, k, where))
                          for k, wf in enumerate(wfs)], on_invalid)
