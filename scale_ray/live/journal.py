"""The journal: what a scheduler accepted and what its primitives returned, so that a scheduler
that restarts (a Serve replica replaced, a driver run again) resumes every unfinished workflow
(docs/serving.md, "Durability").

Storage is any ``pyarrow.fs`` URI or a local path (``/mnt/nfs/scale``, ``s3://bucket/prefix``,
``gs://...``), as Ray Train's ``storage_path``. Layout, one directory per workflow::

    <root>/wf/<id>/submit        the accepted workflow: its document or pickled calls, key, group
    <root>/wf/<id>/s<i>.<a>      task i's run number a started (written by the worker first)
    <root>/wf/<id>/t<i>          task i finished: its result (written by the worker before the
                                 run reports done)
    <root>/wf/<id>/end           finished and compacted: state, error, times (no results)

Every entry is one object written whole under a temporary name and then moved into place, and
carries a magic, its lengths and a CRC32: a crash at any point leaves either the old state or the
new one, and a truncated or corrupt entry is reported (:attr:`Loaded.problems`) and skipped, never
raised. Semantics are at-least-once: a task whose result is not in the journal runs again after a
restart; its body can read :func:`attempt` (0 on its first run).

Values of ``json`` workflows (HTTP documents) are stored as JSON and never unpickled; values of
``pickle`` workflows (Python submits) with cloudpickle: the storage must be as trusted as the
cluster itself.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"SCJ1"
_HEAD = struct.Struct("<4sIII")  # magic, meta length, payload length, crc32(meta + payload)
FORMATS = ("json", "pickle")

__all__ = ["Journal", "Submission", "Loaded", "CorruptEntry", "attempt", "encode", "decode",
           "resolve_storage", "FORMATS"]


class CorruptEntry(ValueError):
    """A journal entry that is truncated, of another format, or fails its checksum."""


def encode(meta: dict[str, Any], payload: bytes = b"") -> bytes:
    m = json.dumps(meta, separators=(",", ":"), default=float).encode()
    return _HEAD.pack(MAGIC, len(m), len(payload), zlib.crc32(m + payload)) + m + payload


def decode(blob: bytes) -> tuple[dict[str, Any], bytes]:
    if len(blob) < _HEAD.size:
        raise CorruptEntry(f"truncated: {len(blob)} bytes, shorter than its header")
    magic, lm, lp, crc = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptEntry(f"not a journal entry (magic {magic!r})")
    body = blob[_HEAD.size:]
    if len(body) != lm + lp:
        raise CorruptEntry(f"truncated: {len(body)} of {lm + lp} bytes")
    if zlib.crc32(body) != crc:
        raise CorruptEntry("checksum mismatch")
    return json.loads(body[:lm]), body[lm:]


def resolve_storage(storage: str | None, session_dir: str | None = None) -> str | None:
    """The journal URI of a ``storage`` setting: ``None``/``"off"``: no journal; ``"session"``:
    ``<session_dir>/scale_journal`` (the Ray session's directory on this node); else as given."""
    if storage is None or storage == "off":
        return None
    if storage == "session":
        if session_dir is None:
            import ray

            session_dir = ray._private.worker._global_node.get_session_dir_path()
        return f"{session_dir.rstrip('/')}/scale_journal"
    return storage


_FS: dict[str, tuple[Any, str]] = {}
_FS_LOCK = threading.Lock()


def _filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, root path) of ``uri``, cached per process (workers write too)."""
    with _FS_LOCK:
        hit = _FS.get(uri)
        if hit is None:
            import pyarrow.fs as pafs

            path = uri if "://" in uri else os.path.abspath(os.path.expanduser(uri))
            fs, root = pafs.FileSystem.from_uri(path)
            fs.create_dir(root, recursive=True)
            hit = _FS[uri] = (fs, root.rstrip("/"))
        return hit


def _put(fs: Any, path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open_output_stream(tmp) as f:
        f.write(blob)
    fs.move(tmp, path)


# ------------------------------------------------------------------------- in the worker
_local = threading.local()


def attempt() -> int:
    """Inside a primitive: which run of this task this is (0: the first; a task whose run was
    lost with its node or its scheduler runs again: at-least-once). 0 outside a primitive."""
    return getattr(_local, "attempt", 0)


def set_attempt(n: int) -> None:
    _local.attempt = n


def record_start(target: tuple) -> None:
    """The worker, before the primitive's body: a start marker ``s<i>.<attempt>``."""
    uri, wid, idx, _fmt, n = target
    fs, root = _filesystem(uri)
    _put(fs, f"{root}/wf/{wid}/s{idx}.{n}", encode({"t": time.time()}))


