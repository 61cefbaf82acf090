"""NESTFUL nested API-call sequences: a JSON list of records whose ``output`` is a list of
calls ``{"name", "arguments", "label"}``. An argument string ``"$var1.field$"`` (or ``"$var1$"``)
makes the call depend on the call labelled ``var1``. The final pseudo-call ``var_result`` only
gathers results and is not a task.

Structure only: every call is a remote API call with the ``api`` profile (estimated). A call
without ``name``, a reference to a label that no call carries, or a cycle makes the record
invalid. Labels act as variables (a few gold records reuse one): a reference resolves to the latest
earlier call with that label.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import Loaded, OnInvalid, collect, load_files, need, profile_task, read_json_list, rel

KIND = "api"
RESULT_CALL = "var_result"
_REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)(?:[.\[][^$]*)?\$")


def references(value: Any) -> Iterator[str]:
    """Labels referenced anywhere inside an argument value (strings, lists, dicts)."""
    if isinstance(value, str):
        yield from _REF.findall(value)
    elif isinstance(value, list):
        for v in value:
            yield from references(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from references(v)


def parse_nestful_record(rec: object, res: ResourceMappingConfig, where: str, name: str) -> WorkflowSpec:
    """Labels act as variables: a reference resolves to the latest earlier call carrying the label
    (a few gold records reuse a label), else to the first later one (which can close a cycle)."""
    calls = need(rec, "output", where, list)
    nodes: dict[str, TaskSpec] = {}
    labels: list[tuple[int, str]] = []  # (position, label) of each task
    refs: list[tuple[int, str, list[str]]] = []
    for i, call in enumerate(calls):
        cw = f"{where}: output[{i}]"
        tool = str(need(call, "name", cw))
        if tool == RESULT_CALL:
            continue
        key = f"{i}:{tool}"
        nodes[key] = profile_task(res, tool, KIND)
        labels.append((i, str(call.get("label") or f"call{i}")))
        refs.append((i, key, list(dict.fromkeys(references(call.get("arguments", {}))))))
    if not nodes:
        raise WorkflowError(f"{where}: no calls besides {RESULT_CALL!r}")
    keys = {i: k for k, (i, _) in zip(nodes, labels)}
    edges = []
    for i, key, srcs in refs:
        for lab in srcs:
            before = [j for j, lb in labels if lb == lab and j < i]
            after = [j for j, lb in labels if lb == lab and j > i]
            if not before and not after:
                raise WorkflowError(f"{where}: output[{i}] refers to ${lab}$, which no call is labelled")
            edges.append((keys[before[-1] if before else after[0]], key))
    return topological_spec(name, nodes, edges, where)


def load_nestful(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid = "raise",
                 family: str = "nestful") -> Loaded:
    return load_files(paths, load_nestful_doc, res, on_invalid, family, read=read_json_list)


def load_nestful_doc(path: Path, doc: list, res: ResourceMappingConfig, on_invalid: OnInvalid,
                     family: str) -> Loaded:
    """The records of ``doc`` (the parsed JSON list of ``path``)."""
    def records():
        for i, rec in enumerate(doc):
            rid = rec.get("sample_id", i) if isinstance(rec, dict) else i
            where = f"{rel(path)}: record {i} (id {rid!r})"
            yield where, (lambda rec=rec, where=where, rid=rid: parse_nestful_record(
                rec, res, where, f"{family}/{path.stem}/{rid}"))
    return collect(path, records(), on_invalid)
