"""DAGBench task graphs: ``{"task_graph": {"tasks": [{"name", "cost"}], "dependencies":
[{"source", "target", "size"}]}}``, one file, one workflow; cost in ms, size in bytes.

The two GPT-2 tensor-sharded graphs carry measured per-operator compute time (dagprofiler, one
process per operator, counted as one core): compute_gflop = cost_ms / 1000 x
``reference_gflop_per_core_s`` (floored at ``min_compute_gflop``); output_gb = the largest
outgoing dependency's bytes / 1e9. Memory is not measured: the ``tensor_op`` profile (estimated).
"""

from __future__ import annotations

from pathlib import Path

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import (BYTES_PER_GB, MAX_BYTES, MAX_RUNTIME_S, Loaded, OnInvalid, collect, load_files,
                     measured_task, need, number, read_json, rel)

KIND = "tensor_op"


def parse_dagbench(doc: object, res: ResourceMappingConfig, where: str, name: str) -> WorkflowSpec:
    graph = need(doc, "task_graph", where, dict)
    tasks = need(graph, "tasks", f"{where}: task_graph", list)
    deps = need(graph, "dependencies", f"{where}: task_graph", list)
    cost_ms: dict[str, float] = {}
    for i, t in enumerate(tasks):
        tw = f"{where}: task_graph.tasks[{i}]"
        tname = str(need(t, "name", tw))
        if tname in cost_ms:
            raise WorkflowError(f"{tw}: task name {tname!r} appears twice")
        cost_ms[tname] = number(t, "cost", f"{tw} ({tname!r})", MAX_RUNTIME_S * 1000.0)
    out_bytes = {n: 0.0 for n in cost_ms}
    edges: list[tuple[str, str]] = []
    for i, d in enumerate(deps):
        dw = f"{where}: task_graph.dependencies[{i}]"
        src, dst = str(need(d, "source", dw)), str(need(d, "target", dw))
        size = number(d, "size", dw, MAX_BYTES)
        edges.append((src, dst))
        if src in out_bytes:
            out_bytes[src] = max(out_bytes[src], size)
    nodes: dict[str, TaskSpec] = {
        n: measured_task(res, n, ms / 1000.0, None, out_bytes[n] / BYTES_PER_GB, KIND)
        for n, ms in cost_ms.items()}
    return topological_spec(name, nodes, edges, where)


def load_dagbench(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid = "raise",
                  family: str = "dagbench") -> Loaded:
    return load_files(paths, load_dagbench_doc, res, on_invalid, family)


def load_dagbench_doc(path: Path, doc: object, res: ResourceMappingConfig, on_invalid: OnInvalid,
                      family: str) -> Loaded:
    """The one workflow of ``path`` (``doc``: its parsed JSON, or None to read it)."""
    label = path.parent.name if path.name == "graph.json" else path.stem

    def build() -> WorkflowSpec:
        d = read_json(path) if doc is None else doc
        return parse_dagbench(d, res, rel(path), f"{family}/{label}")
    return collect(path, [(f"workflow {label!r}", build)], on_invalid)
