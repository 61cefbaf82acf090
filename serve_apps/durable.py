"""The scheduler service's side of the journal (``live.storage``; :mod:`scale_ray.live.journal`):
rebuilding a journaled submission, idempotency keys, and the journal as ``GET /v1/cluster``
shows it."""

from __future__ import annotations

import time
from typing import Any

from scale_ray.live.durability import pickle_loader
from scale_ray.live.journal import Submission
from scale_ray.live.programs import StepResult
from scale_ray.live.workflow import CollectedWorkflow

from .errors import parse_body
from .schemas import RequestError
from .workflow_api import AllowList, AppendIn, WorkflowIn, emulate, to_workflow

MAX_KEY_CHARS = 200

__all__ = ["rebuild", "check_key", "JournalView", "MAX_KEY_CHARS"]


def rebuild(sub: Submission, allow: AllowList, tuning: Any, shown_gflop: float | None = None,
            noise_sigma: float = 0.0) -> CollectedWorkflow:
    """The calls of a journaled submission, as this replica would accept them now: an HTTP
    document is validated again against the current allow-list and ``max_tasks`` (a redeploy
    that removed one of its primitives makes it unrestorable, with the reason); then the
    service's emulation (:func:`~serve_apps.workflow_api.emulate`, the same draws)."""
    if sub.fmt == "json":
        # an append's parents in earlier steps: their journal ids (resolved when it is queued)
        earlier = {k: StepResult(jid, i) for k, (jid, i) in (sub.meta.get("earlier") or {}).items()}
        try:
            wf = to_workflow(parse_body(sub.payload, AppendIn if sub.meta.get("append")
                                        else WorkflowIn, sub.meta.get("content_type")),
                             allow, tuning.max_tasks, earlier)
        except RequestError as e:
            raise ValueError(f"{'.'.join(map(str, e.loc))}: {e.msg}") from None
    else:
        wf = pickle_loader(sub)
    return emulate(wf, sub.payload, shown_gflop, noise_sigma)


def check_key(raw: str | bytes | None) -> str | None:
    """An idempotency key (the ``Idempotency-Key`` header, the client's ``key``): 1 to 200
    printable ASCII characters; anything else (any str, bytes or other value) is a 422 naming
    the header."""
    if raw is None:
        return None
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("latin-1")  # (not ASCII: refused below)
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_KEY_CHARS or not raw.isascii() \
            or not raw.isprintable():
        raise RequestError(("header", "idempotency-key"), f"must be 1 to {MAX_KEY_CHARS} "
                           f"printable ASCII characters", "bad_key")
    return raw


class JournalView:
    """The journal's size (a walk of the storage, at most every ``every_s``) and what a resume
    could not restore."""

    def __init__(self, sched: Any, every_s: float = 5.0):
        self.sched, self.every_s = sched, every_s
        self._size: dict[str, Any] | None = None
        self._at = -1e9

    def cached_size(self) -> dict[str, Any] | None:
        """The journal's size, walked at most every ``every_s`` (None without a journal)."""
        if self.sched.durable.journal is None:
            return None
        now = time.monotonic()
        if self._size is None or now - self._at > self.every_s:
            self._size, self._at = self.sched.durable.size(), now
        return self._size

    def tenant_counts(self, held: int, is_mine: Any) -> dict[str, Any]:
        """What an HTTP tenant sees of the journal: whether there is one, how many of its
        workflows it holds (``held``), and how many of its own (``is_mine(workflow id)``)
        could not be restored or had a problem. No path, no other tenant's count."""
        s = self.sched
        if s.durable.journal is None:
            return {"on": False}
        return {"on": True, "workflows": held,
                "unrestorable": sum(1 for w in list(s.durable.unrestorable) if is_mine(w)),
                "problems": sum(1 for p in list(s.durable.journal_problems)
                                if p.startswith("workflow ") and is_mine(p[9:].split(":", 1)[0]))}

    def view(self, tenant: str) -> dict[str, Any]:
        s = self.sched
        size = self.cached_size()
        if size is None:
            return {"storage": None}
        d = s.durable
        return {**size, "problems": len(d.journal_problems), "unrestorable": len(d.unrestorable)}
