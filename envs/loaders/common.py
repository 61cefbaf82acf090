"""Shared parts of the real-DAG loaders: reading files with clear errors, demand mapping,
and the raise-or-skip policy for invalid records (numpy + stdlib only).

Every error names the file and the record (``<file>: record 12 (id '4711'): ...``). A loader
either aborts on the first invalid record (``on_invalid="raise"``: curated and measured sources,
where a bad record means a broken copy) or skips it and counts it (``on_invalid="skip"``:
LLM-predicted plans, which contain cycles and hallucinated tools by nature). Skips are logged
at WARNING with the count and the first reasons; they are never silent.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

from ..config import ResourceMappingConfig, ToolProfileConfig
from ..workflow import TaskSpec, WorkflowError, WorkflowSpec

log = logging.getLogger("envs.loaders")

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
BYTES_PER_GB = 1e9

OnInvalid = Literal["raise", "skip"]

# Plausibility limits: a value past one of these is a unit slip or a damaged file, and would make
# the simulation meaningless (a 1e12 s task never finishes within any horizon).
MAX_RUNTIME_S = 1e7          # ~116 days of one task
MAX_MEMORY_GB = 1e6          # 1 PB
MAX_BYTES = MAX_MEMORY_GB * 1e9  # 1 PB, for memory and file sizes given in bytes


@dataclass
class Loaded:
    """Workflows read from one or more files, plus the records skipped as invalid."""
    workflows: list[WorkflowSpec] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per skipped record
    records: int = 0  # records seen (loaded + skipped)

    def extend(self, other: "Loaded") -> None:
        self.workflows.extend(other.workflows)
        self.skipped.extend(other.skipped)
        self.records += other.records


def rel(path: Path) -> str:
    """A short, stable name for a file in error messages (relative to the data dir if inside)."""
    try:
        return str(Path(path).resolve().relative_to(DATA_DIR))
    except ValueError:
        return str(path)


def read_text(path: Path) -> str:
    """The text of a UTF-8 file ('' for an empty or blank one); a missing, unreadable, binary or
    non-UTF-8 file raises WorkflowError naming it."""
    p = Path(path)
    if not p.is_file():
        raise WorkflowError(f"{p}: no such workflow file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise WorkflowError(f"{rel(p)}: cannot read ({e.strerror or e})") from None
    if not raw.strip():
        return ""
    if b"\0" in raw[:8192]:
        raise WorkflowError(f"{rel(p)}: binary file (NUL bytes), not a UTF-8 text DAG file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise WorkflowError(f"{rel(p)}: not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at "
                            f"offset {e.start})") from None


def empty(path: Path) -> bool:
    """Whether ``path`` is an existing empty (or blank) file; if so, log a WARNING naming it.
    Loaders skip such a file (0 records) instead of failing on it or passing it over silently."""
    p = Path(path)
    try:
        raw = p.read_bytes() if p.is_file() and p.stat().st_size < 4096 else None
    except OSError:
        return False
    if raw is None or raw.strip():
        return False
    log.warning("%s: empty file (%d bytes): no workflows read from it", rel(p), len(raw))
    return True


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise WorkflowError(f"duplicate key {k!r} in one JSON object (a node id listed twice?)")
        out[k] = v
    return out


def loads_json(text: str) -> Any:
    """``json.loads`` that rejects duplicate keys (json would silently keep the last one)."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing, empty, binary or non-UTF-8 file, truncated/invalid JSON or a
    duplicate key raises WorkflowError naming the file."""
    p = Path(path)
    text = read_text(p)
    if not text:
        raise WorkflowError(f"{rel(p)}: empty file")
    try:
        return loads_json(text)
    except json.JSONDecodeError as e:
        raise WorkflowError(f"{rel(p)}: invalid or truncated JSON at line {e.lineno} column "
                            f"{e.colno}: {e.msg}") from None
    except WorkflowError as e:
        raise WorkflowError(f"{rel(p)}: {e}") from None


def read_json_list(path: Path) -> list[Any]:
    """A JSON file whose top level must be a list of records."""
    doc = read_json(path)
    if not isinstance(doc, list):
        raise WorkflowError(f"{rel(path)}: expected a JSON list of records, got {type(doc).__name__}")
    return doc


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) for each non-blank line; a bad line raises WorkflowError."""
    p = Path(path)
    return parse_jsonl(read_text(p), rel(p))


