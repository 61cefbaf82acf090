"""The live scheduler's journal side (``LiveConfig.storage``; :mod:`scale_ray.live.journal`):
record what ``submit`` accepted, let every run record its result before it reports done, end and
compact finished workflows, and :meth:`Durability.resume` what an earlier scheduler with the
same storage left unfinished. Idempotent submits (``submit(key=...)``) work with or without a
journal.

:class:`Durability` is a part :class:`scale_ray.live.scheduler.LiveScheduler` owns
(``sched.durable``); it holds the journal and the idempotency keys, and reaches the scheduler
only through the two callables it is given (adopt a resumed workflow's handle, queue it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .config import WorkflowCancelled, WorkflowQuarantined
from .handles import WorkflowHandle, root_cause
from .journal import Journal, Submission, resolve_storage
from .raydag import as_collected
from .workflow import CollectedWorkflow

log = logging.getLogger(__name__)

Loader = Callable[[Submission], CollectedWorkflow]


def pickle_loader(sub: Submission) -> CollectedWorkflow:
    """The workflow of a ``pickle`` submission (``LiveScheduler.submit``, ``scale_ray.client``)."""
    from ray import cloudpickle

    if sub.fmt != "pickle":
        raise ValueError(f"a {sub.fmt!r} submission needs the loader of its service")
    return as_collected(cloudpickle.loads(sub.payload), name=sub.name)


class Durability:
    """Journal and idempotency keys of a LiveScheduler (thread safe where noted).

    Args:
        storage: ``LiveConfig.storage`` (:func:`scale_ray.live.journal.resolve_storage`).
        adopt: ``adopt(workflow, submitted_wall, submission, after, closed) -> handle``: the
            scheduler makes a resumed workflow's handle its own (calling :meth:`register`), a
            step of the program of ``after`` (None: of none), whose program is closed when
            ``closed`` (it was the first step of a program closed before the restart).
        enqueue: ``enqueue(handle)``: queue a resumed, unfinished workflow for admission.
        resume_attempts: ``LiveConfig.resume_attempts``: a workflow resumed this many times
            in a row without progress is quarantined at the next resume (:meth:`resume`).
    """

    def __init__(self, storage: str | None,
                 adopt: Callable[[CollectedWorkflow, float, Submission, WorkflowHandle | None,
                                  bool], WorkflowHandle],
                 enqueue: Callable[[WorkflowHandle], None], resume_attempts: int = 3):
        self._storage, self._adopt, self._enqueue = storage, adopt, enqueue
        self.resume_attempts = resume_attempts
        #: journal id -> resume records of a workflow this scheduler resumed, until it progresses
        self._resuming: dict[str, int] = {}
        self.journal: Journal | None = None
        self._keys: dict[tuple[str, str], WorkflowHandle] = {}
        self._by_jid: dict[str, WorkflowHandle] = {}  # journal id -> handle (held steps' lookup)
        self._lock = threading.Lock()  # the keys (any thread)
        self.unrestorable: dict[str, str] = {}  # workflow id -> why the journal cannot restore it
        self.journal_problems: list[str] = []
        self._epoch = time.time() - time.perf_counter()  # epoch s = perf_counter s + this
        self._io: ThreadPoolExecutor | None = None

    def open(self) -> None:
        """Open the journal (once; ``storage`` off: none)."""
        uri = resolve_storage(self._storage)
        if uri is not None and self.journal is None:
            self.journal = Journal(uri)
            self._io = ThreadPoolExecutor(1, thread_name_prefix="scale-journal")
            log.info("live scheduler: journal at %s", uri)

    def close(self, clean: bool = True) -> None:
        """Write the last end records (at shutdown). ``clean``: the scheduler thread never
        failed, so the workflows it resumed did not stop it: their resume records go (a
        scheduler that died keeps them: :meth:`resume` counts them)."""
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        if clean and self.journal is not None:
            with self._lock:
                resuming, self._resuming = self._resuming, {}
            for jid, n in resuming.items():
                self.safe(self.journal.progressed, jid, n)

    def progressed(self, h: WorkflowHandle) -> None:
        """A task of ``h`` finished: a resume of it that got this far did not fail
        (scheduler thread; its resume records are deleted off the thread)."""
        if not self._resuming or h.jid is None:
            return
        with self._lock:
            n = self._resuming.pop(h.jid, None)
        if n is not None and self.journal is not None:
            if self._io is not None:
                self._io.submit(self.safe, self.journal.progressed, h.jid, n)
            else:
                self.safe(self.journal.progressed, h.jid, n)

    # ------------------------------------------------------------------ submit
    def known(self, tenant: str, key: str | None) -> WorkflowHandle | None:
        """The workflow this scheduler holds under idempotency ``key`` of ``tenant``, or None."""
        if key is None:
            return None
        with self._lock:
            return self._keys.get((tenant, key))

    def record_submission(self, wf: CollectedWorkflow, tenant: str, key: str | None,
                          record: Submission | None, program: Any = None) -> Submission | None:
        """The journal entry of an accepted workflow, written before its handle exists (the
        service's ``record``, else its pickled calls, with the journal id of ``program``'s first
        step: a resume links them again); None without a journal or record."""
        if self.journal is None:
            return record
        if record is None:
            from ray import cloudpickle

            first = program.handles[0].jid if program is not None and program.handles else None
            record = Submission(id=uuid.uuid4().hex, fmt="pickle", payload=cloudpickle.dumps(wf),
                                name=wf.spec.name, tenant=tenant, key=key,
                                meta={} if first is None else {"program": first})
        self.journal.submit(record)
        return record

    def register(self, h: WorkflowHandle, sub: Submission | None, tenant: str,
                 key: str | None) -> WorkflowHandle | None:
        """The handle of an earlier submit with this key (then ``h`` is dropped), else None
        after recording ``h``'s key (any thread)."""
        if key is not None:
            with self._lock:
                hit = self._keys.get((tenant, key))
                if hit is not None:
                    return hit
                self._keys[(tenant, key)] = h
        h.key = key
        if sub is not None:
            h.jid, h.journal_fmt = sub.id, sub.fmt
            with self._lock:
                self._by_jid[sub.id] = h
        return None

    def handle(self, jid: str) -> WorkflowHandle | None:
        """The handle of journal id ``jid`` this scheduler holds (any thread)."""
        with self._lock:
            return self._by_jid.get(jid)

    def run_target(self, t: Any) -> tuple | None:
        """What a run of task ``t`` writes to the journal (None: nothing)."""
        h = t.wf.handle
        if self.journal is None or h.jid is None:
            return None
        return self.journal.target(h.jid, t.idx, h.journal_fmt, t.runs)

    # ------------------------------------------------------------------ finish, compact, forget
    def end_info(self, h: WorkflowHandle) -> tuple[dict[str, Any], bytes]:
        """The end record of a finished workflow, and (a ``pickle`` one that failed) its
        primitive's exception, pickled."""
        err = None if h.error is None else root_cause(h.error)
        state = ("completed" if err is None else
                 "cancelled" if isinstance(err, WorkflowCancelled) else "failed")
        ep, blob = self._epoch, b""
        if state == "failed" and h.journal_fmt == "pickle":
            from ray import cloudpickle

            try:
                blob = cloudpickle.dumps(err)
            except Exception:  # noqa: BLE001 - not picklable: its type name and text stay
                blob = b""
        return {"state": state, "error": None if err is None else str(err)[:2000],
                "error_type": None if err is None else type(err).__name__,
                "finished": (h.finished_wall or time.perf_counter()) + ep,
                "task_finish": [None if f is None else f + ep for f in h.task_finish_wall],
                "task_nodes": list(h.task_nodes)}, blob

    def failed(self, h: WorkflowHandle) -> None:
        """A workflow that failed or was cancelled: never run again after a restart."""
        if self.journal is not None and h.jid is not None:
            info, blob = self.end_info(h)
            if self._io is not None:
                self._io.submit(self.safe, self.journal.end, h.jid, info, blob)
            else:
                self.safe(self.journal.end, h.jid, info, blob)

    def compact(self, h: WorkflowHandle) -> None:
        """A finished workflow's results were fetched or expired: its journal keeps its record
        (state, times) and drops the results (a later restart shows it ``result_expired``);
        not while a held step waits on them (``h.pins``, :func:`scale_ray.live.programs.hold`)."""
        if self.journal is not None and h.jid is not None and h.done() and not h.pins:
            self.safe(self.journal.end, h.jid, *self.end_info(h))

    def forget(self, handles: list[WorkflowHandle]) -> None:
        """Finished ``handles`` leave the scheduler: their keys and journal entries go."""
        with self._lock:
            for h in handles:
                if h.key is not None and self._keys.get((h.tenant, h.key)) is h:
                    del self._keys[(h.tenant, h.key)]
                if h.jid is not None and self._by_jid.get(h.jid) is h:
                    del self._by_jid[h.jid]
        if self.journal is not None:
            for h in handles:
                if h.jid is not None:
                    self.safe(self.journal.remove, h.jid)

    def close_program(self, first: WorkflowHandle) -> None:
        """The agent program whose first step is ``first`` is closed: journaled (before the
        caller answers anyone), so a resume keeps it closed. Storage errors raise."""
        if self.journal is not None and first.jid is not None:
            self.journal.close_program(first.jid)

    def safe(self, fn: Callable, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - storage trouble must not stop scheduling
            log.exception("journal %s: %s failed", self.journal.uri if self.journal else "?",
                          getattr(fn, "__name__", fn))

    def size(self) -> dict[str, Any] | None:
        return None if self.journal is None else self.journal.size()

    # ------------------------------------------------------------------ resume
    def resume(self, loader: Loader | None = None) -> list[WorkflowHandle]:
        """Continue every workflow the journal holds (``LiveScheduler.resume``). Finished tasks
        are not run again: their journaled results feed their children; a task that was running runs again (its body sees ``attempt() > 0``).
        Finished workflows come back done (their results, if compacted, are gone). An
        unfinished one resumed ``resume_attempts`` times in a row without progress (each
        scheduler that resumed it stopped, not cleanly, before a task of it finished) is
        *quarantined*: it fails with :class:`~scale_ray.live.config.WorkflowQuarantined`
        (journaled: it stays failed) and is not run; its owner sees why. Returns
        the handles (``h.jid`` the journal id, ``h.key``, ``h.tenant`` as submitted); what could
        not be restored is in :attr:`unrestorable`, every skipped entry in
        :attr:`journal_problems`. ``loader`` rebuilds ``json`` submissions (a service's
        documents); ``pickle`` ones are unpickled."""
        import ray

        if self.journal is None:
            return []
        loaded = self.journal.load()
        self.unrestorable.update(loaded.unrestorable)
        self.journal_problems.extend(loaded.problems)
        out = []
        adopted: dict[str, WorkflowHandle] = {}
        now, ep = time.perf_counter(), self._epoch
        # in submission order: a program's earlier step is adopted before the steps naming it
        for e in sorted(loaded.entries, key=lambda e: e.submission.submitted):
            sub = e.submission
            try:
                wf = (loader or pickle_loader)(sub)
            except Exception as exc:  # noqa: BLE001 - whatever it was, say so and go on
                why = f"it can no longer be rebuilt ({type(exc).__name__}: {exc})"
                self.unrestorable[sub.id] = why
                self.journal_problems.append(f"workflow {sub.id}: {why}")
                log.warning("journal: workflow %s: %s", sub.id, why)
                continue
            # a step of an agent program: the workflow it continued, resumed before it
            after = adopted.get(sub.meta.get("program")) if sub.meta else None
            h = adopted[sub.id] = self._adopt(wf, min(now, sub.submitted - ep), sub, after,
                                              sub.id in loaded.closed)
            if e.end is not None:  # finished before: its record, no results
                fin = e.end.get("task_finish") or []
                nodes = e.end.get("task_nodes") or []
                for i in range(min(len(fin), len(h.task_finish_wall))):
                    h.task_finish_wall[i] = None if fin[i] is None else fin[i] - ep
                    h.task_nodes[i] = nodes[i] if i < len(nodes) else None
                h.record_completion(float(e.end.get("finished", sub.submitted)) - ep,
                            _restored_error(e.end, e.end_payload, sub.fmt))
            elif e.resumes >= self.resume_attempts:
                self._quarantine(h, e.resumes)
            else:
                h.resumed_tasks = {i: (ray.put(v), node, t - ep) for i, (v, node, t) in
                              e.results.items() if 0 <= i < len(wf.calls)}
                h.prior_runs = dict(e.runs)
                self.safe(self.journal.resuming, sub.id, e.resumes)
                with self._lock:
                    self._resuming[sub.id] = e.resumes + 1
                self._enqueue(h)
            out.append(h)
        log.info("live scheduler: resumed %d workflows from %s (%d unrestorable, %d problems)",
                 len(out), self.journal.uri, len(loaded.unrestorable), len(loaded.problems))
        return out


    def _quarantine(self, h: WorkflowHandle, resumes: int) -> None:
        """Fail ``h`` instead of resuming it again (:meth:`resume`)."""
        why = (f"workflow {h.jid}: quarantined ({h.name!r}): it was resumed {resumes} times "
               f"in a row and each scheduler that resumed it stopped before a task of it "
               f"finished (live.resume_attempts={self.resume_attempts}); it is not run again "
               f"(delete it; submit it again once the cause is fixed)")
        log.error("journal: %s", why)
        self.journal_problems.append(why)
        h.record_completion(time.perf_counter(), WorkflowQuarantined(why))
        self.failed(h)


#: errors a journal's end record names that come back as their own class
_KNOWN_ERRORS = {"WorkflowQuarantined": WorkflowQuarantined}


def _restored_error(end: dict[str, Any], blob: bytes, fmt: str) -> BaseException | None:
    """The error of a workflow that finished before a restart: the primitive's own exception
    (a ``pickle`` workflow's, unpickled), else one of its type's name carrying its text."""
    state, msg = end.get("state"), end.get("error") or ""
    if state == "completed":
        return None
    if state == "cancelled":
        return WorkflowCancelled(msg)
    if blob and fmt == "pickle":
        from ray import cloudpickle

        try:
            return cloudpickle.loads(blob)
        except Exception:  # noqa: BLE001 - its class is gone: the name and text below
            pass
    name = str(end.get("error_type") or "RuntimeError")
    if name in _KNOWN_ERRORS:
        return _KNOWN_ERRORS[name](msg)
    return type(name if name.isidentifier() else "RuntimeError", (RuntimeError,), {})(msg)
