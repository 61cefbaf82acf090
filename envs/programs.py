"""What the scheduler knows of a workflow (``mdp.submission``; issue 47): the whole DAG, a program
that grows while it runs, or each call on its own.

Most agents do not know their DAG when they start: a ReAct loop asks the model, calls the tool it
chose, asks again. The simulator still draws each workflow's DAG when it arrives (the same seed
gives the same requests in every mode); the mode decides what the *order* may use of it:

==============  ===========================================================================
``dag``         the whole DAG at arrival (the paper's; every other module's assumption):
                ranks, ``edf``'s critical-path bound and ``srpt``'s remaining work are exact
``program``     an agent program: a call is seen when it becomes ready (its parents
                finished), as a call of its program (the program's arrival, its attained
                service and its kind are known); what comes next is not. The rank inside the
                program is 0 (unknown); ``edf``'s bound and ``srpt``'s remaining work are
                estimated from finished programs of the same kind (:class:`WorkEstimate`)
``per_call``    each call is submitted alone when it becomes ready: a one-task workflow
                arriving then (``fifo`` keys it by its ready time, ``edf`` and ``srpt`` by
                its own run time, ``las`` sees no service); nothing links it to its request
==============  ===========================================================================

The metrics stay per request in every mode: a workflow's response is from its arrival to its
last call's end. :class:`Submission` is the simulator's part that keys tasks under the mode; it
copies itself for a fork. The lookahead planner rolls out only the calls that exist under
`program` and `per_call` (``policies.fast_rollout``), so it takes static orders only there.

NumPy-free, stdlib only.
"""

from __future__ import annotations

import bisect
import copy
from typing import Any, Callable, Sequence

from . import order as orders
from .decision import DONE, READY, WAITING

SUBMISSIONS = ("dag", "program", "per_call")


def split_submission(spec: str) -> tuple[str, str | None]:
    """``POLICY[@ORDER]+MODE`` (``eft@fifo+per_call``) -> ``("eft@fifo", "per_call")``: one
    policy under another ``mdp.submission`` (eval compares modes on the same episodes); a spec
    without a known mode suffix -> ``(spec, None)``."""
    base, sep, mode = spec.rpartition("+")
    if sep and mode in SUBMISSIONS:
        return base, mode
    return spec, None


def require_dag(env: Any, who: str) -> Any:
    """``env`` itself when its ``mdp.submission`` is ``dag``; else a ``ValueError`` naming
    ``who``: the live scheduler and the services take whole DAGs (appends: not yet)."""
    if env.mdp.submission != "dag":
        raise ValueError(f"mdp.submission: {env.mdp.submission!r} is a simulator setting; "
                         f"{who} takes whole DAGs (mdp.submission: dag)")
    return env


class _Sorted:
    """Finished programs' totals of one kind, sorted, with suffix sums (mean excess over a
    threshold in O(log n))."""

    __slots__ = ("values", "_suffix")

    def __init__(self) -> None:
        self.values: list[float] = []
        self._suffix: list[float] | None = [0.0]

    def add(self, x: float) -> None:
        bisect.insort(self.values, x)
        self._suffix = None

    def mean_excess(self, done: float) -> float | None:
        """Mean of ``x - done`` over the values above ``done`` (None: no value is)."""
        xs = self.values
        i = bisect.bisect_right(xs, done)
        if i == len(xs):
            return None
        if self._suffix is None:
            suffix = [0.0] * (len(xs) + 1)
            for j in range(len(xs) - 1, -1, -1):
                suffix[j] = suffix[j + 1] + xs[j]
            self._suffix = suffix
        return self._suffix[i] / (len(xs) - i) - done

    def copy(self) -> "_Sorted":
        out = _Sorted()
        out.values = list(self.values)
        out._suffix = self._suffix  # never written in place: rebuilt after an add
        return out


