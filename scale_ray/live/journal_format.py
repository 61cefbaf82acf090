"""The journal's record format (:mod:`scale_ray.live.journal`): every entry is one blob, a magic,
its lengths and a CRC32 in front of a JSON header and a payload (:func:`encode` /
:func:`decode`); an accepted workflow is a :class:`Submission`; a finished workflow folded into a
segment file is one record (:func:`record_blob` / :func:`record_entry`).

Values of ``json`` workflows (HTTP documents) are JSON and never unpickled; those of ``pickle``
workflows (Python submits) are cloudpickled: the storage must be as trusted as the cluster.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAGIC", "FORMATS", "CorruptEntry", "encode", "decode", "Submission", "Entry",
           "submission_of", "record_blob", "parse_record", "record_entry", "value_of"]

MAGIC = b"SCJ1"
_HEAD = struct.Struct("<4sIII")  # magic, meta length, payload length, crc32(meta + payload)
FORMATS = ("json", "pickle")


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


@dataclass
class Submission:
    """An accepted workflow as the journal keeps it. ``fmt`` ``pickle``: ``payload`` is a
    cloudpickled workflow (``LiveScheduler.submit``, ``scale_ray.client``); ``json``: a document
    the loader given to ``LiveScheduler.resume`` turns into calls (the HTTP API)."""
    id: str
    fmt: str
    payload: bytes
    name: str = ""
    tenant: str = ""
    key: str | None = None
    submitted: float = field(default_factory=time.time)  # epoch s
    meta: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {"id": self.id, "fmt": self.fmt, "name": self.name, "tenant": self.tenant,
                "key": self.key, "submitted": self.submitted, "meta": self.meta}


@dataclass
class Entry:
    """One workflow read back: its submission, finished tasks' results, run counts, end."""
    submission: Submission
    results: dict[int, tuple[Any, str, float]] = field(default_factory=dict)  # value, node, epoch
    runs: dict[int, int] = field(default_factory=dict)  # task -> runs started
    end: dict[str, Any] | None = None
    end_payload: bytes = b""  # a failed pickle workflow's exception
    resumes: int = 0  # resumes begun since its last progress (Journal.resuming)


def submission_of(head: dict[str, Any], payload: bytes) -> Submission:
    return Submission(id=head["id"], fmt=head["fmt"], payload=payload,
                      name=head.get("name", ""),
                      tenant=head.get("tenant", head.get("group", "")),  # "group": before 11-27
                      key=head.get("key"), submitted=float(head["submitted"]),
                      meta=head.get("meta") or {})


def record_blob(sub: Submission, end: dict[str, Any] | None, end_payload: bytes,
                 results: list[tuple[int, str, float, str, bytes | None]]) -> bytes:
    """A folded workflow as one segment record: its submission, its end record or its results
    (``(task, node, t, fmt, value or None)``), checksummed as any entry."""
    values = [v for *_, v in results if v is not None]
    meta = {"sub": sub.header(), "sub_len": len(sub.payload), "end": end,
            "end_len": len(end_payload) if end is not None else 0,
            "results": [[i, node, t, fmt, -1 if v is None else len(v)]
                        for i, node, t, fmt, v in results]}
    return encode(meta, sub.payload + (end_payload if end is not None else b"") + b"".join(values))


def parse_record(blob: bytes) -> tuple[Submission, dict[str, Any] | None, bytes, list]:
    meta, payload = decode(blob)
    a, b = meta["sub_len"], meta["sub_len"] + meta["end_len"]
    sub = submission_of(meta["sub"], payload[:a])
    results, at = [], b
    for i, node, t, fmt, n in meta["results"]:
        value = None if n < 0 else payload[at:at + n]
        at += max(n, 0)
        results.append((int(i), node, float(t), fmt, value))
    return sub, meta["end"], payload[a:b], results


def record_entry(blob: bytes) -> Entry:
    """A folded workflow's :class:`Entry`: its end record, or every task done (a value for the
    kept ones, None for the others, which nothing reads again: the workflow had completed)."""
    sub, end, end_payload, results = parse_record(blob)
    entry = Entry(sub, end=end, end_payload=end_payload)
    for i, node, t, fmt, value in results:
        entry.results[i] = (None if value is None else value_of({"fmt": fmt}, value, sub.fmt),
                            node, t)
    return entry


def value_of(head: dict[str, Any], payload: bytes, fmt: str) -> Any:
    if head.get("fmt") != fmt:
        raise CorruptEntry(f"a {head.get('fmt')!r} value in a {fmt!r} workflow")
    if fmt == "json":
        return json.loads(payload)
    from ray import cloudpickle

    return cloudpickle.loads(payload)
