"""Exact, fast EFT rollouts of the present work for the lookahead planner (issue 26).

The planner (``policies.lookahead``) scores each candidate server by forking the simulator
(``envs.fork``), placing the task there and stepping the fork with the fast EFT until the
rollout's horizon; each rollout step walks every server (EFT's scan and the decision core's
``max_idle_memory``) and every fork copies every unfinished task. :class:`Rollouts` gives the
same costs, to the last bit, for much less:

* the present state is read once per decision (:class:`Rollouts`) into flat lists indexed
  by task (pending parents, slot, the first parent's transfer), shared by the candidates; a
  candidate's rollout copies those lists (C speed) and resets each task's state on its
  ``RolloutTask`` instead of copying the simulator's task objects;
* the servers are grouped into *classes* that look the same to EFT and to the rules (accepting,
  same decoded compute and memory, same raw memory; :class:`ServerClasses`), with one bit set
  per idle slot. Among identical idle servers EFT picks the lowest slot (its scores tie), so it
  looks at the lowest idle slot of each class, plus the slot of the task's parent (no transfer),
  and ``max_idle_memory`` is the memory of the largest class with an idle slot;
* the rollout runs the simulator's rules on those lists, each written once: the round (the
  ready queue's order, forced waits and deferrals, head-of-line blocking, validity) is the
  decision core's own (``envs.decision.DecisionCore`` and ``ReadyQueue`` over ``RolloutTask``
  objects and :class:`RolloutServers`); EFT is ``heuristics.eft_scan`` (over each class's lowest
  idle slot when no busy slot can finish first, else over every slot); the finish events are
  an ``envs.events.EventQueue``; the clock, the wait step, transfer delays at the start, the
  first finished parent as the transfer source, truncation and the planner's reservations
  mirror ``envs.simulator`` and ``policies.lookahead``.

It covers the rollouts whose server set cannot change: :func:`supported` is False (the planner
then forks as before) for ``future`` other than ``none``, dynamic orders (``srpt``, ``las``:
keys move as work finishes), pending server events (joins, leaves, failures), stale finish
events, a busy server that is not accepting (draining: it leaves when its task ends), a
simulator with a run-time model (``_rt``: runs that take other than their estimate, hedged
copies), and a server table that checks demands beyond memory (``caps``).
tests/test_lookahead_fast.py checks, on random states of twelve settings, that every
candidate's cost equals the forked rollout's exactly and that whole episodes decide the same.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from operator import attrgetter

import numpy as np

from envs.decision import DONE, HOL_WAIT, READY, RUNNING, WAITING, DecisionCore, ReadyQueue
from envs.objective import completion_cost
from envs.events import ARRIVAL, FINISH, EventQueue
from envs.simulator import Simulator

from .heuristics import (F32, EftServerView, decoded_remaining, eft_scan, never_busy, sees_busy,
                         soonest_free)
from .rollout_core import RolloutServers, TaskViews

_FIELDS = attrgetter("id", "key", "compute", "memory_gb", "output", "state", "pending", "slot",
                     "sid", "first_parent", "wf")


def _decode(x: np.ndarray, clip: float, unit: float) -> list[float]:
    """``float(float32(min(x, clip))) * unit`` of each value (as EarliestFinish decodes)."""
    return (np.minimum(x, clip).astype(np.float32).astype(np.float64) * unit).tolist()


def _decode_transfer(outputs, bw: float, lat: float, f) -> list[float]:
    """The decoded transfer time of a first parent with each output (heuristics.task_view)."""
    x = (np.array(outputs, dtype=float) / bw + lat) / f.transfer_s
    out = np.minimum(x, f.clip).astype(np.float32).astype(np.float64) * f.transfer_s
    out[x == 0] = 0.0
    return out.tolist()


class ServerClasses:
    """Accepting slots grouped by (decoded compute, decoded memory, raw memory), largest raw
    memory first; rebuilt when the server set (capacities, accepting) changes."""

    def __init__(self) -> None:
        self.key: tuple | None = None

    def get(self, sim: Simulator, dec: EftServerView) -> "ServerClasses":
        c, m, a = sim.servers.compute_l, sim.servers.memory_l, sim.servers.accept_l
        k = self.key
        if k is None or k[0] != c or k[1] != m or k[2] != a:
            groups: dict[tuple, list[int]] = {}
            for s in range(sim.n_slots):
                if a[s]:
                    groups.setdefault((dec.cdec[s], dec.mdec[s], m[s]), []).append(s)
            keys = sorted(groups, key=lambda g: -g[2])
            self.cdec = [g[0] for g in keys]
            self.mdec = [g[1] for g in keys]
            self.mraw = [g[2] for g in keys]
            self.mask = [sum(1 << s for s in groups[g]) for g in keys]
            self.cls = [-1] * sim.n_slots
            for i, g in enumerate(keys):
                for s in groups[g]:
                    self.cls[s] = i
            self.key = (list(c), list(m), list(a))
        return self


def supported(sim: Simulator, future: str) -> bool:
    """Whether :class:`Rollouts` reproduces this simulator's rollouts (module docstring)."""
    if (future != "none" or sim.dynamic_order or sim.run_model is not None
            or sim.stragglers or getattr(sim.servers, "caps", None) is not None):
        return False  # _rt: a run-time model (runs take other than their estimate, hedging);
        # caps: demands beyond memory (the live scheduler's table)
    busy, acc = sim.servers.busy_l, sim.servers.accept_l
    if not sim.events.kinds() <= {FINISH, ARRIVAL}:
        return False  # server events pending, or hedges
    for _, _, slot, tok, task in sim.events.runs():
        if task.token != tok or task.state != RUNNING or not acc[slot]:
            return False
    return not any(b and not a for b, a in zip(busy, acc))