class WorkEstimate:
    """Per program kind, learned online from finished programs: the remaining work of a program
    that has done ``done_s`` seconds of work (the mean excess ``E[W - done | W > done]`` over
    finished programs of the kind: a program that ran long is expected to run longer) and its
    critical-path bound (the kind's mean). A kind without history falls back to all kinds
    together; with no history at all the caller falls back to what it sees (``None``).
    Work in seconds at the cluster's mean compute (``envs.order.mean_compute``)."""

    def __init__(self) -> None:
        self._work: dict[str, _Sorted] = {}
        self._pool = _Sorted()
        self._bound: dict[str, list[float]] = {}  # kind -> [sum, count]
        self._bound_pool = [0.0, 0]

    def add(self, kind: str, work_s: float, bound_s: float) -> None:
        """A program of ``kind`` finished after ``work_s`` s of work, bound ``bound_s`` s."""
        self._work.setdefault(kind, _Sorted()).add(work_s)
        self._pool.add(work_s)
        b = self._bound.setdefault(kind, [0.0, 0])
        b[0] += bound_s
        b[1] += 1
        self._bound_pool[0] += bound_s
        self._bound_pool[1] += 1

    @property
    def programs(self) -> int:
        """Finished programs learned from."""
        return len(self._pool.values)

    def remaining_s(self, kind: str, done_s: float) -> float | None:
        """Expected work left of a program of ``kind`` that did ``done_s`` s (None: no finished
        program, of this kind or any, did more)."""
        own = self._work.get(kind)
        r = own.mean_excess(done_s) if own is not None else None
        return r if r is not None else self._pool.mean_excess(done_s)

    def bound_s(self, kind: str) -> float | None:
        """The kind's mean critical-path bound (any kind's when it has none; None: none)."""
        s, n = self._bound.get(kind) or self._bound_pool
        if not n:
            s, n = self._bound_pool
        return s / n if n else None

    def copy(self) -> "WorkEstimate":
        out = WorkEstimate()
        out._work = {k: v.copy() for k, v in self._work.items()}
        out._pool = self._pool.copy()
        out._bound = {k: list(v) for k, v in self._bound.items()}
        out._bound_pool = list(self._bound_pool)
        return out


