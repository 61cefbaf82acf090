"""WorFBench gold workflow graphs (``gold_traj/<subset>/graph_eval.json``): a JSON list of
records; the graph is text in the last message (role ``assistant``)::

    Node:
    1: <subtask>
    2: <subtask>
    Edge: (START,1) (1,2) (2,END)

START and END are markers, not tasks. Structure only: every node is an LLM-driven agent step
with the ``agent_step`` profile (estimated). A record without a ``Node:`` list or an ``Edge:``
line, an edge to an undeclared node, or a cycle is invalid.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import Loaded, OnInvalid, collect, load_files, need, profile_task, read_json_list, rel

KIND = "agent_step"
MARKERS = ("START", "END")
_NODE = re.compile(r"^\s*(\d+)\s*[:.]\s*(.*)$")
_EDGE = re.compile(r"\(\s*([^,()\s]+)\s*,\s*([^,()\s]+)\s*\)")


def parse_graph_text(text: str, where: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(node ids in order, edges between nodes) of one WorFBench graph text; markers dropped."""
    if "Node:" not in text:
        raise WorkflowError(f"{where}: graph text has no 'Node:' section")
    if "Edge:" not in text:
        raise WorkflowError(f"{where}: graph text has no 'Edge:' line (truncated?)")
    head, _, tail = text.partition("Edge:")
    nodes = [m.group(1) for line in head.split("Node:", 1)[1].splitlines() if (m := _NODE.match(line))]
    if not nodes:
        raise WorkflowError(f"{where}: graph text declares no nodes")
    seen: set[str] = set()
    for n in nodes:
        if n in seen:
            raise WorkflowError(f"{where}: graph text declares node id {n!r} twice")
        seen.add(n)
    edges = [(a, b) for a, b in _EDGE.findall(tail) if a not in MARKERS and b not in MARKERS]
    return nodes, edges


def parse_worfbench_record(rec: object, res: ResourceMappingConfig, where: str, name: str) -> WorkflowSpec:
    conv = need(rec, "conversations", where, list)
    if not conv:
        raise WorkflowError(f"{where}: field 'conversations' is empty")
    last = conv[-1]
    if need(last, "role", f"{where}: last message") != "assistant":
        raise WorkflowError(f"{where}: the last message is not the assistant's graph")
    ids, edges = parse_graph_text(str(need(last, "content", f"{where}: last message")), where)
    nodes: dict[str, TaskSpec] = {i: profile_task(res, f"step{i}", KIND) for i in ids}
    return topological_spec(name, nodes, edges, where)


def load_worfbench(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid = "raise",
                   family: str = "worfbench") -> Loaded:
    return load_files(paths, load_worfbench_doc, res, on_invalid, family, read=read_json_list)


def load_worfbench_doc(path: Path, doc: list, res: ResourceMappingConfig, on_invalid: OnInvalid,
                       family: str) -> Loaded:
    """The records of ``doc`` (the parsed JSON list of ``path``)."""
    subset = path.parent.name

    def records():
        for i, rec in enumerate(doc):
            rid = rec.get("id", i) if isinstance(rec, dict) else i
            where = f"{rel(path)}: record {i} (id {rid!r})"
            yield where, (lambda rec=rec, where=where, rid=rid: parse_worfbench_record(
                rec, res, where, f"{family}/{subset}/{rid}"))
    return collect(path, records(), on_invalid)
