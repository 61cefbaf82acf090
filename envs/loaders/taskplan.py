"""TaskBench-style plans (TaskBench gold skeletons, GNN4TaskPlan predictions, RestBench-TMDB):
JSON-lines records with ``task_nodes[]`` (``task``, optional ``arguments``) and ``task_links[]``
(``source``, ``target``).

Node slots are the positions in ``task_nodes`` (not a topological order). Links name *tools*,
not slots: a link ``(s, t)`` connects each slot ``j`` running ``t`` to the slot running ``s`` --
the nearest one before ``j``, else the first one after ``j`` (which can close a cycle; cycles are
reported, not repaired); a link from a tool to itself chains that tool's slots in list order. An
argument ``"<node-k>"`` adds the edge ``k -> j``.

Demands come from the tool's modalities in the domain's ``tool_desc.json`` (``input-type`` and
``output-type``: text, image, audio, video, url): compute and memory from the heaviest modality
with a profile (largest compute), the output from the heaviest output modality; a tool with no
types (daily-life APIs, TMDB) is a remote ``api`` call. Tools are looked up in the record's domain
first, then in the other TaskBench domains (one transcribed gold skeleton files a multimedia tool
under huggingface). A tool that no domain defines makes a predicted plan invalid (a hallucinated
tool cannot run); in a gold plan it takes the ``default`` profile and is counted in a warning
(one transcribed TaskBench skeleton names 'Audio Quality Enhancer'). All nodes are estimated.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..config import ResourceMappingConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec, topological_spec
from .common import (Loaded, OnInvalid, collect, empty, heaviest, log, need, read_json, read_jsonl,
                     rel)

API_KIND = "api"
_NODE_REF = re.compile(r"<node-(\d+)>")


def read_tool_modalities(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """tool id -> (input modalities, output modalities), lower-cased, from a tool_desc.json."""
    doc = read_json(path)
    out = {}
    for i, node in enumerate(need(doc, "nodes", rel(path), list)):
        nw = f"{rel(path)}: nodes[{i}]"
        tid = str(need(node, "id", nw))
        out[tid] = ([str(m).lower() for m in node.get("input-type", [])],
                    [str(m).lower() for m in node.get("output-type", [])])
    return out


def tool_task(res: ResourceMappingConfig, name: str,
              modalities: tuple[list[str], list[str]] | None) -> TaskSpec:
    """Estimated demands of one tool call from its modalities (None or none typed: api)."""
    ins, outs = modalities or ([], [])
    work = heaviest(res, ins + outs) or res.profile(API_KIND)
    out = heaviest(res, outs) or work
    return TaskSpec(work.compute_gflop, work.memory_gb, out.output_gb, (), name, True)


def _node_refs(value: Any) -> Iterator[int]:
    if isinstance(value, str):
        yield from (int(k) for k in _NODE_REF.findall(value))
    elif isinstance(value, list):
        for v in value:
            yield from _node_refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _node_refs(v)


def parse_plan(rec: object, res: ResourceMappingConfig, where: str, name: str,
               tools: Mapping[str, tuple[list[str], list[str]]] | None,
               unknown_tools: list[str] | None = None) -> WorkflowSpec:
    """One plan record -> WorkflowSpec. ``tools=None``: any tool name, all ``api``. A tool missing
    from ``tools`` is invalid, unless ``unknown_tools`` is a list: then it is appended there and
    takes the default profile (gold plans whose tool description we lack)."""
    task_nodes = need(rec, "task_nodes", where, list)
    links = need(rec, "task_links", where, list)
    if not task_nodes:
        raise WorkflowError(f"{where}: 'task_nodes' is empty")
    slots: list[str] = []
    nodes: dict[str, TaskSpec] = {}
    edges: list[tuple[str, str]] = []
    for j, node in enumerate(task_nodes):
        tool = str(need(node, "task", f"{where}: task_nodes[{j}]"))
        slot = f"{j}:{tool}"
        slots.append(slot)
        if tools is not None and tool not in tools:
            if unknown_tools is None:
                raise WorkflowError(f"{where}: task_nodes[{j}] uses tool {tool!r}, which no "
                                    f"TaskBench domain defines")
            unknown_tools.append(f"{where}: {tool!r}")
            d = res.default
            nodes[slot] = TaskSpec(d.compute_gflop, d.memory_gb, d.output_gb, (), tool, True)
            continue
        nodes[slot] = tool_task(res, tool, tools[tool] if tools is not None else None)
    for j, node in enumerate(task_nodes):
        for k in dict.fromkeys(_node_refs(node.get("arguments", []))):
            if not 0 <= k < len(slots):
                raise WorkflowError(f"{where}: task_nodes[{j}] refers to <node-{k}>, but the plan "
                                    f"has nodes 0..{len(slots) - 1}")
            edges.append((slots[k], slots[j]))
    tool_of = [s.split(":", 1)[1] for s in slots]
    for i, link in enumerate(links):
        lw = f"{where}: task_links[{i}]"
        src, dst = str(need(link, "source", lw)), str(need(link, "target", lw))
        src_slots = [k for k, t in enumerate(tool_of) if t == src]
        dst_slots = [k for k, t in enumerate(tool_of) if t == dst]
        if not src_slots or not dst_slots:
            missing = src if not src_slots else dst
            raise WorkflowError(f"{lw}: link ({src!r} -> {dst!r}) names tool {missing!r}, which no "
                                f"task node runs")
        if src == dst:  # a tool linked to itself: its slots run one after another
            if len(src_slots) < 2:
                raise WorkflowError(f"{lw}: link ({src!r} -> {dst!r}) is a self-loop on node "
                                    f"{src_slots[0]}")
            edges.extend((slots[a], slots[b]) for a, b in zip(src_slots, src_slots[1:]))
            continue
        for j in dst_slots:
            before = [k for k in src_slots if k < j]
            edges.append((slots[before[-1] if before else [k for k in src_slots if k > j][0]], slots[j]))
    return topological_spec(name, nodes, edges, where)


def load_plans(paths: list[Path], res: ResourceMappingConfig, on_invalid: OnInvalid,
               family: str, tools: Mapping[str, Mapping[str, tuple[list[str], list[str]]]] | None,
               domain: str | None = None, predicted: bool | None = None) -> Loaded:
    """Plans from JSON-lines files. ``tools``: domain -> tool modalities (None: all tools are
    APIs, no tool check); the record's ``domain`` field or ``domain`` picks the domain. Unknown
    tools make a plan invalid when ``predicted`` (default: ``on_invalid == "skip"``, predicted
    plans); in gold plans they take the default profile and are counted in a warning."""
    out = Loaded()
    for path in paths:
        if not empty(path):
            out.extend(load_plan_lines(path, read_jsonl(path), res, on_invalid, family, tools,
                                       domain, predicted))
    return out


def load_plan_lines(path: Path, lines: list[tuple[int, Any]], res: ResourceMappingConfig,
                    on_invalid: OnInvalid, family: str,
                    tools: Mapping[str, Mapping[str, tuple[list[str], list[str]]]] | None,
                    domain: str | None = None, predicted: bool | None = None) -> Loaded:
    """The plans of ``lines`` ((line number, record) of ``path``); see :func:`load_plans`."""
    unknown: list[str] | None = None if (on_invalid == "skip" if predicted is None else predicted) else []

    def records():
        for lineno, rec in lines:
            rid = rec.get("id", lineno) if isinstance(rec, dict) else lineno
            where = f"{rel(path)}: line {lineno} (id {rid!r})"

            def build(rec=rec, where=where, rid=rid) -> WorkflowSpec:
                dom_tools = None
                if tools is not None:
                    dom = domain or str(need(rec, "domain", where))
                    if dom not in tools:
                        raise WorkflowError(f"{where}: unknown domain {dom!r}; known: {sorted(tools)}")
                    dom_tools = {}  # the record's domain first, then the other domains
                    for d in [dom] + [d for d in tools if d != dom]:
                        for tool, mods in tools[d].items():
                            dom_tools.setdefault(tool, mods)
                return parse_plan(rec, res, where, f"{family}/{rid}", dom_tools, unknown)
            yield where, build
    out = collect(path, records(), on_invalid)
    if unknown:
        log.warning("%s: %d task nodes use tools without a description; they take the "
                    "default profile (first: %s)", rel(path), len(unknown), "; ".join(unknown[:3]))
    return out