def record_result(target: tuple, value: Any, node: str) -> None:
    """The worker, after the body returned and before the run reports done: the result."""
    uri, wid, idx, fmt, n = target
    if fmt == "json":
        payload = json.dumps(value, allow_nan=False).encode()
    else:
        from ray import cloudpickle

        payload = cloudpickle.dumps(value)
    fs, root = _filesystem(uri)
    _put(fs, f"{root}/wf/{wid}/t{idx}", encode({"node": node, "t": time.time(), "attempt": n,
                                                "fmt": fmt}, payload))


# ------------------------------------------------------------------------- the scheduler's side
@dataclass
class Submission:
    """An accepted workflow as the journal keeps it. ``fmt`` ``pickle``: ``payload`` is a
    cloudpickled workflow (``LiveScheduler.submit``, ``scale_ray.client``); ``json``: a document
    the loader given to ``LiveScheduler.resume`` turns into calls (the HTTP API)."""
    id: str
    fmt: str
    payload: bytes
    name: str = ""
    group: str = ""
    key: str | None = None
    submitted: float = field(default_factory=time.time)  # epoch s
    meta: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {"id": self.id, "fmt": self.fmt, "name": self.name, "group": self.group,
                "key": self.key, "submitted": self.submitted, "meta": self.meta}


@dataclass
class Entry:
    """One workflow read back: its submission, finished tasks' results, run counts, end."""
    submission: Submission
    results: dict[int, tuple[Any, str, float]] = field(default_factory=dict)  # value, node, epoch
    runs: dict[int, int] = field(default_factory=dict)  # task -> runs started
    end: dict[str, Any] | None = None
    end_payload: bytes = b""  # a failed pickle workflow's exception


@dataclass
class Loaded:
    entries: list[Entry]
    unrestorable: dict[str, str]  # workflow id -> why it cannot be resumed
    problems: list[str]  # every entry skipped, and why