class Rollouts:
    """The present of ``sim`` (at a decision) as flat lists; :meth:`cost` rolls one candidate
    out. ``reserved``: the planner's reservations, task id -> (slot, server id); ``views``: the
    planner's :class:`TaskViews`."""

    def __init__(self, sim: Simulator, dec: EftServerView, classes: ServerClasses,
                 reserved: dict, objective: str, views: TaskViews | None = None) -> None:
        self.sim, self.dec, self.cl, self.objective = sim, dec, classes, objective
        f = sim.cfg.features
        lo = sim.unfinished_range()
        tasks = [tk for tk in sim.tasks[lo:] if tk.state != DONE]
        self.ok = len(tasks) == sim.outstanding
        sub = sim.submission
        if sub.hidden:  # program / per_call: only the calls that exist (envs.programs)
            tasks = [tk for tk in tasks if tk.state != WAITING or tk.pending == 0]
        self.outstanding0 = len(tasks)
        loc = {tk.id: i for i, tk in enumerate(tasks)}
        cols = list(zip(*map(_FIELDS, tasks))) if tasks else [()] * 11
        (tid, key, compute, mem, output, self.st0, self.pend0, self.slot0, self.sid0,
         fps, wfs) = cols
        self.tid, self.key, self.compute, self.mem = tid, key, compute, mem
        self.tasks = (views or TaskViews()).get(tid, key, mem)
        # per_call: each call its own workflow to the objective, as to the order
        self.wf = list(tid) if sub.per_call else [w.id for w in wfs]
        self.children = [[loc.get(c.id, -1) for c in tk.children] for tk in tasks]
        if sub.hidden:  # a call not yet shown: not in the rollouts
            self.children = [[c for c in cs if c >= 0] for cs in self.children]
        self.ok = self.ok and all(c >= 0 for cs in self.children for c in cs)
        bw, lat = sim.bandwidth_gb_s, sim.latency_s
        self._present, self._loc = tasks, loc
        self._parents: list[list | None] = [None] * len(tasks)  # parents_of, filled when asked
        # EFT's view of each task (heuristics.task_view), decoded as from the float32 features
        cu, mu = f.compute_unit, f.memory_gb
        self.tc = _decode(np.array(compute, dtype=float) / cu, f.clip, cu)
        self.tm = _decode(np.array(mem, dtype=float) / mu, f.clip, mu)
        self.trp = _decode_transfer(output, bw, lat, f)  # from each task as the first parent
        has = [fp is not None for fp in fps]
        self.hasfp0 = has
        with_fp = [fp for fp in fps if fp is not None]
        tr_fp = iter(_decode_transfer([fp.output for fp in with_fp], bw, lat, f))
        slot_of = sim.slot_by_server_id
        ps_fp = iter([slot_of.get(fp.sid, -1) for fp in with_fp])
        self.tr0 = [next(tr_fp) if h else 0.0 for h in has]
        self.ps0 = [next(ps_fp) if h else -1 for h in has]
        self._read_queues(sim, loc)
        self._read_servers(sim, classes, reserved, loc)

    def parents_of(self, i: int) -> list[tuple[int, int, float]]:
        """Task ``i``'s parents as (local index or -1 when finished before now, its server id,
        transfer s), read when a rollout first starts it (only transfer delays need them)."""
        got = self._parents[i]
        if got is None:
            sim, loc = self.sim, self._loc
            bw, lat = sim.bandwidth_gb_s, sim.latency_s
            got = self._parents[i] = [(loc.get(p.id, -1), p.sid, p.output / bw + lat)
                                      for p in self._present[i].parents]
        return got

    def _read_queues(self, sim: Simulator, loc: dict[int, int]) -> None:
        """The finish events and the ready queue (heap, deferred list) by local task index."""
        ev = []
        hidden = sim.finish_hidden
        for t, seq, slot, _, task in sim.events.runs():
            # with an unseen overhead, a run ends when expected (as forks)
            ev.append((sim.expected_end(slot) if hidden else t, FINISH, seq, slot, loc[task.id]))
        heapify(ev)
        self.events0 = ev

        local = self.tasks

        def entries(lst):
            return [(k, i, local[loc[t.id]]) for k, i, t in lst
                    if t.state == READY and (k is t.key or k == t.key)]

        q = sim.core.queue
        self.heap0 = entries(q.heap)
        heapify(self.heap0)
        self.deferred0 = entries(q.deferred)
        self.deferred_heap0 = q.deferred_is_heap
        if self.deferred_heap0:
            heapify(self.deferred0)
        cur = loc[sim.current.id]
        self.cur = cur
        self.ok = self.ok and bool(self.heap0) and self.heap0[0][2].i == cur

    def _read_servers(self, sim: Simulator, cl: ServerClasses, reserved: dict,
                      loc: dict[int, int]) -> None:
        """Idle slots per class (bit sets), busy flags and ends, and the reservations (local
        task -> (slot, still usable for it, its server is the same))."""
        idle = [0] * len(cl.mask)
        for s, b in enumerate(sim.servers.busy_l):
            k = cl.cls[s]
            if k >= 0 and not b:
                idle[k] |= 1 << s
        self.idle0 = idle
        self.busy0 = list(sim.servers.busy_l)
        self.bu0 = sim.busy_until.tolist()
        self.res0 = {}
        for t_id, (slot, sid) in reserved.items():
            i = loc.get(t_id)
            if i is not None:
                self.res0[i] = self._reservation(i, slot, sid)

    def _reservation(self, i: int, slot: int, sid: int) -> tuple[int, bool, bool]:
        sim = self.sim
        srv = sim.servers
        same = sim.server_ids[slot] == sid
        return slot, same and srv.accept_l[slot] and srv.memory_l[slot] >= self.mem[i], same

    def cost(self, first: int, t_end: float, reserve: bool = True) -> float:
        """The cost (``envs.objective.completion_cost``) of placing the current task on slot
        ``first`` (a busy one: it waits, reserved unless ``reserve`` is False) and rolling EFT
        out until ``t_end``: the planner's forked rollout, exactly."""
        run = _Rollout(self, first, reserve)
        step, place = run.step, run.place
        cur = step(self.cur, first)
        while cur >= 0 and run.t < t_end:
            cur = step(cur, place(cur))
        return run.cost(t_end)