def parse_jsonl(text: str, where: str) -> list[tuple[int, Any]]:
    """(line number, record) for each non-blank line of ``text``."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, loads_json(line)))
        except json.JSONDecodeError as e:
            raise WorkflowError(f"{where}: line {lineno}: invalid or truncated JSON at column "
                                f"{e.colno}: {e.msg}") from None
        except WorkflowError as e:
            raise WorkflowError(f"{where}: line {lineno}: {e}") from None
    return out


def need(record: Any, key: str, where: str, kind: type | tuple[type, ...] | None = None) -> Any:
    """``record[key]``, or a WorkflowError naming ``where`` when absent or of the wrong type."""
    if not isinstance(record, Mapping):
        raise WorkflowError(f"{where}: expected an object, got {type(record).__name__}")
    if key not in record:
        raise WorkflowError(f"{where}: missing field {key!r}")
    value = record[key]
    if kind is not None and not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise WorkflowError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def number(record: Mapping[str, Any], key: str, where: str, hi: float | None = None) -> float:
    """A finite, non-negative number field (at most ``hi`` when given)."""
    v = need(record, key, where, (int, float))
    if isinstance(v, bool) or not math.isfinite(v) or v < 0 or (hi is not None and v > hi):
        rule = f"in [0, {hi:g}]" if hi is not None else ">= 0"
        raise WorkflowError(f"{where}: field {key!r} must be a finite number {rule}, got {v!r}")
    return float(v)


def measured_task(res: ResourceMappingConfig, name: str, cpu_seconds: float,
                  memory_gb: float | None, output_gb: float, kind: str) -> TaskSpec:
    """A primitive with measured compute (CPU-seconds x reference speed); memory from the
    measurement when there is one, else from the kind's profile (then ``estimated``)."""
    compute = max(cpu_seconds * res.reference_gflop_per_core_s, res.min_compute_gflop)
    estimated = memory_gb is None
    mem = res.profile(kind).memory_gb if memory_gb is None else memory_gb
    return TaskSpec(compute, min(mem, res.max_memory_gb), output_gb, (), name, estimated)


def profile_task(res: ResourceMappingConfig, name: str, kind: str,
                 output_kind: str | None = None) -> TaskSpec:
    """A primitive whose demands all come from the profile of ``kind`` (marked estimated);
    the output size from ``output_kind``'s profile when given."""
    p = res.profile(kind)
    out = res.profile(output_kind).output_gb if output_kind is not None else p.output_gb
    return TaskSpec(p.compute_gflop, p.memory_gb, out, (), name, True)


def heaviest(res: ResourceMappingConfig, kinds: Iterable[str]) -> ToolProfileConfig | None:
    """The profile with the largest compute among ``kinds`` that have one (None if none do)."""
    known = {p.kind: p for p in res.profiles}
    found = [known[k] for k in kinds if k in known]
    return max(found, key=lambda p: p.compute_gflop) if found else None


def collect(file: Path, records: Iterable[tuple[str, Callable[[], WorkflowSpec]]],
            on_invalid: OnInvalid) -> Loaded:
    """Build each record (``(label, builder)``); abort or skip-and-count on WorkflowError."""
    out = Loaded()
    for label, build in records:
        out.records += 1
        try:
            out.workflows.append(build())
        except WorkflowError as e:
            msg = str(e) if str(e).startswith(rel(file)) else f"{label}: {e}"
            if on_invalid == "raise":
                raise WorkflowError(msg) from None
            out.skipped.append(msg)
    if out.skipped:
        log.warning("%s: skipped %d of %d records as invalid (first: %s)", rel(file),
                    len(out.skipped), out.records, "; ".join(out.skipped[:3]))
    return out


def load_files(paths: Iterable[Path], load_doc: Callable[..., Loaded], res: ResourceMappingConfig,
               on_invalid: OnInvalid, family: str,
               read: Callable[[Path], Any] | None = None) -> Loaded:
    """The file loop every format shares: ``load_doc(path, doc, res, on_invalid, family)`` of
    each non-empty file, ``doc`` being ``read(path)`` (None: the format reads the file itself)."""
    out = Loaded()
    for path in paths:
        if not empty(path):
            out.extend(load_doc(path, None if read is None else read(path), res, on_invalid, family))
    return out

