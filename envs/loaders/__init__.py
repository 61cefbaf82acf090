"""Loaders for public workflow DAGs and the workload families built from them.

One module per format; each turns files into :class:`envs.workflow.WorkflowSpec` via
:func:`envs.workflow.topological_spec`:

==================  ==========================================  =======================
module              format                                      invalid record
==================  ==========================================  =======================
``wfformat``        WfFormat 1.5 JSON (WfInstances)             aborts the load
``flowbench``       FlowBench adjacency lists                   aborts the load
``dagbench``        DAGBench ``task_graph`` JSON                aborts the load
``worfbench``       WorFBench gold graphs (graph text)          aborts the load
``nestful``         NESTFUL call sequences (``$varN$`` refs)     aborts the load
``taskplan``        TaskBench / GNN4TaskPlan / TMDB plans       gold: aborts; predicted:
                                                                skipped and counted
``livedag``         the live scheduler's JSON/YAML DAG files    aborts the load
==================  ==========================================  =======================

Gold and measured sources abort because an invalid record there means a damaged copy; the
LLM-predicted GNN4TaskPlan plans are skipped and counted (logged at WARNING) because invalid
plans (cycles, hallucinated tools) are part of what a planner produces. ``workload.on_invalid``
(``scale-ray eval --on-invalid skip|error``) overrides a family's rule.

``dags`` (:mod:`envs.loaders.dags`) reads any files a user brings: :func:`detect_format` names a
file's format from its parsed content, and ``workload.source: dags`` with ``workload.dags: [paths]``
evaluates them (``scale-ray eval --dags PATH ...``).

Every loader rejects duplicate node ids, negative / NaN / infinite values, runtimes above 1e7 s and
memory or file sizes above 1 PB naming the field; a binary or non-UTF-8 file naming the file; an
empty file is skipped with a WARNING naming it.

The data files live in ``envs/data/<family>/`` with their upstream LICENSE and ORIGIN.md. Demands
come from ``workload.resources`` (:class:`envs.config.ResourceMappingConfig`; the values are in
``configs/env/workloads/base.yaml``). :data:`SOURCES` names a source for every family, which
:func:`envs.workload.make_source` serves, so ``workload.source: <family>`` works in any env config,
with ``workload.order: sample`` (with replacement) or ``replay`` (file order). The loaders build on
``envs.workflow`` only: ``envs.workload`` imports this package, never the other way round.
"""

from __future__ import annotations

import functools
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..config import ResourceMappingConfig, WorkloadConfig
from ..workflow import ListSource, WorkflowError, WorkflowSource, WorkflowSpec
from .common import DATA_DIR, Loaded, OnInvalid, read_json, rel
from .dags import (FORMATS, arrival_rate_for_load, dags_source, dags_workflows, detect_format,
                   load_dags)
from .livedag import parse_dag
from .dagbench import load_dagbench, parse_dagbench
from .flowbench import load_flowbench, parse_adjacency
from .nestful import load_nestful, parse_nestful_record
from .taskplan import load_plans, parse_plan, read_tool_modalities
from .wfformat import load_wfformat, parse_wfformat
from .worfbench import load_worfbench, parse_worfbench_record

log = logging.getLogger("envs.loaders")

TASKBENCH_DOMAINS = {"huggingface": "data_huggingface", "multimedia": "data_multimedia",
                     "dailylifeapis": "data_dailylifeapis"}


@dataclass(frozen=True)
class Family:
    """A named workload family: which files, read by which loader."""
    name: str
    description: str
    reader: Callable[[ResourceMappingConfig, OnInvalid | None], Loaded]

    def load(self, res: ResourceMappingConfig, on_invalid: OnInvalid | None = None) -> Loaded:
        """Read the family; ``on_invalid`` None keeps its own rule (see the table above)."""
        return self.reader(res, on_invalid)


def _files(pattern: str) -> list[Path]:
    files = sorted(DATA_DIR.glob(pattern))
    if not files:
        raise WorkflowError(f"no data files match {DATA_DIR / pattern} (is envs/data installed?)")
    return files


def _taskbench_tools() -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    return {dom: read_tool_modalities(DATA_DIR / "taskbench" / d / "tool_desc.json")
            for dom, d in TASKBENCH_DOMAINS.items()}


