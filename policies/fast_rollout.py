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
  same speed and memory; :class:`ServerClasses`), with one bit set per idle slot. Among
  identical idle servers EFT picks the lowest slot (its keys tie), so it looks at the lowest
  idle slot of each class, plus the slot of the task's parent (no transfer), and whether a task
  fits an idle server now is read from the largest class with an idle slot;
* the rollout runs the simulator's rules on those lists, each written once: the round (the
  ready queue's order, forced waits and deferrals, head-of-line blocking, validity) is the
  decision core's own (``envs.decision.DecisionCore`` and ``ReadyQueue`` over ``RolloutTask``
  objects and :class:`RolloutServers`); EFT is ``heuristics.finish_key`` over each class's
  lowest idle slot (and the parent's), else the soonest free slot; the finish events are an
  ``envs.events.EventQueue``; the clock, the wait step, transfer delays at the start, the first
  finished parent as the transfer source, truncation and the planner's reservations mirror
  ``envs.simulator`` and ``policies.lookahead``.

It covers the rollouts on servers of one slot whose server set cannot change: :func:`supported`
is False (the planner then forks as before) on Ray nodes or for a task demanding more than a
slot and memory, for ``future`` other than ``none``, dynamic orders (``srpt``, ``las``: keys move
as work finishes), pending server events (joins, leaves, failures), stale finish events, a busy
server that is not accepting (draining: it leaves when its task ends), and a simulator with a
run-time model (``_rt``: runs that take other than their estimate, hedged copies).
tests/test_lookahead_fast.py checks, on random states of twelve settings, that every
candidate's cost equals the forked rollout's exactly and that whole episodes decide the same.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from operator import attrgetter

from envs.decision import DONE, HOL_WAIT, READY, RUNNING, WAITING, DecisionCore, ReadyQueue
from envs.demands import MEMORY, SLOT
from envs.objective import completion_cost
from envs.events import ARRIVAL, FINISH, EventQueue
from envs.simulator import Simulator

from .rollout_core import RolloutServers, TaskViews

_FIELDS = attrgetter("id", "key", "compute", "memory_gb", "output", "state", "pending", "slot",
                     "sid", "first_parent", "wf")


class ServerClasses:
    """Accepting slots grouped by (speed, memory), largest memory first; rebuilt when the node
    set (or accepting) changes."""

    def __init__(self) -> None:
        self.key: tuple | None = None

    def get(self, sim: Simulator) -> "ServerClasses":
        table = sim.table
        if self.key != (id(table), table.version):
            c, m, a = table.cpu_speed, table.memory_l, table.accept_l
            groups: dict[tuple, list[int]] = {}
            for s in range(sim.n_slots):
                if a[s]:
                    groups.setdefault((c[s], m[s]), []).append(s)
            keys = sorted(groups, key=lambda g: -g[1])
            self.speed = [g[0] for g in keys]
            self.mraw = [g[1] for g in keys]
            self.mask = [sum(1 << s for s in groups[g]) for g in keys]
            self.cls = [-1] * sim.n_slots
            for i, g in enumerate(keys):
                for s in groups[g]:
                    self.cls[s] = i
            self.key = (id(table), table.version)
        return self


def supported(sim: Simulator, future: str) -> bool:
    """Whether :class:`Rollouts` reproduces this simulator's rollouts (module docstring)."""
    if (future != "none" or sim.dynamic_order or sim.run_model is not None
            or sim.stragglers):
        return False  # _rt: a run-time model (runs take other than their estimate, hedging)
    table = sim.table
    if not table.has_slots or any(table.specs[i] is not None and SLOT not in
                                    table.specs[i].resources for i in range(table.n)):
        return False  # Ray nodes: the rollouts model servers of one slot
    if not sim.events.kinds() <= {FINISH, ARRIVAL}:
        return False  # server events pending, or hedges
    acc = table.accept_l
    for _, _, slot, tok, task in sim.events.runs():
        if task.token != tok or task.state != RUNNING or not acc[slot]:
            return False
    return not any(r and not a for r, a in zip(table.running, acc))


class Rollouts:
    """The present of ``sim`` (at a decision) as flat lists; :meth:`cost` rolls one candidate
    out. ``reserved``: the planner's reservations, task id -> (slot, server id); ``views``: the
    planner's :class:`TaskViews`."""

    def __init__(self, sim: Simulator, classes: ServerClasses, reserved: dict, objective: str,
                 views: TaskViews | None = None) -> None:
        self.sim, self.cl, self.objective = sim, classes, objective
        lo = sim.unfinished_range()
        tasks = [tk for tk in sim.tasks[lo:] if tk.state != DONE]
        self.ok = len(tasks) == sim.outstanding and all(
            k == SLOT or k == MEMORY for tk in tasks for k, _ in tk.demands)
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
        transfer = sim.network.transfer_s
        self._present, self._loc = tasks, loc
        self._parents: list[list | None] = [None] * len(tasks)  # parents_of, filled when asked
        self.trp = [transfer(o) for o in output]  # from each task as the first parent
        has = [fp is not None for fp in fps]
        self.hasfp0 = has
        slot_of = sim.slot_by_server_id
        self.tr0 = [transfer(fp.output) if fp is not None else 0.0 for fp in fps]
        self.ps0 = [slot_of.get(fp.sid, -1) if fp is not None else -1 for fp in fps]
        self._read_queues(sim, loc)
        self._read_servers(sim, classes, reserved, loc)

    def parents_of(self, i: int) -> list[tuple[int, int, float]]:
        """Task ``i``'s parents as (local index or -1 when finished before now, its server id,
        transfer s), read when a rollout first starts it (only transfer delays need them)."""
        got = self._parents[i]
        if got is None:
            loc, transfer = self._loc, self.sim.network.transfer_s
            got = self._parents[i] = [(loc.get(p.id, -1), p.sid, transfer(p.output))
                                      for p in self._present[i].parents]
        return got

    def _read_queues(self, sim: Simulator, loc: dict[int, int]) -> None:
        """The finish events and the ready queue (heap, deferred list) by local task index."""
        ev = []
        hidden = sim.finish_hidden
        for t, seq, slot, _, task in sim.events.runs():
            # with an unseen overhead, a run ends when expected (as forks)
            ev.append((sim.expected_end(slot, task) if hidden else t, FINISH, seq, slot,
                       loc[task.id]))
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
        busy = sim.table.busy.tolist()
        for s, b in enumerate(busy):
            k = cl.cls[s]
            if k >= 0 and not b:
                idle[k] |= 1 << s
        self.idle0 = idle
        self.busy0 = busy
        self.bu0 = sim.busy_until.tolist()
        self.res0 = {}
        for t_id, (slot, sid) in reserved.items():
            i = loc.get(t_id)
            if i is not None:
                self.res0[i] = self._reservation(i, slot, sid)

    def _reservation(self, i: int, slot: int, sid: int) -> tuple[int, bool, bool]:
        sim = self.sim
        table = sim.table
        same = sim.server_ids[slot] == sid
        return (slot, same and table.accept_l[slot] and table.memory_l[slot] + 1e-9 >= self.mem[i],
                same)

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

    __slots__ = ("r", "sim", "n", "acc", "mem_l", "comp_l", "sid_l", "hol", "mask_inf", "tds",
                 "wait_dt", "next_event", "t_cap", "max_dec", "cmr", "cls", "rk", "tasks",
                 "pend", "tslot", "tsid", "tr_l", "ps_l", "hasfp", "fin", "idle", "busy", "bu",
                 "event_q", "events", "core", "queue", "t", "outstanding", "res")

    def __init__(self, r: Rollouts, first: int, reserve: bool) -> None:
        sim, cl = r.sim, r.cl
        self.r, self.sim = r, sim
        self.n = sim.n_slots
        table, rules = sim.table, sim.core.rules
        self.acc, self.mem_l, self.comp_l = table.accept_l, table.memory_l, table.cpu_speed
        self.sid_l = sim.server_ids
        self.hol = rules.head_of_line_blocking
        self.mask_inf, self.tds = rules.mask_infeasible, sim.transfer_delays
        self.wait_dt, self.next_event = sim.cfg.mdp.wait_dt_s, sim.cfg.mdp.advance_to_next_event
        self.t_cap, self.max_dec = sim.time_cap, sim.max_decisions
        self.cmr, self.cls = cl.mraw, cl.cls
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
        servers.memory_l, servers.max_accept_mem = self.mem_l, max(cl.mraw, default=0.0)
        servers.idle, servers.cmr, servers.rk = self.idle, self.cmr, self.rk
        self.core = core = DecisionCore(servers, rules)
        core.queue = self.queue = ReadyQueue(r.heap0.copy(), r.deferred0.copy(),
                                             r.deferred_heap0)
        core.decisions = sim.decisions
        self.t = sim.t
        self.outstanding = r.outstanding0
        self.res = dict(r.res0)
        if reserve and not servers.fits_now(first, r.mem[r.cur]):
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

    def eft(self, i: int, excl) -> int:  # heuristics.eft_pick on the rollout's lists; -1:
        # again without exclusions (every fitting server is reserved for another task)
        r = self.r
        ps, tr, run = self.ps_l[i], self.tr_l[i], r.compute[i]
        mem, tds, comp, mem_l = r.mem[i], self.tds, self.comp_l, self.mem_l
        best, arg = 0.0, -1
        for s in self.idle_slots(ps, excl, mem):  # heuristics.finish_key, inlined
            t_s = 0.0 if s == ps else tr
            k = run / comp[s] + (t_s if tds else 0.0) + (1e-6 * t_s + 1e-9 * mem_l[s])
            if arg < 0 or k < best or (k == best and s < arg):
                best, arg = k, s
        if arg >= 0:
            return arg
        acc, bu, t = self.acc, self.bu, self.t  # heuristics.soonest: the busy servers it fits
        for s in range(self.n):
            if acc[s] and mem_l[s] + 1e-9 >= mem and s not in excl:
                d = bu[s] - t if self.busy[s] else 0.0
                if arg < 0 or d < best:
                    best, arg = d, s
        if arg < 0:
            return -1 if excl else 0
        return arg

    def idle_slots(self, ps: int, excl, mem: float) -> list[int]:
        """The idle slots EFT can pick: each server class's lowest idle slot that is not
        excluded and whose memory fits (identical servers tie, and EFT's ties go to the lowest
        slot), plus the task's parent's slot when it is idle (no transfer there)."""
        idle, cmr = self.idle, self.cmr
        xb = 0
        for s in excl:
            xb |= 1 << s
        slots = []
        for k in self.rk:
            if cmr[k] + 1e-9 < mem:
                break  # classes by memory, largest first
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