class Submission:
    """The simulator's keys under ``mdp.submission`` (module docstring). ``order``: the driver's
    :class:`envs.order.Order`; ``costs``: how it prices work (``envs.order.Costs``)."""

    def __init__(self, mode: str, order: orders.Order, costs: orders.Costs) -> None:
        if mode not in SUBMISSIONS:
            raise ValueError(f"mdp.submission: {mode!r} is not allowed; choose one of "
                             f"{list(SUBMISSIONS)}")
        self.mode = mode
        self.order = order
        #: whether the order may not read the DAG beyond the calls that exist
        self.hidden = mode != "dag"
        self.per_call = mode == "per_call"
        #: whether a finish moves the program's level (srpt, las; never per call)
        self.dynamic = order.dynamic and not self.per_call
        #: whether finished programs teach the estimate (program mode, an order that reads the
        #: critical-path bound or the remaining work: edf, srpt)
        self.learns = mode == "program" and (order.needs_bound or order.needs_work)
        self._costs = costs
        self.estimate = WorkEstimate()

    def copy(self) -> "Submission":
        """An independent copy (a fork's): the estimate copied, the rest shared."""
        out = copy.copy(self)
        out.estimate = self.estimate.copy()
        return out

    # ------------------------------------------------------------------ keys
    def call_key(self, task: Any, t: float) -> tuple:
        """``per_call``: the key of ``task`` submitted alone at ``t`` (a one-task workflow)."""
        o, c = self.order, self._costs
        level = o.level(t, lambda: c.fast_s(task.compute, task.memory_gb, task.gpu),
                        lambda: c.work_s(task.compute, task.gpu))
        return o.key(0.0, t, task.id, level)

    def arrived(self, wf: Any, tasks: Sequence[Any], t: float) -> None:
        """Re-key a workflow that just arrived (``build_workflow`` keyed it knowing the DAG):
        nothing for ``dag``; ``per_call`` keys its sources as calls; ``program`` keys every task
        at the program's estimated level, rank 0."""
        if not self.hidden:
            return
        for tk in tasks:
            tk.rank = 0.0
        if self.per_call:
            wf.level = 0.0
            for tk in tasks:
                if tk.pending == 0:
                    tk.key = self.call_key(tk, t)
            return
        o = self.order

        def bound() -> float:
            b = self.estimate.bound_s(wf.kind)
            if b is None:  # no program finished yet: the calls it shows
                src = [tk for tk in tasks if tk.pending == 0]
                b = self._costs.lower_bound_s([tk.compute for tk in src],
                                              [tk.memory_gb for tk in src],
                                              [tk.gpu for tk in src], [()] * len(src))
            return b

        wf.level = o.level(t, bound, lambda: self._remaining(wf, tasks, None))
        key = o.key
        for tk in tasks:
            tk.key = key(0.0, t, wf.id, wf.level)

    def finished(self, wf: Any, task: Any, run_s: float,
                 push: Callable[[Any], None], rekey: Callable[..., None]) -> None:
        """A task of ``wf`` finished after ``run_s`` s under a dynamic order: ``dag`` re-keys
        with the whole DAG (``rekey``: ``envs.episode.rekey``); ``program`` moves the level
        by what it sees (``las``: the service; ``srpt``: the estimated work left) and re-keys the
        unfinished tasks, pushing the ready ones again."""
        o = self.order
        if not self.hidden:
            rekey(wf, o, task, run_s, self._costs, push)
            return
        if o.needs_work:  # the remaining work: estimated from finished programs
            wf.level = level = self._remaining(wf, wf.tasks, task)
        else:
            wf.level = level = o.on_finish(wf.level, self._costs.work_s(task.compute, task.gpu),
                                           run_s)
        key = o.key
        for tk in wf.tasks:
            st = tk.state
            if st == DONE:
                continue
            tk.key = key(0.0, wf.arrival, wf.id, level)
            if st == READY:
                push(tk)

    def completed(self, wf: Any) -> None:
        """``wf`` finished: its whole DAG is known now; the estimate learns it."""
        if self.learns:
            work = self._costs.work_s
            self.estimate.add(wf.kind, sum(work(tk.compute, tk.gpu) for tk in wf.tasks),
                              wf.lower_bound)

    def _remaining(self, wf: Any, tasks: Sequence[Any], finished: Any | None) -> float:
        """``srpt``'s level in ``program`` mode: the estimate given the work done, else (no
        history) the work of the calls that exist and are not done (``finished``'s children
        whose last parent it was are about to exist)."""
        work = self._costs.work_s
        done = sum(work(tk.compute, tk.gpu) for tk in tasks if tk.state == DONE)
        est = self.estimate.remaining_s(wf.kind, done)
        if est is not None:
            return est
        seen = sum(work(tk.compute, tk.gpu) for tk in tasks if tk.state != DONE and
                   (tk.state != WAITING or tk.pending == 0))
        if finished is not None:
            seen += sum(work(ch.compute, ch.gpu) for ch in finished.children if ch.pending == 1)
        return seen

    # ------------------------------------------------------------------ what deciders see
    def shown(self, task: Any) -> tuple[int, float]:
        """The successor count and completion ratio a decider's features show for ``task``: the
        DAG's under ``dag``; otherwise 0 successors (not yet known) and the share of the calls
        that exist that are done."""
        wf = task.wf
        if not self.hidden:
            return len(task.children), wf.done / wf.n
        if self.per_call:
            return 0, 0.0
        seen = sum(1 for tk in wf.tasks if tk.state != WAITING or tk.pending == 0)
        return 0, wf.done / seen if seen else 0.0