def _gnn4taskplan(res: ResourceMappingConfig, on_invalid: OnInvalid | None) -> Loaded:
    tools = _taskbench_tools()
    out = Loaded()
    for dom in ("huggingface", "multimedia"):
        out.extend(load_plans(_files(f"gnn4taskplan/prediction/{dom}/CodeLlama-13b/direct.json"),
                              res, on_invalid or "skip", f"gnn4taskplan/{dom}", tools, domain=dom,
                              predicted=True))
    return out


def _wfinstances_apps() -> list[str]:
    return sorted(p.name for p in (DATA_DIR / "wfinstances" / "pegasus").iterdir() if p.is_dir())


def _families() -> dict[str, Family]:
    fams = [
        Family("wfinstances", "Pegasus runs in WfFormat 1.5 (measured runtime, CPU, memory, files)",
               lambda r, oi: load_wfformat(_files("wfinstances/pegasus/*/*.json"), r, oi or "raise")),
        Family("flowbench", "Pegasus DAG shapes as adjacency lists (structure only)",
               lambda r, oi: load_flowbench(_files("flowbench/adjacency_list_dags/*.json"), r,
                                            oi or "raise")),
        Family("dagbench", "GPT-2 tensor-sharded prefill/decode operator graphs (measured op time)",
               lambda r, oi: load_dagbench(_files("dagbench/workflows/ml_pipelines/*/graph.json"),
                                           r, oi or "raise")),
        Family("worfbench", "WorFBench gold agent workflow graphs (structure only)",
               lambda r, oi: load_worfbench(_files("worfbench/gold_traj/*/graph_eval.json"), r,
                                            oi or "raise")),
        Family("nestful", "NESTFUL nested API-call sequences (structure only)",
               lambda r, oi: load_nestful(_files("nestful/data/*/*.json"), r, oi or "raise")),
        Family("taskbench", "TaskBench gold plan skeletons, 3 tool domains (structure only)",
               lambda r, oi: load_plans(_files("taskbench/taskbench_gold_sample.jsonl"), r,
                                        oi or "raise", "taskbench", _taskbench_tools(),
                                        predicted=False)),
        Family("gnn4taskplan", "TaskBench plans predicted by CodeLlama-13B (invalid plans skipped)",
               _gnn4taskplan),
        Family("gnn4taskplan-tmdb", "RestBench-TMDB gold API chains in TaskBench form",
               lambda r, oi: load_plans(_files("gnn4taskplan/data/tmdb/data.json"), r,
                                        oi or "raise", "gnn4taskplan-tmdb", None, predicted=False)),
    ]
    for app in _wfinstances_apps():
        fams.append(Family(f"wfinstances-{app}", f"WfInstances, {app} only",
                           lambda r, oi, app=app: load_wfformat(
                               _files(f"wfinstances/pegasus/{app}/*.json"), r, oi or "raise")))
    return {f.name: f for f in fams}


FAMILIES: dict[str, Family] = _families()


def family_names() -> list[str]:
    """Names of the real-DAG workload families, in registry order."""
    return list(FAMILIES)


@functools.lru_cache(maxsize=64)
def _load_cached(name: str, res: ResourceMappingConfig,
                 on_invalid: OnInvalid | None = None) -> tuple[tuple[WorkflowSpec, ...], int, int]:
    loaded = FAMILIES[name].load(res, on_invalid)
    if loaded.skipped and on_invalid is not None:
        log.warning("workload family %s: skipped %d of %d records as invalid (on_invalid=%s)",
                    name, len(loaded.skipped), loaded.records, on_invalid)
    if not loaded.workflows:
        raise WorkflowError(f"workload family {name!r}: no valid workflows "
                            f"({len(loaded.skipped)} of {loaded.records} records skipped)")
    return tuple(loaded.workflows), loaded.records, len(loaded.skipped)


def load_family(name: str, res: ResourceMappingConfig,
                on_invalid: OnInvalid | None = None) -> tuple[WorkflowSpec, ...]:
    """The workflows of family ``name`` (file order), read once per demand mapping and
    ``on_invalid`` (None: the family's own rule)."""
    if name not in FAMILIES:
        raise WorkflowError(f"unknown workload family {name!r}; known: {family_names()}")
    return _load_cached(name, res, on_invalid)[0]


