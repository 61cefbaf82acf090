"""Any DAG file a user brings: format detection from content, and the ``dags`` workload source.

:func:`detect_format` parses a file (JSON, JSON lines, else YAML) and names its format from the
parsed structure, never from the file name: the registry of formats and how each is recognised
is :mod:`envs.dag_formats` (:data:`LOADERS` here holds each one's loader).

For a list, the format most of its records match wins (a few damaged records do not hide the
format). :func:`load_dags` reads files and directories (recursively: ``*.json``, ``*.jsonl``,
``*.yaml``, ``*.yml``) with each file's detected format, or one forced format. Demands come from
``workload.resources`` as for the families (TaskBench-style plans look tools up in all shipped
TaskBench domains; a tool none defines takes the ``default`` profile, counted in a warning); the
live format carries its demands. An empty file is skipped with a WARNING naming it; an unreadable,
binary, non-UTF-8 or unrecognised file raises WorkflowError naming it and the formats tried (with
``on_invalid="skip"`` it is skipped and counted like an invalid record).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import EnvConfig, ResourceMappingConfig, WorkloadConfig
from ..dag_formats import NAMES, format_of
from ..workflow import ListSource, WorkflowError, WorkflowSpec
from .common import DATA_DIR, Loaded, OnInvalid, loads_json, read_text, rel
from .dagbench import load_dagbench_doc
from .flowbench import load_adjacency_doc
from .livedag import load_live_doc
from .nestful import load_nestful_doc
from .taskplan import load_plan_lines, read_tool_modalities
from .wfformat import load_wfformat_doc
from .worfbench import load_worfbench_doc

log = logging.getLogger("envs.loaders")

FORMATS: tuple[str, ...] = NAMES  # the registry's (envs.dag_formats)
SUFFIXES = (".json", ".jsonl", ".yaml", ".yml")
TASKBENCH_TOOL_FILES = ("data_huggingface", "data_multimedia", "data_dailylifeapis")


def read_doc(path: Path) -> tuple[str, Any]:
    """(kind, parsed content) of ``path``: kind is ``empty`` (None), ``json``, ``jsonl`` (a list of
    (line number, record)) or ``yaml``. Raises WorkflowError naming the file when it is none."""
    try:
        text = read_text(path)
    except WorkflowError as e:  # binary, not UTF-8, unreadable
        raise WorkflowError(f"{e}; formats tried: {', '.join(FORMATS)}") from None
    if not text:
        return "empty", None
    try:
        return "json", loads_json(text)
    except json.JSONDecodeError as e:
        first = f"line {e.lineno} column {e.colno}: {e.msg}"
    except WorkflowError as e:  # a duplicate key
        raise WorkflowError(f"{rel(path)}: {e}") from None
    lines = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                lines.append((lineno, loads_json(line)))
            except json.JSONDecodeError:
                lines = []
                break
            except WorkflowError as e:
                raise WorkflowError(f"{rel(path)}: line {lineno}: {e}") from None
    if lines:
        return "jsonl", lines
    try:
        import yaml  # only here: envs stays free of YAML unless a YAML DAG file is read
    except ImportError:
        yaml = None
    if yaml is not None:
        try:
            return "yaml", yaml.safe_load(text)
        except yaml.YAMLError:
            pass
    raise WorkflowError(f"{rel(path)}: not valid JSON ({first}), JSON lines or YAML; formats "
                        f"tried: {', '.join(FORMATS)}")


def detect_format(path: str | Path) -> str:
    """The format of the DAG file ``path``, from its parsed content (one of :data:`FORMATS`).
    Raises WorkflowError naming the file and the formats tried when none matches."""
    p = Path(path)
    kind, doc = read_doc(p)
    if kind == "empty":
        raise WorkflowError(f"{rel(p)}: empty file; no format to detect")
    fmt = format_of(kind, doc)
    if fmt is None:
        raise WorkflowError(f"{rel(p)}: not a DAG file in a known format; formats tried: "
                            f"{', '.join(FORMATS)}")
    return fmt


@functools.lru_cache(maxsize=1)
def _taskbench_tools() -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    """Tool modalities of every shipped TaskBench domain, merged (first domain wins)."""
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for d in TASKBENCH_TOOL_FILES:
        path = DATA_DIR / "taskbench" / d / "tool_desc.json"
        if path.is_file():
            for tool, mods in read_tool_modalities(path).items():
                merged.setdefault(tool, mods)
    return {"any": merged}


def _load_taskplan(path: Path, kind: str, doc: Any, res: ResourceMappingConfig,
                   on_invalid: OnInvalid) -> Loaded:
    lines = doc if kind == "jsonl" else (list(enumerate(doc, 1)) if isinstance(doc, list)
                                         else [(1, doc)])
    return load_plan_lines(path, lines, res, on_invalid, "taskplan", _taskbench_tools(),
                           domain="any", predicted=False)


def _records(load: Callable[..., Loaded], fmt: str) -> Callable[..., Loaded]:
    """A loader of a JSON list of records (WorFBench, NESTFUL)."""
    def run(path: Path, kind: str, doc: Any, res: ResourceMappingConfig,
            on_invalid: OnInvalid) -> Loaded:
        if not isinstance(doc, list):
            raise WorkflowError(f"{rel(path)}: format {fmt!r} expects a JSON list of records, "
                                f"got {type(doc).__name__}")
        return load(path, doc, res, on_invalid, fmt)
    return run


def _document(load: Callable[..., Loaded], fmt: str) -> Callable[..., Loaded]:
    """A loader of one JSON document (WfFormat, FlowBench, DAGBench)."""
    def run(path: Path, kind: str, doc: Any, res: ResourceMappingConfig,
            on_invalid: OnInvalid) -> Loaded:
        return load(path, doc, res, on_invalid, fmt)
    return run


#: each format of the registry (envs.dag_formats) -> its loader (path, kind, doc, res, on_invalid)
LOADERS: dict[str, Callable[..., Loaded]] = {
    "wfformat": _document(load_wfformat_doc, "wfformat"),
    "worfbench": _records(load_worfbench_doc, "worfbench"),
    "flowbench": _document(load_adjacency_doc, "flowbench"),
    "dagbench": _document(load_dagbench_doc, "dagbench"),
    "nestful": _records(load_nestful_doc, "nestful"),
    "taskplan": _load_taskplan,
}
assert set(LOADERS) | {"live"} == set(FORMATS), "every registered format has a loader"


def load_doc(path: Path, kind: str, doc: Any, fmt: str, res: ResourceMappingConfig | None,
             on_invalid: OnInvalid) -> Loaded:
    """The workflows of one parsed file read as format ``fmt``."""
    if fmt == "live":  # carries its demands
        return load_live_doc(path, doc, on_invalid)
    if res is None:
        raise WorkflowError(f"workload.resources: required to map the demands of {fmt} file "
                            f"{rel(path)}; inherit configs/env/workloads/base.yaml")
    if kind == "jsonl" and fmt != "taskplan":
        raise WorkflowError(f"{rel(path)}: JSON lines, but format {fmt!r} is one JSON document")
    return LOADERS[fmt](path, kind, doc, res, on_invalid)


def dag_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files named by ``paths``: files as given, directories searched recursively for
    ``*.json``, ``*.jsonl``, ``*.yaml`` and ``*.yml`` (hidden entries left out), sorted."""
    out: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not found:
                raise WorkflowError(f"{p}: directory holds no {'/'.join(SUFFIXES)} files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise WorkflowError(f"{p}: no such DAG file or directory")
    return out


def load_dags(paths: Sequence[str | Path], res: ResourceMappingConfig | None,
              fmt: str = "auto", on_invalid: OnInvalid = "raise") -> tuple[Loaded, dict[str, int]]:
    """(workflows of every file, files read per format). ``fmt="auto"`` detects each file's
    format; an undetected, unreadable or invalid file raises WorkflowError, or is skipped and
    counted with ``on_invalid="skip"``."""
    if fmt != "auto" and fmt not in FORMATS:
        raise WorkflowError(f"dag format {fmt!r} is not one of {['auto', *FORMATS]}")
    out, per_format = Loaded(), {}
    for path in dag_files(paths):
        try:
            kind, doc = read_doc(path)
            if kind == "empty":
                log.warning("%s: empty file (0 records): no workflows read from it", rel(path))
                continue
            f = fmt if fmt != "auto" else format_of(kind, doc)
            if f is None:
                raise WorkflowError(f"{rel(path)}: not a DAG file in a known format; formats "
                                    f"tried: {', '.join(FORMATS)}")
            loaded = load_doc(path, kind, doc, f, res, on_invalid)
        except WorkflowError as e:
            if on_invalid == "raise":
                raise
            out.records += 1
            out.skipped.append(str(e))
            log.warning("skipped the file: %s", e)
            continue
        out.extend(loaded)
        per_format[f] = per_format.get(f, 0) + 1
    if out.skipped:
        log.warning("dags: skipped %d of %d records as invalid (on_invalid=skip)",
                    len(out.skipped), out.records)
    if not out.workflows:
        first = f"; first: {out.skipped[0]}" if out.skipped else ""
        raise WorkflowError(f"dags {[str(p) for p in paths]}: no valid workflows "
                            f"({len(out.skipped)} of {out.records} records skipped{first})")
    return out, per_format


def _stamp(paths: Sequence[str]) -> tuple:
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in dag_files(paths))


