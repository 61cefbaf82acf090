"""The journal: what a scheduler accepted and what its primitives returned, so that a scheduler
that restarts (a Serve replica replaced, a driver run again) resumes every unfinished workflow
(docs/serving.md, "Durability").

Storage is any ``pyarrow.fs`` URI or a local path (``/mnt/nfs/scale``, ``s3://bucket/prefix``,
``gs://...``), as Ray Train's ``storage_path``. Layout: one directory per unfinished workflow,
and finished ones folded into a few shared files::

    <root>/wf/<id>/submit        the accepted workflow: its document or pickled calls, key, tenant
    <root>/wf/<id>/s<i>.<a>      task i's run number a started (written by the worker first)
    <root>/wf/<id>/t<i>          task i finished: its result (written by the worker before the
                                 run reports done)
    <root>/wf/<id>/r<n>          the n-th resume of it since its last progress began
                                 (deleted when a task of it finishes after that resume or the
                                 scheduler shuts down cleanly: ``LiveConfig.resume_attempts``)
    <root>/closed/<id>           the agent program whose first step is workflow <id> was
                                 closed (no more steps; deleted with that workflow)
    <root>/done/<seq>-<writer>   finished workflows, up to SEGMENT_RECORDS (or SEGMENT_BYTES)
                                 a file: each one's submission and either its kept results
                                 (:meth:`Journal.finish`: a completed workflow's outputs; the
                                 other tasks' node and time) or its end record (:meth:`Journal.end`:
                                 state, error, times; no results)

Folding a workflow writes its record into the open segment, then deletes its directory; a
forgotten one (:meth:`Journal.remove`) is dropped from its segment, and a segment left under a
quarter full is merged into the open one. So the journal holds files for unfinished work plus
about ``retained / (SEGMENT_RECORDS / 4)`` segments, whatever it ran before (it held 65,864
files after 45k tasks when every finished task kept its files until its result was fetched).
One writer per journal (one scheduler); a new one opens a segment of its own.

Every entry is one object written whole under a temporary name and then moved into place, and
carries a magic, its lengths and a CRC32 (:mod:`scale_ray.live.journal_format`): a crash at any point leaves either the old state or the
new one, and a truncated or corrupt entry is reported (:attr:`Loaded.problems`) and skipped, never
raised. Semantics are at-least-once: a task whose result is not in the journal runs again after a
restart; its body can read :func:`attempt` (0 on its first run).

Values of ``json`` workflows (HTTP documents) are stored as JSON and never unpickled; values of
``pickle`` workflows (Python submits) with cloudpickle: the storage must be as trusted as the
cluster itself. On a local file system (the default ``session`` storage, NFS) the journal's
directories are its owner's only (0700) and its files too (0600): they hold tenants' bodies
and results.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .journal_format import (FORMATS, CorruptEntry, Entry, Submission, decode, encode,
                             parse_record, record_blob, record_entry, submission_of, value_of)

log = logging.getLogger(__name__)

SEGMENT_RECORDS = 128  # finished workflows per segment file (the open one is rewritten whole)
SEGMENT_BYTES = 1 << 20  # ... or this many bytes, whichever comes first
FILE_MODE, DIR_MODE = 0o600, 0o700  # a local journal's files and directories: its owner's only

__all__ = ["Journal", "Submission", "Loaded", "CorruptEntry", "attempt", "encode", "decode",
           "resolve_storage", "FORMATS", "SEGMENT_RECORDS", "SEGMENT_BYTES"]


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
            _mkdir(fs, root)  # (a journal written before the modes: its root closed now)
            hit = _FS[uri] = (fs, root.rstrip("/"))
        return hit


def _on_disk(fs: Any) -> bool:
    import pyarrow.fs as pafs

    return isinstance(fs, pafs.LocalFileSystem)


def _mkdir(fs: Any, path: str) -> None:
    """Directory ``path`` (and its parents); a local one its owner's only (``DIR_MODE``)."""
    fs.create_dir(path, recursive=True)
    if _on_disk(fs):
        os.chmod(path, DIR_MODE)