def load_counts(name: str, res: ResourceMappingConfig,
                on_invalid: OnInvalid | None = None) -> tuple[int, int]:
    """(records seen, records skipped as invalid) of family ``name``."""
    load_family(name, res, on_invalid)
    _, records, skipped = _load_cached(name, res, on_invalid)
    return records, skipped


def family_source(name: str, cfg: WorkloadConfig) -> ListSource:
    """The workload source of family ``name``: ``cfg.order`` sample or replay."""
    if cfg.resources is None:
        raise WorkflowError(f"workload.resources: required for workload.source {name!r} (the "
                            f"demand mapping of real DAGs); inherit configs/env/workloads/base.yaml "
                            f"or use configs/env/workloads/{name.split('-')[0]}.yaml")
    return ListSource(load_family(name, cfg.resources, cfg.on_invalid), cfg.order)


#: The workload sources of this package by ``workload.source``: every family, and ``dags`` (the
#: user's files). :func:`envs.workload.make_source` looks names up here (after ``random``).
SOURCES: dict[str, Callable[[WorkloadConfig], WorkflowSource]] = {
    **{name: functools.partial(family_source, name) for name in FAMILIES},
    "dags": dags_source,
}


# ---------------------------------------------------------------------------------------------
# Shape statistics
# ---------------------------------------------------------------------------------------------

def shape(wf: WorkflowSpec) -> dict[str, float]:
    """Nodes, edges, depth (tasks on the longest path), width (most tasks on one depth level),
    total compute (GFLOP) and the share of estimated tasks of one workflow."""
    level = [0] * len(wf.tasks)
    for i, t in enumerate(wf.tasks):
        level[i] = 1 + max((level[p] for p in t.parents), default=0)
    counts: dict[int, int] = {}
    for lv in level:
        counts[lv] = counts.get(lv, 0) + 1
    return {"nodes": len(wf.tasks), "edges": sum(len(t.parents) for t in wf.tasks),
            "depth": max(level), "width": max(counts.values()),
            "gflop": sum(t.compute_gflop for t in wf.tasks),
            "estimated": sum(t.estimated for t in wf.tasks) / len(wf.tasks)}


def shape_stats(workflows: Sequence[WorkflowSpec]) -> dict[str, object]:
    """min / median / max of each :func:`shape` key over ``workflows``, plus the DAG count."""
    shapes = [shape(w) for w in workflows]
    out: dict[str, object] = {"dags": len(shapes)}
    for key in ("nodes", "edges", "depth", "width", "gflop"):
        vals = [s[key] for s in shapes]
        out[key] = (min(vals), statistics.median(vals), max(vals))
    out["mean_gflop"] = statistics.fmean(s["gflop"] for s in shapes)
    out["estimated"] = statistics.fmean(s["estimated"] for s in shapes)
    return out


def format_stats(rows: Sequence[tuple[str, dict[str, object], int, int]]) -> str:
    """A Markdown table of (family, shape_stats, records, skipped) rows."""
    def mmm(v: object, fmt: str = "g") -> str:
        a, b, c = v  # type: ignore[misc]
        return f"{a:{fmt}} / {b:{fmt}} / {c:{fmt}}"
    lines = ["| family | DAGs | skipped | nodes min/med/max | edges min/med/max | depth min/med/max "
             "| width min/med/max | GFLOP per DAG min/med/max | mean GFLOP | estimated |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s, records, skipped in rows:
        lines.append(f"| {name} | {s['dags']} | {skipped}/{records} | {mmm(s['nodes'])} | "
                     f"{mmm(s['edges'])} | {mmm(s['depth'])} | {mmm(s['width'])} | "
                     f"{mmm(s['gflop'], '.3g')} | {s['mean_gflop']:.4g} | {s['estimated']:.0%} |")
    return "\n".join(lines)


__all__ = ["FAMILIES", "SOURCES", "Family", "Loaded", "DATA_DIR", "family_names", "load_family", "load_counts",
           "FORMATS", "detect_format", "load_dags", "dags_source", "dags_workflows",
           "arrival_rate_for_load", "parse_dag",
           "family_source", "shape", "shape_stats", "format_stats", "read_json", "rel",
           "load_wfformat", "load_flowbench", "load_dagbench", "load_worfbench", "load_nestful",
           "load_plans", "parse_wfformat", "parse_adjacency", "parse_dagbench",
           "parse_worfbench_record", "parse_nestful_record", "parse_plan", "read_tool_modalities"]