@functools.lru_cache(maxsize=16)
def _cached(stamp: tuple, paths: tuple[str, ...], res: ResourceMappingConfig | None, fmt: str,
            on_invalid: OnInvalid) -> tuple[tuple[WorkflowSpec, ...], int, int, tuple]:
    loaded, per_format = load_dags(paths, res, fmt, on_invalid)
    return tuple(loaded.workflows), loaded.records, len(loaded.skipped), tuple(per_format.items())


def dags_workflows(cfg: WorkloadConfig) -> tuple[tuple[WorkflowSpec, ...], int, int, dict[str, int]]:
    """(workflows, records, skipped, files per format) of ``cfg.dags`` (read once per change)."""
    if not cfg.dags:
        raise WorkflowError("workload.dags: name at least one DAG file or directory for "
                            "workload.source 'dags'")
    paths = tuple(str(p) for p in cfg.dags)
    wfs, records, skipped, per = _cached(_stamp(paths), paths, cfg.resources, cfg.dag_format,
                                         cfg.on_invalid or "raise")
    return wfs, records, skipped, dict(per)


def dags_source(cfg: WorkloadConfig) -> ListSource:
    """The ``dags`` workload source: ``cfg.dags`` read with ``cfg.dag_format``, ``cfg.order``."""
    return ListSource(dags_workflows(cfg)[0], cfg.order)


def capacity_gflop_s(env: EnvConfig, servers: int = 16) -> float:
    """Total compute (GFLOP/s) of ``env``'s cluster at ``servers`` servers."""
    c = env.with_servers(servers).cluster
    return sum(c.tier(name).compute * n for name, n in c.tier_counts().items())


def arrival_rate_for_load(env: EnvConfig, rho: float, workflows: Sequence[WorkflowSpec]) -> float:
    """lambda16 giving offered load ``rho``: rho = lambda16 x W / C16, with W the mean total
    compute (GFLOP) of ``workflows`` and C16 the cluster's total compute (GFLOP/s) at N=16;
    lambda(N) = lambda16 x N/16 keeps the load about the same at other N."""
    if not workflows:
        raise WorkflowError("--load: no workflows to measure the mean compute of")
    work = sum(sum(t.compute_gflop for t in w.tasks) for w in workflows) / len(workflows)
    return rho * capacity_gflop_s(env, 16) / work
