"""WfFormat 1.5 (WfCommons / WfInstances) workflow instances: one file, one workflow.

``workflow.specification.tasks[]`` gives ``id``, ``parents``, ``children``, ``inputFiles``,
``outputFiles``; ``workflow.specification.files[]`` gives ``id``, ``sizeInBytes``;
``workflow.execution.tasks[]`` gives ``id``, ``runtimeInSeconds``, ``avgCPU`` (percent of one core)
and sometimes ``memoryInBytes``.

Demands (all measured but memory where the trace lacks it):
- compute_gflop = runtimeInSeconds x avgCPU / 100 x ``reference_gflop_per_core_s``
  (floored at ``min_compute_gflop``; a missing avgCPU counts as one full core and marks the task
  estimated);
- memory_gb = memoryInBytes / 1e9 (clipped to ``max_memory_gb``), else the ``pegasus_job`` profile;
- output_gb = the largest edge: bytes of the files that the task writes and one child reads.

Parents and children must agree (``A`` lists child ``B`` iff ``B`` lists parent ``A``); links to
unknown tasks or files, cycles and missing fields raise WorkflowError naming the file and task.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import (BYTES_PER_GB, MAX_BYTES, MAX_RUNTIME_S, Loaded, OnInvalid, collect, load_files,
                     measured_task, need, number, read_json, rel)

KIND = "pegasus_job"
SCHEMA_VERSIONS = ("1.5",)


def _edges(by_id: dict[str, dict], where: str) -> list[tuple[str, str]]:
    """(parent, child) of every edge; parents and children must list each other."""
    edges: list[tuple[str, str]] = []
    for tid, t in by_id.items():
        tw = f"{where}: task {tid!r}"
        for p in need(t, "parents", tw, list):
            if p not in by_id:
                raise WorkflowError(f"{tw}: parent {p!r} is not a task of this workflow")
            if tid not in by_id[p].get("children", []):
                raise WorkflowError(f"{tw}: lists parent {p!r}, but {p!r} does not list it as "
                                    f"a child")
            edges.append((p, tid))
        for c in t.get("children", []):
            if c not in by_id:
                raise WorkflowError(f"{tw}: child {c!r} is not a task of this workflow")
            if tid not in by_id[c].get("parents", []):
                raise WorkflowError(f"{tw}: lists child {c!r}, but {c!r} does not list it as "
                                    f"a parent")
    return edges


def parse_wfformat(doc: object, res: ResourceMappingConfig, where: str, name: str) -> WorkflowSpec:
    """One WfFormat document -> WorkflowSpec."""
    version = str(need(doc, "schemaVersion", where))
    if version not in SCHEMA_VERSIONS:
        raise WorkflowError(f"{where}: unsupported WfFormat schemaVersion {version!r}; "
                            f"supported: {list(SCHEMA_VERSIONS)}")
    wf = need(doc, "workflow", where, dict)
    spec = need(wf, "specification", f"{where}: workflow", dict)
    execution = need(wf, "execution", f"{where}: workflow", dict)
    stasks = need(spec, "tasks", f"{where}: workflow.specification", list)
    sizes: dict[str, float] = {}
    for i, f in enumerate(need(spec, "files", f"{where}: workflow.specification", list)):
        fw = f"{where}: workflow.specification.files[{i}]"
        sizes[str(need(f, "id", fw))] = number(f, "sizeInBytes", fw, MAX_BYTES)
    runs: dict[str, dict] = {}
    for i, t in enumerate(need(execution, "tasks", f"{where}: workflow.execution", list)):
        runs[str(need(t, "id", f"{where}: workflow.execution.tasks[{i}]"))] = t

    by_id: dict[str, dict] = {}
    for i, t in enumerate(stasks):
        tid = str(need(t, "id", f"{where}: workflow.specification.tasks[{i}]"))
        if tid in by_id:
            raise WorkflowError(f"{where}: task {tid!r} appears twice in workflow.specification.tasks")
        by_id[tid] = t
    edges = _edges(by_id, where)

    def files(t: dict, key: str, tw: str) -> set[str]:
        names = set(need(t, key, tw, list))
        unknown = sorted(names - set(sizes))
        if unknown:
            raise WorkflowError(f"{tw}: {key} names unknown file {unknown[0]!r}")
        return names

    nodes: dict[str, TaskSpec] = {}
    for tid, t in by_id.items():
        tw = f"{where}: task {tid!r}"
        outs = files(t, "outputFiles", tw)
        edge_bytes = [sum(sizes[f] for f in outs & files(by_id[c], "inputFiles", f"{where}: task {c!r}"))
                      for c in t.get("children", [])]
        if tid not in runs:
            raise WorkflowError(f"{tw}: no record in workflow.execution.tasks")
        run = runs[tid]
        rw = f"{where}: workflow.execution task {tid!r}"
        runtime = number(run, "runtimeInSeconds", rw, MAX_RUNTIME_S)
        cpu = number(run, "avgCPU", rw) / 100.0 if run.get("avgCPU") is not None else None
        mem = number(run, "memoryInBytes", rw, MAX_BYTES) / BYTES_PER_GB if run.get("memoryInBytes") is not None else None
        spec_t = measured_task(res, tid, runtime * (1.0 if cpu is None else cpu), mem,
                               max(edge_bytes, default=0.0) / BYTES_PER_GB, KIND)
        if cpu is None and not spec_t.estimated:
            spec_t = TaskSpec(spec_t.compute_gflop, spec_t.memory_gb, spec_t.output_gb, (), tid, True)
        nodes[tid] = spec_t
    return topological_spec(name, nodes, edges, where)


def load_wfformat(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid = "raise",
                  family: str = "wfinstances") -> Loaded:
    """Each file is one workflow (named ``<family>/<file stem>``)."""
    return load_files(paths, load_wfformat_doc, res, on_invalid, family)


def load_wfformat_doc(path: Path, doc: object, res: ResourceMappingConfig, on_invalid: OnInvalid,
                      family: str) -> Loaded:
    """The one workflow of ``path`` (``doc``: its parsed JSON, or None to read it)."""
    def build() -> WorkflowSpec:
        d = read_json(path) if doc is None else doc
        return parse_wfformat(d, res, rel(path), f"{family}/{path.stem}")
    return collect(path, [(f"workflow {path.stem!r}", build)], on_invalid)
