"""Exact, fast EFT rollouts of the present work for the lookahead planner (issue 26).

The planner (``policies.lookahead``) scores each candidate server by forking the simulator
(``envs.fork``), placing the task there and stepping the fork with the fast EFT until the
rollout's horizon; each rollout step walks every server (EFT's scan and the decision core's
``max_idle_memory``) and every fork copies every unfinished task. :class:`Rollouts` gives the
same costs, to the last bit, for much less:

* the present state is read once per decision (:class:`Rollouts`) into flat lists indexed
  by task (state, pending parents, slot, the first parent's transfer), shared by the candidates;
  a candidate's rollout copies those lists (C speed) instead of the task objects;
* the servers are grouped into *classes* that look the same to EFT and to the rules (accepting,
  same decoded compute and memory, same raw memory; :class:`ServerClasses`), with one bit set
  per idle slot. Among identical idle servers EFT picks the lowest slot (its scores tie), so it
  looks at the lowest idle slot of each class, plus the slot of the task's parent (no transfer),
  and ``max_idle_memory`` is the memory of the largest class with an idle slot;
* the rollout runs the simulator's own rules (``envs.simulator``, ``envs.decision``) on those
  lists: the ready queue's order (the key, then the task id), forced waits and deferrals
  (``ask_only_startable``), head-of-line blocking, the wait step, transfer delays at the start,
  the first finished parent as the transfer source, truncation, and the planner's reservations.

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

from envs.decision import DONE, READY, RUNNING
from envs.objective import completion_cost
from envs.events import ARRIVAL, FINISH
from envs.simulator import Simulator

from .heuristics import (F32, MEM_TOL, EftServerView, decoded_remaining, eft_scan, sees_busy,
                         soonest_free)

_TOL = 1 + MEM_TOL
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
    out. ``reserved``: the planner's reservations, task id -> (slot, server id)."""

    def __init__(self, sim: Simulator, dec: EftServerView, classes: ServerClasses,
                 reserved: dict, objective: str) -> None:
        self.sim, self.dec, self.cl, self.objective = sim, dec, classes, objective
        f = sim.cfg.features
        lo = sim.unfinished_range()
        tasks = [tk for tk in sim.tasks[lo:] if tk.state != DONE]
        self.ok = len(tasks) == sim.outstanding
        loc = {tk.id: i for i, tk in enumerate(tasks)}
        cols = list(zip(*map(_FIELDS, tasks))) if tasks else [()] * 11
        (tid, key, compute, mem, output, self.st0, self.pend0, self.slot0, self.sid0,
         fps, wfs) = cols
        self.tid, self.key, self.compute, self.mem = tid, key, compute, mem
        self.wf = [w.id for w in wfs]
        self.children = [[loc.get(c.id, -1) for c in tk.children] for tk in tasks]
        self.ok = self.ok and all(c >= 0 for cs in self.children for c in cs)
        bw, lat = sim.bandwidth_gb_s, sim.latency_s
        # parents: (local index or -1 when finished before now, its server id, transfer s)
        self.parents = [[(loc.get(p.id, -1), p.sid, p.output / bw + lat) for p in tk.parents]
                        for tk in tasks]
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

    def _read_queues(self, sim: Simulator, loc: dict[int, int]) -> None:
        """The finish events and the ready queue (heap, deferred list) by local task index."""
        ev = []
        hidden = sim.finish_hidden
        for t, seq, slot, _, task in sim.events.runs():
            # with an unseen overhead, a run ends when expected (as forks)
            ev.append((sim.expected_end(slot) if hidden else t, seq, slot, loc[task.id]))
        heapify(ev)
        self.events0 = ev

        def entries(lst):
            return [(k, i, loc[t.id]) for k, i, t in lst
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
        self.ok = self.ok and bool(self.heap0) and self.heap0[0][2] == cur

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
    by the simulator's rules, each method named after the rule it runs. Hot methods read what
    they use into locals and write the scalars back (``t``, ``heap``...): a method that rebinds
    a list stores it on ``self`` before anything else reads it."""

    __slots__ = ("r", "sim", "n", "acc", "mem_l", "comp_l", "sid_l", "tu", "clip32", "inv_tu",
                 "hol", "only_startable", "mask_inf", "tds", "wait_dt", "next_event", "t_cap",
                 "max_dec", "max_accept", "ccd", "cmd", "cmr", "cls", "rk", "st", "pend", "tslot",
                 "tsid", "tr_l", "ps_l", "hasfp", "fin", "idle", "busy", "bu", "events", "heap",
                 "deferred", "dheap", "t", "seq", "decisions", "outstanding", "res")

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
        self.hol, self.only_startable = rules.head_of_line_blocking, rules.ask_only_startable
        self.mask_inf, self.tds = rules.mask_infeasible, sim.transfer_delays
        self.wait_dt, self.next_event = sim.cfg.mdp.wait_dt_s, sim.cfg.mdp.advance_to_next_event
        self.t_cap, self.max_dec = sim.time_cap, sim.max_decisions
        self.max_accept = srv.max_accept_mem
        self.ccd, self.cmd, self.cmr, self.cls = cl.cdec, cl.mdec, cl.mraw, cl.cls
        self.rk = range(len(cl.cdec))
        self.st, self.pend = list(r.st0), list(r.pend0)
        self.tslot, self.tsid = list(r.slot0), list(r.sid0)
        self.tr_l, self.ps_l, self.hasfp = r.tr0.copy(), r.ps0.copy(), r.hasfp0.copy()
        self.fin = [0.0] * len(r.st0)
        self.idle, self.busy, self.bu = r.idle0.copy(), r.busy0.copy(), r.bu0.copy()
        self.events = r.events0.copy()
        self.heap, self.deferred, self.dheap = r.heap0.copy(), r.deferred0.copy(), \
            r.deferred_heap0
        self.t, self.seq = sim.t, sim.events.seq
        self.decisions, self.outstanding = sim.decisions, sim.outstanding
        self.res = dict(r.res0)
        if self.busy[first] and reserve:
            self.res[r.cur] = r._reservation(r.cur, first, self.sid_l[first])

    def advance_to(self, target: float) -> None:  # Simulator: events up to target
        events = self.events
        if events and events[0][0] <= target:
            self.finish_until(target)
        if target > self.t:
            self.t = target
        deferred = self.deferred
        if deferred:  # ReadyQueue.requeue_deferred
            heap = self.heap
            if self.dheap and len(deferred) > len(heap):
                for e in heap:
                    heappush(deferred, e)
                self.heap = deferred
            else:
                for e in deferred:
                    heappush(heap, e)
            self.deferred, self.dheap = [], False

    def finish_until(self, target: float) -> None:
        """The runs that end by ``target`` finish; children whose last parent it was are ready."""
        events, st, fin, busy, idle, cls = (self.events, self.st, self.fin, self.busy,
                                            self.idle, self.cls)
        r = self.r
        children, hasfp, tr_l, trp, ps_l, pend = (r.children, self.hasfp, self.tr_l, r.trp,
                                                  self.ps_l, self.pend)
        key, tid, heap = r.key, r.tid, self.heap
        t, outstanding = self.t, self.outstanding
        while events and events[0][0] <= target:
            te, _, s, i = heappop(events)
            if te > t:
                t = te
            st[i] = DONE
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
                    st[c] = READY
                    heappush(heap, (key[c], tid[c], c))
        self.t, self.outstanding = t, outstanding

    def wait(self) -> None:
        if self.next_event and self.events:
            self.advance_to(self.events[0][0])
        else:
            self.advance_to(self.t + self.wait_dt)

    def next_task(self) -> int:  # DecisionCore.next_task: a task, -1 (none) or -2 (HOL wait)
        heap, st, mem, idle = self.heap, self.st, self.r.mem, self.idle
        idle_mem = None
        while heap:
            i = heap[0][2]
            if st[i] != READY:
                heappop(heap)
                continue
            m = mem[i]
            if m > self.max_accept:  # blocked: no server set change can bring it back here
                heappop(heap)
                continue
            if self.only_startable:
                if idle_mem is None:
                    idle_mem = -1.0
                    for k in self.rk:
                        if idle[k]:
                            idle_mem = self.cmr[k]
                            break
                if m > idle_mem:
                    if self.hol:
                        return -2
                    if idle_mem < 0.0:  # ReadyQueue.defer_all
                        for e in self.deferred:
                            heappush(heap, e)
                        self.deferred, self.heap, self.dheap = heap, [], True
                        return -1
                    self.deferred.append(heappop(heap))
                    self.dheap = False
                    continue
            return i
        return -1

    def select(self) -> int:  # Simulator._select
        while True:
            i = self.next_task()
            if i >= 0:
                return i
            if i == -2:
                self.wait()
                if self.t > self.t_cap:
                    return -1
                continue
            if self.outstanding == 0:
                return -1
            if self.deferred:
                self.wait()
            elif self.events:
                self.advance_to(self.events[0][0])
            else:
                return -1
            if self.t > self.t_cap:
                return -1

    def step(self, i: int, s: int) -> int:  # Simulator.step
        self.decisions += 1
        r, busy = self.r, self.busy
        if self.acc[s] and not busy[s] and self.mem_l[s] >= r.mem[i]:
            heappop(self.heap)
            sid = self.sid_l[s]
            delay = 0.0
            if self.tds:  # max(..., default=0.0) over the parents on another server
                tsid = self.tsid
                for p, psid, d in r.parents[i]:
                    if d > delay and (tsid[p] if p >= 0 else psid) != sid:
                        delay = d
            self.st[i] = RUNNING
            self.tslot[i] = s
            self.tsid[i] = sid
            busy[s] = True
            self.idle[self.cls[s]] ^= 1 << s
            until = self.bu[s] = self.t + delay + r.compute[i] / self.comp_l[s]
            self.seq = seq = self.seq + 1
            heappush(self.events, (until, seq, s, i))
        elif not self.hol:
            self.deferred.append(heappop(self.heap))
            self.dheap = False
        else:
            self.wait()
        nxt = self.select()
        if nxt >= 0 and (self.decisions >= self.max_dec or self.t > self.t_cap):
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
                st = self.st
                for j, r in list(res.items()):
                    if st[j] != READY or not r[2]:
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
        tc, tm, tr, ps = r.tc[i], r.tm[i], self.tr_l[i], self.ps_l[i]
        tmem = r.mem[i] if self.mask_inf else -1.0
        events, t = self.events, self.t
        if not events or events[0][0] - t > 1e-7:  # every busy server is certainly busy
            s = self.eft_idle_class(tc, tm, tr, ps, tmem, excl)
            if s >= 0:
                return s
        # eft_ranking's full scan: the one rule (heuristics.eft_scan) on the rollout's lists
        bu, inv_tu, tu, clip32 = self.bu, self.inv_tu, self.tu, self.clip32
        dec = r.dec
        idl, busy_fit = eft_scan(range(self.n), self.acc, self.mem_l, self.busy, dec.cdec,
                                 dec.mdec, (tc, tm, tmem, tr, ps), self.tds, excl,
                                 lambda s: sees_busy(bu[s] - t, inv_tu, tu, clip32))
        if idl:
            return min(idl)[1]
        if not busy_fit:
            return -1 if excl else 0
        return soonest_free(busy_fit, self.remaining)

    def eft_idle_class(self, tc: float, tm: float, tr: float, ps: int, tmem: float,
                       excl) -> int:
        """EFT over the idle slots when no busy one can finish first: per server class its
        lowest idle slot, and the task's parent's slot (no transfer); -1 when none fits."""
        idle, cmr, cmd, ccd, tds = self.idle, self.cmr, self.cmd, self.ccd, self.tds
        best = None
        xb = 0
        for s in excl:
            xb |= 1 << s
        for k in self.rk:
            b = idle[k]
            if not b or cmr[k] < tmem:
                continue
            m = cmd[k]
            if m * _TOL < tm:
                continue
            if xb:
                b &= ~xb
                if not b:
                    continue
            if ps >= 0 and b >> ps & 1:  # the parent's server: no transfer
                run = tc / ccd[k]
                if tds:
                    run = run + 0.0
                c = (run + (1e-6 * 0.0 + 1e-9 * m), ps)
                if best is None or c < best:
                    best = c
                b ^= 1 << ps
                if not b:
                    continue
            s = (b & -b).bit_length() - 1
            run = tc / ccd[k]
            if tds:
                run = run + tr
            c = (run + (1e-6 * tr + 1e-9 * m), s)
            if best is None or c < best:
                best = c
        return -1 if best is None else best[1]

    def cost(self, t_end: float) -> float:
        """The objective's cost of the rolled-out timeline: finished tasks at their finish, running
        ones at their server's end, the rest at ``max(t, t_end)`` plus a mean-speed run."""
        now = max(self.t, t_end)
        r = self.r
        mc, fin, bu, tslot, compute = (self.sim.mean_compute, self.fin, self.bu, self.tslot,
                                       r.compute)
        comps = [fin[i] if x == DONE else bu[tslot[i]] if x == RUNNING else now + compute[i] / mc
                 for i, x in enumerate(self.st)]
        return completion_cost(r.objective, zip(r.wf, comps))