class _Rollout:
    """One candidate's rollout (:meth:`Rollouts.cost`): copies of the present's lists, changed
    by the simulator's rules. The round's rules are the decision core's own
    (``envs.decision.DecisionCore`` over this rollout's ``RolloutTask`` objects and
    :class:`RolloutServers`); the clock, the finish events and the starts are the simulator's, on
    flat lists, each method named after the simulator's method it mirrors. Hot methods read
    what they use into locals and write the scalars back (``t``, ``outstanding``...)."""

    __slots__ = ("r", "sim", "n", "acc", "mem_l", "comp_l", "sid_l", "tu", "clip32", "inv_tu",
                 "hol", "mask_inf", "tds", "wait_dt", "next_event", "t_cap", "max_dec", "cmr",
                 "cdec", "mdec", "cls", "rk", "tasks", "pend", "tslot", "tsid", "tr_l", "ps_l",
                 "hasfp", "fin", "idle", "busy", "bu", "event_q", "events", "core", "queue", "t",
                 "outstanding", "res")

    def __init__(self, r: Rollouts, first: int, reserve: bool) -> None:
        sim, cl = r.sim, r.cl
        self.r, self.sim = r, sim
        self.n = sim.n_slots
        srv, rules = sim.servers, sim.core.rules
        self.acc, self.mem_l, self.comp_l = srv.accept_l, srv.memory_l, srv.compute_l
        self.sid_l = sim.server_ids
        f = sim.cfg.features
        self.tu, self.clip32 = f.time_unit, float(F32(f.clip))
        self.inv_tu = F32(1.0 / f.time_unit)
        self.hol = rules.head_of_line_blocking
        self.mask_inf, self.tds = rules.mask_infeasible, sim.transfer_delays
        self.wait_dt, self.next_event = sim.cfg.mdp.wait_dt_s, sim.cfg.mdp.advance_to_next_event
        self.t_cap, self.max_dec = sim.time_cap, sim.max_decisions
        self.cmr, self.cls = cl.mraw, cl.cls
        self.cdec, self.mdec = r.dec.cdec, r.dec.mdec  # EFT's decoded server view
        self.rk = range(len(cl.mraw))
        self.tasks = tasks = r.tasks
        for tk, x in zip(tasks, r.st0):
            tk.state = x
        self.pend = list(r.pend0)
        self.tslot, self.tsid = list(r.slot0), list(r.sid0)
        self.tr_l, self.ps_l, self.hasfp = r.tr0.copy(), r.ps0.copy(), r.hasfp0.copy()
        self.fin = [0.0] * len(r.st0)
        self.idle, self.busy, self.bu = r.idle0.copy(), r.busy0.copy(), r.bu0.copy()
        self.event_q = q = EventQueue()  # its finish events (the layout of envs.events)
        q.heap, q.seq = r.events0.copy(), sim.events.seq
        self.events = q.heap  # read (and popped) here, pushed by EventQueue.push
        servers = RolloutServers()
        servers.n, servers.accept_l, servers.busy_l = self.n, self.acc, self.busy
        servers.memory_l, servers.max_accept_mem = self.mem_l, srv.max_accept_mem
        servers.idle, servers.cmr, servers.rk = self.idle, self.cmr, self.rk
        self.core = core = DecisionCore(servers, rules)
        core.queue = self.queue = ReadyQueue(r.heap0.copy(), r.deferred0.copy(),
                                             r.deferred_heap0)
        core.decisions = sim.decisions
        self.t = sim.t
        self.outstanding = r.outstanding0
        self.res = dict(r.res0)
        if self.busy[first] and reserve:
            self.res[r.cur] = r._reservation(r.cur, first, self.sid_l[first])

    def advance_to(self, target: float) -> None:  # Simulator._advance_to
        events = self.events
        if events and events[0][0] <= target:
            self.finish_until(target)
        if target > self.t:
            self.t = target
        queue = self.queue
        if queue.deferred:
            queue.requeue_deferred()

    def finish_until(self, target: float) -> None:
        """The runs that end by ``target`` finish; children whose last parent it was are ready."""
        events, tasks, fin, busy, idle, cls = (self.events, self.tasks, self.fin, self.busy,
                                               self.idle, self.cls)
        r = self.r
        children, hasfp, tr_l, trp, ps_l, pend = (r.children, self.hasfp, self.tr_l, r.trp,
                                                  self.ps_l, self.pend)
        key, tid, heap = r.key, r.tid, self.queue.heap
        t, outstanding = self.t, self.outstanding
        while events and events[0][0] <= target:
            te, _, _, s, i = heappop(events)
            if te > t:
                t = te
            tasks[i].state = DONE
            fin[i] = t
            busy[s] = False
            idle[cls[s]] |= 1 << s
            outstanding -= 1
            for c in children[i]:
                if not hasfp[c]:
                    hasfp[c] = True
                    tr_l[c] = trp[i]
                    ps_l[c] = s
                pend[c] -= 1
                if pend[c] == 0:
                    tc = tasks[c]
                    tc.state = READY
                    heappush(heap, (key[c], tid[c], tc))
        self.t, self.outstanding = t, outstanding

    def wait(self) -> None:  # Simulator._wait
        if self.next_event and self.events:
            self.advance_to(self.events[0][0])
        else:
            self.advance_to(self.t + self.wait_dt)

    def select(self) -> int:  # Simulator._select: the core's next task, the clock moved
        next_task, queue = self.core.next_task, self.queue
        while True:
            task, why = next_task()
            if task is not None:
                return task.i
            if why == HOL_WAIT:
                self.wait()
                if self.t > self.t_cap:
                    return -1
                continue
            if self.outstanding == 0:
                return -1
            if queue.deferred:
                self.wait()
            elif self.events:
                self.advance_to(self.events[0][0])
            else:
                return -1
            if self.t > self.t_cap:
                return -1

    def step(self, i: int, s: int) -> int:  # Simulator.step: the core resolves the pick
        core = self.core
        if core.resolve(self.tasks[i], s):  # Simulator._start
            r, busy = self.r, self.busy
            sid = self.sid_l[s]
            delay = 0.0
            if self.tds:  # max(..., default=0.0) over the parents on another server
                tsid = self.tsid
                for p, psid, d in r.parents_of(i):
                    if d > delay and (tsid[p] if p >= 0 else psid) != sid:
                        delay = d
            self.tasks[i].state = RUNNING
            self.tslot[i] = s
            self.tsid[i] = sid
            busy[s] = True
            self.idle[self.cls[s]] ^= 1 << s
            until = self.bu[s] = self.t + delay + r.compute[i] / self.comp_l[s]
            self.event_q.push(until, FINISH, s, i)
        elif self.hol:
            self.wait()
        nxt = self.select()
        if nxt >= 0 and (core.decisions >= self.max_dec or self.t > self.t_cap):
            return -1
        return nxt

    def place(self, cur: int) -> int:  # lookahead: the reservation, else EFT without others'
        res = self.res
        s = -1
        if res:  # lookahead._reserved_slot
            r = res.get(cur)
            if r is not None:
                if r[1]:
                    s = r[0]
                    if not self.busy[s]:  # it starts there: the reservation ends
                        del res[cur]
                else:
                    del res[cur]
        if s < 0:
            excl = ()
            if res:  # lookahead._exclusions
                excl = set()
                tasks = self.tasks
                for j, r in list(res.items()):
                    if tasks[j].state != READY or not r[2]:
                        del res[j]
                    elif j != cur:
                        excl.add(r[0])
            s = self.eft(cur, excl)
            if s < 0:
                s = self.eft(cur, ())
        return s

    def remaining(self, s: int) -> float:  # heuristics.remaining_s
        return decoded_remaining(self.bu[s] - self.t, self.inv_tu, self.tu, self.clip32)

    def eft(self, i: int, excl) -> int:  # heuristics.eft_act on the rollout's lists; -1: again
        # without exclusions (every fitting server is reserved for another task)
        r = self.r
        ps = self.ps_l[i]
        view = (r.tc[i], r.tm[i], r.mem[i] if self.mask_inf else -1.0, self.tr_l[i], ps)
        acc, mem_l, busy, cdec, mdec, tds = (self.acc, self.mem_l, self.busy, self.cdec,
                                             self.mdec, self.tds)
        events, t = self.events, self.t
        if not events or events[0][0] - t > 1e-7:  # every busy server is certainly busy
            idl, _ = eft_scan(self.idle_slots(ps, excl), acc, mem_l, busy, cdec, mdec, view, tds,
                              (), never_busy, fallback=False)
            if idl:
                return min(idl)[1]
        # eft_ranking's full scan
        bu, inv_tu, tu, clip32 = self.bu, self.inv_tu, self.tu, self.clip32
        idl, busy_fit = eft_scan(range(self.n), acc, mem_l, busy, cdec, mdec, view, tds, excl,
                                 lambda s: sees_busy(bu[s] - t, inv_tu, tu, clip32))
        if idl:
            return min(idl)[1]
        if not busy_fit:
            return -1 if excl else 0
        return soonest_free(busy_fit, self.remaining)

    def idle_slots(self, ps: int, excl) -> list[int]:
        """The idle slots EFT can pick when no busy one can finish first: each server class's
        lowest idle slot that is not excluded (identical servers tie, and EFT's ties go to the
        lowest slot), plus the task's parent's slot when it is idle (no transfer there)."""
        idle = self.idle
        xb = 0
        for s in excl:
            xb |= 1 << s
        slots = []
        for k in self.rk:
            b = idle[k] & ~xb if xb else idle[k]
            if not b:
                continue
            if ps >= 0 and b >> ps & 1:
                slots.append(ps)
                b ^= 1 << ps
                if not b:
                    continue
            slots.append((b & -b).bit_length() - 1)
        return slots

    def cost(self, t_end: float) -> float:
        """The objective's cost of the rolled-out timeline: finished tasks at their finish, running
        ones at their server's end, the rest at ``max(t, t_end)`` plus a mean-speed run."""
        now = max(self.t, t_end)
        r = self.r
        mc, fin, bu, tslot, compute = (self.sim.mean_compute, self.fin, self.bu, self.tslot,
                                       r.compute)
        comps = [fin[i] if x == DONE else bu[tslot[i]] if x == RUNNING else now + compute[i] / mc
                 for i, x in enumerate(tk.state for tk in self.tasks)]
        return completion_cost(r.objective, zip(r.wf, comps))
