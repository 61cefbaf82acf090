"""The cluster's size in the live scheduler and the scheduler service (``env.sizing.policy`` not
``static``; docs/autoscale.md, "Live and in the service").

Every ``interval_s`` model seconds the scheduler thread builds the :class:`envs.sizing.SizingView`
of the live cluster, asks the sizer the simulator uses (``policies.sizing.make_sizer``) for a
:class:`envs.sizing.Plan`, cuts its launches to ``sizing.budget_per_hour``
(``envs.sizing.within_budget``) and keeps it. The view, from what the scheduler knows:

* nodes: its servers grouped by Ray node (a node of a tier ``env.cluster.tiers`` does not name
  is not sized: it is neither counted nor drained);
* pending, queued, waiting and running work of its tasks (``envs.sizing.work``: what a task
  holds on a Ray node, whatever ``live.model`` is), a run's rest from its expected end;
* the arrivals (model s) of the last ``max(trend_s, slope_s)`` (``env.sizing.model``: all the
  sizers read of them; older ones are dropped) and the mean work of the last 500 workflows.

:meth:`LiveSizing.snapshot` (``GET /v1/cluster`` ``sizing``, the service's gauges): the nodes
wanted per tier and why, the launches and drains of the last turn, the cost so far
(``envs.accounting.Billing``: each node billed from when the scheduler first saw it, at its
tier's ``price_per_hour``) and the SLO attainment of the windows so far
(``envs.accounting.slo_report``; the window in progress is not counted). The windows are kept
folded: per window, its count of responses, how many are within the p95 bound and the largest
of those and the smallest beyond it -- all a window's p95 verdict depends on -- so a turn reads
only the workflows still running and the windows they changed, never every record. A late
response (a workflow of a closed window that finishes now, or a step of an agent program, which
arrives at its program's start) updates its window's verdict.

What reaches the cluster (``live.sizing_apply``):

* ``advise`` (default): nothing; the plan is for the operator or an outside controller.
* ``ray``: the nodes wanted, one bundle of each node's shape (its tier's resources), through
  Ray's ``request_resources`` -- the floor Ray's autoscaler (and KubeRay's) keeps and launches
  up to; and the servers of the nodes the plan drains stop taking new work, so they empty and
  Ray's idle timeout removes them. Launching, terminating and cloud quotas stay Ray's job. The
  nodes asked for count as launching (the sizer does not ask again) until as many of their
  tier join, or past the tier's slowest launch. A launch of a tier takes a drained node of it
  that is still there back first.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from envs.accounting import UNFINISHED, Billing, window_p95
from envs.config import EnvConfig
from envs.demands import CPU, GPU
from envs.sizing import NodeView, Plan, Sizer, SizingView, within_budget, work

from .context import LiveContext
from .tasks import READY, RUNNING, WAITING

if TYPE_CHECKING:
    from .nodes import LiveServer
    from .tasks import LiveTask, LiveWorkflow

log = logging.getLogger(__name__)

__all__ = ["LiveSizing", "APPLY"]

APPLY = ("advise", "ray")
RECENT = 500  # workflows whose mean work the sizer reads (as the simulator's)


class _Arrival:
    """A workflow as ``envs.accounting.slo_report`` reads it (model s), until it is done
    (``settled``) and folded into its window."""
    __slots__ = ("arrival", "finish", "done", "n", "settled", "k")

    def __init__(self, arrival: float, k: int):
        self.arrival, self.finish, self.done, self.n = arrival, 0.0, 0, 1
        self.settled, self.k = False, k


class _Window:
    """One SLO window's responses, folded: how many settled (``n``), how many of them within
    the bound (``le``), the largest of those (``max_le``) and the smallest beyond it
    (``min_gt``), the workflows not done yet (``open``, each a miss until it is) and the
    verdict last counted (``met``; None: not counted). The p95 of the sorted responses reads
    two neighbours; within the bound only the largest can be one of them and beyond it only
    the smallest, so these decide the verdict exactly as ``envs.accounting.slo_report``."""
    __slots__ = ("n", "le", "max_le", "min_gt", "open", "met")

    def __init__(self) -> None:
        self.n, self.le, self.open = 0, 0, 0
        self.max_le, self.min_gt = -math.inf, math.inf
        self.met: bool | None = None

    def add(self, response: float, bound: float) -> None:
        self.n += 1
        if response <= bound:
            self.le += 1
            self.max_le = max(self.max_le, response)
        else:
            self.min_gt = min(self.min_gt, response)

    def meets(self, bound: float) -> bool:
        """Whether the window's p95 is within ``bound`` (``slo_report``'s verdict)."""
        total = self.n + self.open
        gt = min(self.min_gt, UNFINISHED) if self.open else self.min_gt
        if self.le == total:  # the p95 falls between two responses within the bound
            return True
        if self.le == 0:  # between two beyond it
            return False
        # the same ranks, the same neighbours: numpy's interpolation of them, as slo_report
        same = np.full(total, gt)
        same[:self.le] = self.max_le
        return window_p95(same) <= bound


class LiveSizing:
    """The sizer's turns on the live scheduler's thread (module docstring).

    Args:
        ctx: the scheduler's context (its clock, config, env).
        sizer: the sizer (``policies.sizing.make_sizer(env)``).
        request: Ray's ``request_resources`` (a test passes its own); used with ``apply: ray``.
    """

    def __init__(self, ctx: LiveContext, sizer: Sizer,
                 request: Callable[..., Any] | None = None) -> None:
        self.ctx, self.env, self.sizer = ctx, ctx.env, sizer
        self.apply = ctx.cfg.sizing_apply
        self._request = request
        env: EnvConfig = ctx.env
        self.tiers = {t.name: t for t in env.cluster.tiers}
        self.prices = {t.name: t.price_per_hour for t in env.cluster.tiers}
        self.billing = Billing(self.prices, env.cluster.billing_min_s)
        self.node_ids: dict[str, int] = {}  # Ray node id -> the sizer's node id
        self.seen: dict[str, str] = {}  # Ray node id -> tier, of the nodes billed now
        self.draining: set[str] = set()  # Ray node ids the plan drains
        self.undrained: set[str] = set()  # Ray node ids taken back from draining (to offer)
        self.asked: dict[str, list[float]] = {}  # per tier, when each launch not joined was asked
        self.last_counts: dict[str, int] = {}
        self.arrivals: list[float] = []  # ascending, the last ``keep_s`` (model s)
        self.keep_s = max(env.sizing.model.trend_s, env.sizing.model.slope_s)
        self.windows: dict[int, _Window] = {}  # SLO window index -> its folded responses
        self.unsettled: list[_Arrival] = []  # workflows not folded into their windows yet
        self.changed: set[int] = set()  # windows whose verdict is to count again
        self.unmet = 0  # closed windows counted as missing the SLO
        self.recent: deque[dict[str, float]] = deque(maxlen=RECENT)
        self.turns = 0
        self.next_t = 0.0
        self.decide_ms = 0.0
        self._snap: dict[str, Any] = {"policy": env.sizing.policy, "apply": self.apply,
                                      "turns": 0}

    # ------------------------------------------------------------------ intake
    def admitted(self, wf: "LiveWorkflow") -> None:
        """A workflow was admitted: its arrival and work count from now on; its response when
        its handle finishes."""
        bisect.insort(self.arrivals, wf.arrival)
        k = int(wf.arrival // self.env.sizing.slo.window_s)
        rec = _Arrival(wf.arrival, k)
        if k >= 0:  # (a window before 0 is never reported)
            self.windows.setdefault(k, _Window()).open += 1
            self.changed.add(k)
            self.unsettled.append(rec)
        per = {CPU: 0.0, GPU: 0.0}
        for t in wf.tasks:
            kind, w = self._work(t)
            per[kind] += w
        self.recent.append(per)
        ctx = self.ctx

        def finished(h: Any) -> None:
            rec.finish = ctx.now_model()
            rec.done = 0 if h.error is not None else 1
            rec.settled = True  # last: the scheduler thread folds it at its next turn

        wf.handle.add_done_callback(finished)

    @staticmethod
    def _work(t: "LiveTask") -> tuple[str, float]:
        r = t.prim.request
        return work(r.on_nodes(), r.gpu > 0, t.prim.compute_gflop)

    # ------------------------------------------------------------------ a turn
    def due(self, now: float) -> bool:
        return now >= self.next_t

    def turn(self, alive: list["LiveServer"], queue: Any) -> Plan:
        """One turn (scheduler thread): bill, view, decide, cut to the budget, apply."""
        now = self.ctx.now_model()
        self.next_t = now + self.sizer.interval_s
        t0 = time.perf_counter()
        del self.arrivals[:bisect.bisect_left(self.arrivals, now - self.keep_s)]
        nodes = self._bill(alive, now)
        view = self.view(alive, queue, nodes, now)
        counts = self.counts(view)
        self._joined(counts, now)
        view.launching = {k: len(v) for k, v in self.asked.items() if v}
        plan = self.sizer.decide(view)
        have = {k: n + view.launching.get(k, 0) for k, n in counts.items()}
        launch, cut = within_budget(plan.launch, have, self.prices,
                                    self.env.sizing.budget_per_hour)
        for k, n in list(launch.items()):  # a drained node still there takes work again first
            back = [nid for nid in self.draining if self.seen.get(nid) == k][:n]
            self.draining -= set(back)
            self.undrained |= set(back)
            have[k] += len(back)
            launch[k] = n - len(back)
            if not launch[k]:
                del launch[k]
        why = plan.why + ("; launches cut to sizing.budget_per_hour" if cut else "")
        drain = [nv for nv in view.nodes if nv.id in set(plan.drain) and nv.accepting]
        self.decide_ms = 1e3 * (time.perf_counter() - t0)
        self.turns += 1
        self.ctx.counters["sizing_turns"] += 1
        by_id = {v: k for k, v in self.node_ids.items()}
        wanted = dict(have)
        for k, n in launch.items():
            wanted[k] = wanted.get(k, 0) + n
        for nv in drain:
            wanted[nv.tier] -= 1
        if self.apply == "ray":
            self.draining |= {by_id[nv.id] for nv in drain}
            for k, n in launch.items():
                self.asked.setdefault(k, []).extend([now] * n)
            self._ask(wanted)
        self._snap = self._snapshot(now, counts, wanted, launch, drain, why, by_id)
        return Plan(launch, [nv.id for nv in drain], why)

    def _joined(self, counts: dict[str, int], now: float) -> None:
        """``apply: ray``: nodes asked for and not joined yet (``SizingView.launching``): a
        tier's oldest asks are met as its count grows, and given up past its slowest launch
        (``launch_s`` mean + 3 std, or its max)."""
        for k, asks in self.asked.items():
            grew = max(0, counts.get(k, 0) - self.last_counts.get(k, counts.get(k, 0)))
            del asks[:grew]
            dist = self.tiers[k].launch_s
            limit = 600.0 if dist is None else (dist.max if dist.max is not None
                                                else dist.mean + 3 * dist.std)
            asks[:] = [t for t in asks if now - t <= limit]
        self.last_counts = dict(counts)

    def counts(self, view: SizingView) -> dict[str, int]:
        """Per tier, the nodes taking work."""
        out = {k: 0 for k in self.tiers}
        for nv in view.nodes:
            if nv.accepting:
                out[nv.tier] += 1
        return out

    def _bill(self, alive: list["LiveServer"], now: float) -> dict[str, list["LiveServer"]]:
        """The alive servers by Ray node (of a configured tier); a node seen first is billed
        from now, a node gone stops."""
        nodes: dict[str, list[LiveServer]] = {}
        for s in alive:
            if s.node.tier in self.tiers:
                nodes.setdefault(s.node.node_id, []).append(s)
        for nid in list(self.seen):
            if nid not in nodes:
                self.billing.stop(nid, now)
                del self.seen[nid]
                self.draining.discard(nid)
        for nid, servers in nodes.items():
            if nid not in self.seen:
                self.seen[nid] = servers[0].node.tier
                self.billing.start(nid, servers[0].node.tier, now)
                self.node_ids.setdefault(nid, len(self.node_ids))
        return nodes

    def view(self, alive: list["LiveServer"], queue: Any,
             nodes: dict[str, list["LiveServer"]], now: float) -> SizingView:
        """What the sizer reads now (module docstring)."""
        ctx = self.ctx
        wall = time.perf_counter()
        running = {CPU: 0.0, GPU: 0.0}
        views = []
        for nid, servers in nodes.items():
            used: dict[str, float] = {}
            runs, idle_since = 0, 0.0
            for s in servers:
                idle_since = max(idle_since, s.idle_since)
                for t, until in s.running.items():
                    runs += 1
                    for k, v in t.prim.request.on_nodes():
                        used[k] = used.get(k, 0.0) + v
                    if t.state == RUNNING:
                        kind, w = self._work(t)
                        span = max(until - t.started, 1e-9)
                        running[kind] += w * min(1.0, max(0.0, until - wall) / span)
            since = self.billing.since(nid)
            views.append(NodeView(self.node_ids[nid], servers[0].node.tier,
                                  nid not in self.draining, runs,
                                  0.0 if runs else max(0.0, now - ctx.model_time(idle_since)),
                                  used, 0.0 if since is None else now - since))
        pending, queued, waiting = [], {CPU: 0.0, GPU: 0.0}, {CPU: 0.0, GPU: 0.0}
        seen: set[int] = set()
        wfs: dict[int, Any] = {}  # the workflows in flight: their waiting tasks count
        for e in queue.entries():
            t = e[2]
            if t.state == READY and id(t) not in seen:
                seen.add(id(t))
                kind, w = self._work(t)
                queued[kind] += w
                pending.append(t.prim.request.on_nodes())
                wfs.setdefault(id(t.wf), t.wf)
        for servers in nodes.values():
            for s in servers:
                for t in s.running:
                    wfs.setdefault(id(t.wf), t.wf)
        for wf in wfs.values():
            if wf.failed:
                continue
            for c in wf.tasks:  # tasks whose parents have not finished
                if c.state == WAITING:
                    k2, w2 = self._work(c)
                    waiting[k2] += w2
        n = len(self.recent)
        per = {k: sum(r[k] for r in self.recent) / n if n else 0.0 for k in (CPU, GPU)}
        return SizingView(now, views, {}, pending, queued, waiting, running,
                          self.arrivals, per)

    def _ask(self, wanted: dict[str, int]) -> None:
        """``apply: ray``: the nodes wanted, as bundles of their tiers' shapes."""
        bundles = []
        for k, n in wanted.items():
            shape = {r: float(v) for r, v in self.tiers[k].spec().resources.items()
                     if r != "memory" and v > 0}
            bundles += [shape] * max(n, 0)
        request = self._request
        if request is None:
            from ray.autoscaler.sdk import request_resources as request
        request(bundles=bundles)
        self.ctx.counters["sizing_requests"] += 1

    def accepting(self, srv: "LiveServer") -> bool:
        """Whether ``srv`` takes new work (False: its node is being drained, ``apply: ray``)."""
        return srv.node.node_id not in self.draining

    # ------------------------------------------------------------------ what it shows
    def slo_windows(self, now: float) -> tuple[int, float] | None:
        """The windows over by ``now`` and the share that met the SLO, as
        ``envs.accounting.slo_report(records, slo, closed)`` over every workflow admitted (None
        before the first window is over): the workflows done since the last turn are folded
        into their windows and the windows that changed are counted again."""
        slo = self.env.sizing.slo
        bound = slo.p95_s
        still = []
        for rec in self.unsettled:
            if not rec.settled:
                still.append(rec)
                continue
            w = self.windows[rec.k]
            w.open -= 1
            w.add(rec.finish - rec.arrival if rec.done == rec.n else UNFINISHED, bound)
            self.changed.add(rec.k)
        self.unsettled = still
        closed = (now // slo.window_s) * slo.window_s  # windows over
        if closed <= 0:
            return None
        n = max(1, math.ceil(closed / slo.window_s))
        for k in [k for k in self.changed if k < n]:  # the window in progress waits
            self.changed.discard(k)
            w = self.windows[k]
            met = w.meets(bound)
            self.unmet += (not met) - (w.met is False)
            w.met = met
        return n, (n - self.unmet) / n

    def _snapshot(self, now: float, counts: dict[str, int], wanted: dict[str, int],
                  launch: dict[str, int], drain: list[NodeView], why: str,
                  by_id: dict[int, str]) -> dict[str, Any]:
        bill = self.billing.totals(now)
        slo = self.env.sizing.slo
        report = self.slo_windows(now)
        return {"policy": self.env.sizing.policy, "apply": self.apply, "turns": self.turns,
                "t": now, "nodes": counts, "launching": {k: len(v) for k, v in self.asked.items()
                                                          if v},
                "wanted": wanted, "launch": launch,
                "drain": [{"node": by_id[nv.id], "tier": nv.tier} for nv in drain],
                "why": why, "decide_ms": self.decide_ms, "cost": bill["cost"],
                "node_hours": bill["node_hours"],
                "slo": {"p95_s": slo.p95_s, "window_s": slo.window_s, "target": slo.target,
                        "windows": 0 if report is None else report[0],
                        "attainment": None if report is None else report[1]},
                "budget_per_hour": self.env.sizing.budget_per_hour}

    def snapshot(self) -> dict[str, Any]:
        """The last turn's plan, cost and attainment (any thread: a dict replaced whole)."""
        return self._snap