def _put(fs: Any, path: str, blob: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open_output_stream(tmp) as f:
        if _on_disk(fs):  # (before a byte is written; the rename keeps the mode)
            os.chmod(tmp, FILE_MODE)
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


def current_step() -> tuple | None:
    """Inside a primitive the scheduler service runs: (its workflow's id, tenant, the service's
    app name), what ``scale_ray.client.program()`` continues; None elsewhere."""
    return getattr(_local, "step", None)


def set_step(step: tuple | None) -> None:
    _local.step = step


def record_start(target: tuple) -> None:
    """The worker, before the primitive's body: a start marker ``s<i>.<attempt>``."""
    uri, wid, idx, _fmt, n = target
    fs, root = _filesystem(uri)
    _put_late(fs, f"{root}/wf/{wid}/s{idx}.{n}", encode({"t": time.time()}))


def _put_late(fs: Any, path: str, blob: bytes) -> None:
    """A worker's write; its workflow's directory gone (a late hedged copy of a workflow that
    finished and was folded or forgotten) is nothing to record."""
    try:
        _put(fs, path, blob)
    except FileNotFoundError:
        pass


def record_result(target: tuple, value: Any, node: str) -> None:
    """The worker, after the body returned and before the run reports done: the result."""
    uri, wid, idx, fmt, n = target
    if fmt == "json":
        payload = json.dumps(value, allow_nan=False).encode()
    else:
        from ray import cloudpickle

        payload = cloudpickle.dumps(value)
    fs, root = _filesystem(uri)
    _put_late(fs, f"{root}/wf/{wid}/t{idx}", encode({"node": node, "t": time.time(),
                                                     "attempt": n, "fmt": fmt}, payload))


# ------------------------------------------------------------------------- the scheduler's side
@dataclass
class Loaded:
    entries: list[Entry]
    unrestorable: dict[str, str]  # workflow id -> why it cannot be resumed
    problems: list[str]  # every entry skipped, and why
    closed: set[str] = field(default_factory=set)  # closed programs, by their first step's id


class Journal:
    """A journal at ``uri`` (module docstring). Thread-safe; every method may block on storage."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.root = _filesystem(uri)
        for sub in ("wf", "done", "closed"):
            _mkdir(self.fs, f"{self.root}/{sub}")
        self.writes = 0
        self._lock = threading.RLock()  # the segments (workers write only their own task files)
        self._where: dict[str, str] | None = None  # folded workflow -> its segment (None: unread)
        self._segs: dict[str, dict[str, int]] = {}  # segment -> {workflow: record bytes}
        self._open: str | None = None  # the segment new records go to (this writer's)
        self._open_blobs: dict[str, bytes] = {}
        self._writer = uuid.uuid4().hex[:8]

    def _dir(self, wid: str) -> str:
        return f"{self.root}/wf/{wid}"

    def target(self, wid: str, idx: int, fmt: str, n: int) -> tuple:
        """What the worker running task ``idx``'s run ``n`` writes to (:func:`record_start`)."""
        return (self.uri, wid, idx, fmt, n)

    def submit(self, sub: Submission) -> None:
        """Record an accepted workflow (before its id is returned to anyone)."""
        if sub.fmt not in FORMATS:
            raise ValueError(f"Submission.fmt must be one of {FORMATS}, got {sub.fmt!r}")
        _mkdir(self.fs, self._dir(sub.id))
        _put(self.fs, f"{self._dir(sub.id)}/submit", encode(sub.header(), sub.payload))
        self.writes += 1

    def finish(self, wid: str, keep: Any) -> None:
        """``wid`` completed: fold it into a segment with the results of tasks ``keep`` (its
        outputs; the others keep their node and time, not their value: a resume marks them done
        without running them) and delete its directory. Nothing when it is not in a directory
        (already folded, forgotten, never journaled)."""
        with self._lock:
            if wid in self._index():
                self._delete_dir(wid)
                return
            self._fold(wid, None, b"", set(keep))

    def end(self, wid: str, info: dict[str, Any], payload: bytes = b"") -> None:
        """Finish and compact ``wid``: its end record (state, error, times) replaces its results
        and start markers; its submission stays (the record a GET shows) until :meth:`remove`."""
        with self._lock:
            seg = self._index().get(wid)
            if seg is None:
                self._fold(wid, info, payload, set())
                return
            self._delete_dir(wid)  # (a leftover: a late run's result)
            blobs = self._seg_blobs(seg)
            sub, _, _, _ = parse_record(blobs[wid])
            blobs[wid] = record_blob(sub, info, payload, [])
            self._write_seg(seg, blobs)

    def resuming(self, wid: str, n: int) -> None:
        """Record that a scheduler begins the ``n``-th resume (from 0) of unfinished ``wid``
        since its last progress (:meth:`progressed`)."""
        _put(self.fs, f"{self._dir(wid)}/r{n}", encode({"t": time.time()}))
        self.writes += 1

    def progressed(self, wid: str, n: int) -> None:
        """``wid`` made progress after its resume (a task finished, or the scheduler that
        resumed it shut down cleanly): its ``n`` resume records go."""
        for i in range(n):
            self._delete(f"{self._dir(wid)}/r{i}")

    def close_program(self, first: str) -> None:
        """Record that the agent program whose first step is workflow ``first`` is closed."""
        _put(self.fs, f"{self.root}/closed/{first}", b"")
        self.writes += 1

    def remove(self, wid: str) -> None:
        """Forget ``wid`` entirely (it is no longer kept for GET)."""
        with self._lock:
            self._delete_dir(wid)
            self._delete(f"{self.root}/closed/{wid}")
            seg = self._index().get(wid)
            if seg is None:
                return
            blobs = self._seg_blobs(seg)
            blobs.pop(wid, None)
            del self._where[wid]
            self._write_seg(seg, blobs)
            self._merge_if_sparse(seg)

    def _delete_dir(self, wid: str) -> None:
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

        with self._lock:
            folded = set(self._index())
        files = [fi for sub in ("wf", "done", "closed") for fi in self.fs.get_file_info(
            pafs.FileSelector(f"{self.root}/{sub}", recursive=True, allow_not_found=True))
            if fi.type == pafs.FileType.File]
        dirs = {fi.path[len(self.root) + 4:].split("/", 1)[0] for fi in files
                if fi.path.startswith(f"{self.root}/wf/")}
        return {"storage": self.uri, "workflows": len(dirs | folded), "entries": len(files),
                "bytes": int(sum(fi.size or 0 for fi in files))}

    # -------------------------------------------------------------------- segments
    def _seg_path(self, seg: str) -> str:
        return f"{self.root}/done/{seg}"

    def _index(self) -> dict[str, str]:
        """Folded workflow -> its segment (read from storage the first time)."""
        if self._where is None:
            self._read_segments([])
        return self._where

    def _read_segments(self, problems: list[str]) -> dict[str, bytes]:
        """Every segment's records (workflow -> record; one in two segments, after a crash
        mid-merge: the later segment's); rebuilds the index. Unreadable ones are reported."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/done",
                                                        allow_not_found=True))
        records: dict[str, bytes] = {}
        self._where, self._segs = {}, {}
        for fi in sorted((fi for fi in infos if fi.type == pafs.FileType.File),
                         key=lambda fi: fi.base_name):
            if ".tmp-" in fi.base_name:
                self._delete(fi.path)
                continue
            try:
                blobs = self._seg_blobs(fi.base_name)
            except (CorruptEntry, KeyError, TypeError, ValueError, OSError) as e:
                problems.append(f"segment {fi.base_name}: unreadable ({e}); its finished "
                                f"workflows are not restored")
                continue
            for wid, blob in blobs.items():
                old = self._where.get(wid)
                if old is not None:
                    self._segs[old].pop(wid, None)
                records[wid] = blob
                self._where[wid] = fi.base_name
                self._segs.setdefault(fi.base_name, {})[wid] = len(blob)
        return records

    def _seg_blobs(self, seg: str) -> dict[str, bytes]:
        """Workflow -> record of segment ``seg`` (in order)."""
        if seg == self._open:
            return dict(self._open_blobs)
        head, payload = self._read(self._seg_path(seg))
        out, at = {}, 0
        for wid, n in zip(head["ids"], head["lengths"]):
            out[wid], at = payload[at:at + n], at + n
        return out

    def _write_seg(self, seg: str, blobs: dict[str, bytes]) -> None:
        """Segment ``seg`` holds ``blobs`` now (written whole; deleted when empty)."""
        if blobs:
            _put(self.fs, self._seg_path(seg), encode(
                {"ids": list(blobs), "lengths": [len(b) for b in blobs.values()]},
                b"".join(blobs.values())))
        else:
            self._delete(self._seg_path(seg))
        self.writes += 1
        self._segs[seg] = {w: len(b) for w, b in blobs.items()}
        if not blobs and seg != self._open:
            del self._segs[seg]
        if seg == self._open:
            self._open_blobs = dict(blobs)

    def _append(self, records: dict[str, bytes]) -> None:
        """Add ``records`` to the open segment (a new one when it is full), written whole."""
        self._index()
        pending = dict(records)
        while pending:
            if self._open is None or len(self._open_blobs) >= SEGMENT_RECORDS or \
                    sum(map(len, self._open_blobs.values())) >= SEGMENT_BYTES:
                last = max(self._segs, default="0")
                self._open = f"{int(last.split('-', 1)[0]) + 1:010d}-{self._writer}"
                self._open_blobs = {}
                _mkdir(self.fs, f"{self.root}/done")
            blobs = dict(self._open_blobs)
            while pending and len(blobs) < SEGMENT_RECORDS and \
                    (not blobs or sum(map(len, blobs.values())) < SEGMENT_BYTES):
                wid, blob = next(iter(pending.items()))
                del pending[wid]
                blobs[wid] = blob
            self._write_seg(self._open, blobs)
            for wid in blobs:
                self._where[wid] = self._open

    def _merge_if_sparse(self, seg: str) -> None:
        """A segment (not the open one) under a quarter full: its records move to the open one
        (written first, then the old file deleted: a crash between leaves a copy load ignores)."""
        live = self._segs.get(seg)
        if seg == self._open or not live or len(live) >= SEGMENT_RECORDS // 4 \
                or sum(live.values()) >= SEGMENT_BYTES // 4:
            return
        blobs = self._seg_blobs(seg)
        self._append(blobs)
        self._delete(self._seg_path(seg))
        self._segs.pop(seg, None)

    def _fold(self, wid: str, end: dict[str, Any] | None, end_payload: bytes,
              keep: set[int]) -> None:
        """Move workflow directory ``wid`` into the open segment: its submission, and ``end``
        (compacted) or the results of tasks ``keep`` (the others' node and time only)."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._dir(wid)))
        except (FileNotFoundError, OSError):
            return
        files = {fi.base_name: fi.path for fi in infos if fi.type == pafs.FileType.File}
        if "submit" not in files:
            return
        try:
            sub = submission_of(*self._read(files["submit"]))
        except (CorruptEntry, KeyError, TypeError, ValueError, OSError):
            return  # (load reports it; nothing to fold)
        if end is None and "end" in files:  # (an end record of the layout before segments)
            try:
                end, end_payload = self._read(files["end"])
            except (CorruptEntry, ValueError, OSError):
                end = None
        results = []
        if end is None:
            for base, path in files.items():
                idx = _int(base[1:]) if base.startswith("t") else None
                if idx is None:
                    continue
                try:
                    head, value = self._read(path)
                    results.append((idx, str(head["node"]), float(head["t"]),
                                    str(head.get("fmt")), value if idx in keep else None))
                except (CorruptEntry, KeyError, TypeError, ValueError, OSError):
                    continue  # (not kept: the task runs again after a restart)
        self._append({wid: record_blob(sub, end, end_payload, results)})
        self._delete_dir(wid)

    # -------------------------------------------------------------------- reading back
    def _read(self, path: str) -> tuple[dict[str, Any], bytes]:
        with self.fs.open_input_stream(path) as f:
            return decode(f.read())

    def load(self) -> Loaded:
        """Every workflow in the journal; a corrupt or truncated entry is reported in
        ``problems`` and skipped (a workflow without a readable submission is ``unrestorable``;
        a task without a readable result runs again). Leftover temporary files are removed,
        and so are directories of workflows a segment holds (a late run's result)."""
        import pyarrow.fs as pafs

        problems: list[str] = []
        with self._lock:
            records = self._read_segments(problems)
            self._open, self._open_blobs = None, {}
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
        entries, unrestorable = [], {}
        for wid in by_wf.keys() & records.keys():
            self._delete_dir(wid)
        for wid in sorted(set(by_wf) | set(records)):
            if wid in records:
                try:
                    entries.append(record_entry(records[wid]))
                except Exception as e:  # noqa: BLE001 - a bad record: reported, skipped
                    why = f"its finished record is unreadable ({type(e).__name__}: {e})"
                    unrestorable[wid] = why
                    problems.append(f"workflow {wid}: {why}; skipped")
                continue
            files = {fi.base_name: fi.path for fi in by_wf[wid]}
            if "submit" not in files:
                why = "its submission was never completely written"
                unrestorable[wid], _ = why, problems.append(f"workflow {wid}: {why}")
                continue
            try:
                sub = submission_of(*self._read(files["submit"]))
            except (CorruptEntry, KeyError, TypeError, ValueError, OSError) as e:
                why = f"its submission entry is unreadable ({e})"
                unrestorable[wid] = why
                problems.append(f"workflow {wid}: {why}; skipped")
                continue
            entries.append(self._entry(wid, sub, files, problems))
        with self._lock:  # what earlier writers left under a quarter full joins one segment
            for seg in sorted(self._segs):
                self._merge_if_sparse(seg)
        for p in problems:
            log.warning("journal %s: %s", self.uri, p)
        return Loaded(entries, unrestorable, problems, self._closed())

    def _closed(self) -> set[str]:
        """The closed programs (:meth:`close_program`); leftover temporary files removed."""
        import pyarrow.fs as pafs

        out = set()
        for fi in self.fs.get_file_info(pafs.FileSelector(f"{self.root}/closed")):
            if ".tmp-" in fi.base_name:
                self._delete(fi.path)
            elif fi.type == pafs.FileType.File:
                out.add(fi.base_name)
        return out

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
            if base.startswith("r") and _int(base[1:]) is not None:
                entry.resumes += 1
            elif base.startswith("s") and base != "submit":
                idx = _int(base[1:].split(".", 1)[0])
                if idx is not None:
                    entry.runs[idx] = entry.runs.get(idx, 0) + 1
            elif base.startswith("t") and entry.end is None:
                idx = _int(base[1:])
                if idx is None:
                    continue
                try:
                    head, payload = self._read(path)
                    entry.results[idx] = (value_of(head, payload, sub.fmt), head["node"],
                                          float(head["t"]))
                except Exception as e:  # noqa: BLE001 - any bad entry: reported, task reruns
                    problems.append(f"workflow {wid}: task {idx}'s result unreadable "
                                    f"({type(e).__name__}: {e}); it runs again")
        return entry


def _int(s: str) -> int | None:
    return int(s) if s.isdigit() else None