class Journal:
    """A journal at ``uri`` (module docstring). Thread-safe; every method may block on storage."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.root = _filesystem(uri)
        self.writes = 0

    def _dir(self, wid: str) -> str:
        return f"{self.root}/wf/{wid}"

    def target(self, wid: str, idx: int, fmt: str, n: int) -> tuple:
        """What the worker running task ``idx``'s run ``n`` writes to (:func:`record_start`)."""
        return (self.uri, wid, idx, fmt, n)

    def submit(self, sub: Submission) -> None:
        """Record an accepted workflow (before its id is returned to anyone)."""
        if sub.fmt not in FORMATS:
            raise ValueError(f"Submission.fmt must be one of {FORMATS}, got {sub.fmt!r}")
        self.fs.create_dir(self._dir(sub.id), recursive=True)
        _put(self.fs, f"{self._dir(sub.id)}/submit", encode(sub.header(), sub.payload))
        self.writes += 1

    def end(self, wid: str, info: dict[str, Any], payload: bytes = b"") -> None:
        """Finish and compact ``wid``: the end record (state, error, times) replaces its results
        and start markers; its submission stays (the record a GET shows) until :meth:`remove`."""
        d = self._dir(wid)
        _put(self.fs, f"{d}/end", encode(info, payload))
        self.writes += 1
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(d))
        except (FileNotFoundError, OSError):
            return
        for fi in infos:
            base = fi.base_name
            if base.startswith(("t", "s")) and base != "submit":
                self._delete(fi.path)

    def remove(self, wid: str) -> None:
        """Forget ``wid`` entirely (it is no longer kept for GET)."""
        try:
            self.fs.delete_dir(self._dir(wid))
        except (FileNotFoundError, OSError):
            pass

    def _delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except (FileNotFoundError, OSError):
            pass

    def size(self) -> dict[str, Any]:
        """``{"storage", "workflows", "entries", "bytes"}`` (a walk of the journal)."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/wf", recursive=True,
                                                        allow_not_found=True))
        files = [fi for fi in infos if fi.type == pafs.FileType.File]
        wfs = {fi.path[len(self.root) + 4:].split("/", 1)[0] for fi in files}
        return {"storage": self.uri, "workflows": len(wfs), "entries": len(files),
                "bytes": int(sum(fi.size or 0 for fi in files))}

    # -------------------------------------------------------------------- reading back
    def _read(self, path: str) -> tuple[dict[str, Any], bytes]:
        with self.fs.open_input_stream(path) as f:
            return decode(f.read())

    def load(self) -> Loaded:
        """Every workflow in the journal; a corrupt or truncated entry is reported in
        ``problems`` and skipped (a workflow without a readable submission is ``unrestorable``;
        a task without a readable result runs again). Leftover temporary files are removed."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/wf", recursive=True,
                                                        allow_not_found=True))
        by_wf: dict[str, list[Any]] = {}
        for fi in infos:
            if fi.type != pafs.FileType.File:
                continue
            wid, _, base = fi.path[len(self.root) + 4:].partition("/")
            if ".tmp-" in base:  # a write that never completed
                self._delete(fi.path)
                continue
            by_wf.setdefault(wid, []).append(fi)
        entries, unrestorable, problems = [], {}, []
        for wid in sorted(by_wf):
            files = {fi.base_name: fi.path for fi in by_wf[wid]}
            if "submit" not in files:
                why = "its submission was never completely written"
                unrestorable[wid], _ = why, problems.append(f"workflow {wid}: {why}")
                continue
            try:
                head, payload = self._read(files["submit"])
                sub = Submission(id=head["id"], fmt=head["fmt"], payload=payload,
                                 name=head.get("name", ""), group=head.get("group", ""),
                                 key=head.get("key"), submitted=float(head["submitted"]),
                                 meta=head.get("meta") or {})
            except (CorruptEntry, KeyError, TypeError, ValueError, OSError) as e:
                why = f"its submission entry is unreadable ({e})"
                unrestorable[wid] = why
                problems.append(f"workflow {wid}: {why}; skipped")
                continue
            entries.append(self._entry(wid, sub, files, problems))
        for p in problems:
            log.warning("journal %s: %s", self.uri, p)
        return Loaded(entries, unrestorable, problems)

    def _entry(self, wid: str, sub: Submission, files: dict[str, str],
               problems: list[str]) -> Entry:
        """A workflow's entry from its readable submission ``sub`` and its other files: the end,
        the runs started per task, the results of finished tasks (unreadable ones reported)."""
        entry = Entry(sub)
        if "end" in files:
            try:
                entry.end, entry.end_payload = self._read(files["end"])
            except (CorruptEntry, ValueError, OSError) as e:
                problems.append(f"workflow {wid}: end entry unreadable ({e}); resumed as "
                                f"unfinished")
        for base, path in files.items():
            if base.startswith("s") and base != "submit":
                idx = _int(base[1:].split(".", 1)[0])
                if idx is not None:
                    entry.runs[idx] = entry.runs.get(idx, 0) + 1
            elif base.startswith("t") and entry.end is None:
                idx = _int(base[1:])
                if idx is None:
                    continue
                try:
                    head, payload = self._read(path)
                    entry.results[idx] = (_value(head, payload, sub.fmt), head["node"],
                                          float(head["t"]))
                except Exception as e:  # noqa: BLE001 - any bad entry: reported, task reruns
                    problems.append(f"workflow {wid}: task {idx}'s result unreadable "
                                    f"({type(e).__name__}: {e}); it runs again")
        return entry


def _int(s: str) -> int | None:
    return int(s) if s.isdigit() else None


def _value(head: dict[str, Any], payload: bytes, fmt: str) -> Any:
    if head.get("fmt") != fmt:
        raise CorruptEntry(f"a {head.get('fmt')!r} value in a {fmt!r} workflow")
    if fmt == "json":
        return json.loads(payload)
    from ray import cloudpickle

    return cloudpickle.loads(payload)
