"""FlowBench adjacency lists: ``{"node_name": ["child", ...], ...}``, one file, one workflow.

Structure only (Pegasus DAG shapes executed on the PoSeiDon testbed; the adjacency files carry no
measurements), so every node takes a profile: ``pegasus_aux`` for the Pegasus auxiliary jobs
whose names start with one of ``resources.aux_prefixes`` (create_dir, stage_in/out, cleanup,
register), ``pegasus_job`` for the others. All nodes are marked estimated.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import Loaded, OnInvalid, collect, load_files, profile_task, read_json, rel


def parse_adjacency(doc: object, res: ResourceMappingConfig, where: str, name: str) -> WorkflowSpec:
    """One adjacency mapping -> WorkflowSpec; children must be nodes of the mapping."""
    if not isinstance(doc, dict) or not doc:
        raise WorkflowError(f"{where}: expected a non-empty object {{node: [children]}}, "
                            f"got {type(doc).__name__}")
    nodes: dict[str, TaskSpec] = {}
    edges: list[tuple[str, str]] = []
    for node, kids in doc.items():
        if not isinstance(kids, list):
            raise WorkflowError(f"{where}: node {node!r}: children must be a list, got {type(kids).__name__}")
        kind = "pegasus_aux" if node.startswith(tuple(res.aux_prefixes)) else "pegasus_job"
        nodes[node] = profile_task(res, node, kind)
        edges.extend((node, str(c)) for c in kids)
    return topological_spec(name, nodes, edges, where)


def load_flowbench(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid = "raise",
                   family: str = "flowbench") -> Loaded:
    return load_files(paths, load_adjacency_doc, res, on_invalid, family)


def load_adjacency_doc(path: Path, doc: object, res: ResourceMappingConfig, on_invalid: OnInvalid,
                       family: str) -> Loaded:
    """The one workflow of ``path`` (``doc``: its parsed JSON, or None to read it)."""
    def build() -> WorkflowSpec:
        d = read_json(path) if doc is None else doc
        return parse_adjacency(d, res, rel(path), f"{family}/{path.stem}")
    return collect(path, [(f"workflow {path.stem!r}", build)], on_invalid)
