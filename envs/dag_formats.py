"""The DAG file formats, one registry (stdlib only): each format's name and how it is recognised
from a file's parsed content (never from its name). ``envs.config`` builds
``workload.dag_format``'s choices from :data:`NAMES`, ``envs.loaders.dags`` detects with
:func:`format_of` and loads with its loader of each name, the command line's ``--dag-format``
lists them.

One object (JSON or YAML) is the first format in :data:`OBJECT_ORDER` whose ``doc`` rule
matches; a list (a JSON list or JSON lines) is the format most of its records match (a few
damaged records do not hide it), each record counted for the first of :data:`RECORD_ORDER`
whose ``record`` rule matches (a tie goes to the first in :data:`NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["FormatRule", "RULES", "NAMES", "format_of"]


@dataclass(frozen=True)
class FormatRule:
    name: str
    recognised_by: str
    doc: Callable[[dict], bool] | None = None  # one object is this format
    record: Callable[[Any], bool] | None = None  # a record of a list is this format


def _flowbench(doc: dict) -> bool:
    return all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in doc.values())


RULES: dict[str, FormatRule] = {r.name: r for r in (
    FormatRule("wfformat", "an object with schemaVersion and workflow (WfFormat / WfInstances)",
               doc=lambda d: "schemaVersion" in d and "workflow" in d),
    FormatRule("worfbench", "a JSON list whose records have conversations (WorFBench gold graphs)",
               record=lambda r: isinstance(r, dict) and "conversations" in r),
    FormatRule("flowbench", "an object whose every value is a list of node names (FlowBench)",
               doc=_flowbench),
    FormatRule("dagbench", "an object with task_graph (DAGBench)",
               doc=lambda d: "task_graph" in d),
    FormatRule("nestful", "a JSON list whose records have an output list of calls (NESTFUL)",
               record=lambda r: isinstance(r, dict) and isinstance(r.get("output"), list)),
    FormatRule("taskplan", "JSON-lines records, a JSON list or one object with task_nodes "
                           "(TaskBench, GNN4TaskPlan, RestBench-TMDB plans)",
               doc=lambda d: "task_nodes" in d,
               record=lambda r: isinstance(r, dict) and "task_nodes" in r),
    FormatRule("live", "an object with workflows or a tasks list (the live scheduler's DAG "
                       "files)",
               doc=lambda d: "workflows" in d or isinstance(d.get("tasks"), list)),
)}
NAMES: tuple[str, ...] = tuple(RULES)
OBJECT_ORDER = ("wfformat", "dagbench", "live", "taskplan", "flowbench")
RECORD_ORDER = ("worfbench", "taskplan", "nestful")


def _list_format(records: list) -> str | None:
    votes = {n: 0 for n in NAMES if RULES[n].record is not None}  # ties: registry order
    for r in records:
        name = next((n for n in RECORD_ORDER if RULES[n].record(r)), None)
        if name is not None:
            votes[name] += 1
    best = max(votes, key=votes.__getitem__)
    return best if votes[best] else None


def format_of(kind: str, doc: Any) -> str | None:
    """The format of a file parsed as ``kind`` (``json``, ``jsonl``: a list of (line, record),
    ``yaml``), or None when none matches."""
    if kind == "jsonl":
        return _list_format([r for _, r in doc])
    if isinstance(doc, list):
        return _list_format(doc)
    if not isinstance(doc, dict) or not doc:
        return None
    return next((n for n in OBJECT_ORDER if RULES[n].doc(doc)), None)
