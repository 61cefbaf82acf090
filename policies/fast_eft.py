"""The fast EFT of the lookahead planner: :class:`policies.heuristics.EarliestFinish`'s pick
computed on the simulator's lists, without building an observation (``eft_act``), and its
ranking of the servers (``eft_ranking``, the planner's candidates). Equal to EarliestFinish
slot for slot (tests/test_lookahead.py); moved here from policies/lookahead.py (issue 26).

The decoding helpers (:class:`_Decoded`, :func:`_task_view`, :func:`_remaining`) read the
simulator's values back the way EarliestFinish reads them from the float32 observation; the
exact rollout engine (``policies.fast_rollout``) uses them too.
"""

from __future__ import annotations

from itertools import compress
from operator import not_

import numpy as np

from envs.simulator import Simulator

_MEM_TOL = 1e-5  # as policies.heuristics: float32 round trip of the normalised memory feature
_f32 = np.float32


class _Decoded:
    """Per-slot compute and memory as EarliestFinish reads them back from the observation
    (float32 features times their constants), recomputed when the server set changes."""

    def __init__(self) -> None:
        self.key: tuple[list, list] | None = None
        self.cdec: list[float] = []
        self.mdec: list[float] = []

    def get(self, sim: Simulator) -> "_Decoded":
        comp, mem = sim.servers.compute_l, sim.servers.memory_l
        if self.key is None or self.key[0] != comp or self.key[1] != mem:
            f = sim.cfg.features
            c = np.minimum(np.array(comp) / f.server_compute, f.clip).astype(np.float32)
            m = np.minimum(np.array(mem) / f.server_memory_gb, f.clip).astype(np.float32)
            self.cdec = (c.astype(np.float64) * f.server_compute).tolist()
            self.mdec = (m.astype(np.float64) * f.server_memory_gb).tolist()
            self.key = (list(comp), list(mem))
        return self


def _task_view(sim: Simulator, task) -> tuple[float, float, float, int]:
    """(compute, memory, transfer, parent slot) of ``task`` as EarliestFinish decodes them."""
    f = sim.cfg.features
    c = float(_f32(min(task.compute / f.compute_unit, f.clip))) * f.compute_unit
    m = float(_f32(min(task.memory_gb / f.memory_gb, f.clip))) * f.memory_gb
    fp = task.first_parent
    tr, pslot = 0.0, -1
    if fp is not None:
        x = (fp.output / sim.bandwidth_gb_s + sim.latency_s) / f.transfer_s
        if x:
            tr = float(_f32(x if x < f.clip else f.clip)) * f.transfer_s
        p = sim.slot_of(fp.sid)
        pslot = -1 if p is None else p
    return c, m, tr, pslot


def _remaining(sim: Simulator, slot: int) -> float:
    """Remaining busy time of ``slot`` as the observation encodes and EFT decodes it."""
    f = sim.cfg.features
    tu = f.time_unit
    r = _f32(_f32(sim.busy_until[slot] - sim.t) * _f32(1.0 / tu))
    r = min(max(float(r), 0.0), float(_f32(f.clip)))
    return r * tu


def _eft_busy(sim: Simulator, slot: int, bu: list) -> bool:
    """Whether EFT sees busy ``slot`` as busy (its decoded remaining time above 1e-9 s)."""
    d = bu[slot] - sim.t
    if d > 1e-7:  # float32 rounding moves it by a relative 1e-7 at most: certainly busy
        return True
    return _remaining(sim, slot) > 1e-9


def eft_ranking(sim: Simulator, dec: _Decoded, exclude: set | frozenset = frozenset(),
                need_busy: bool = False) -> tuple[list[tuple[float, int]], list[int]]:
    """EarliestFinish's view of the current task: (sorted [(score, slot)] of idle fitting
    servers, best first, ties to the lowest slot; fitting busy slots, filled only when no idle
    slot fits unless ``need_busy``). Slots in ``exclude`` are left out."""
    task = sim.current
    tc, tm, tr, pslot = _task_view(sim, task)
    cdec, mdec = dec.cdec, dec.mdec
    acc, busy = sim.servers.accept_l, sim.servers.busy_l
    mem_l = sim.servers.memory_l
    tmem = task.memory_gb if sim.core.rules.mask_infeasible else -1.0
    tol = 1 + _MEM_TOL
    tds = sim.transfer_delays
    idle: list[tuple[float, int]] = []
    busy_fit: list[int] = []
    bu = None
    any_fit = False
    ev = sim.events
    if not need_busy and (not ev or ev[0][0] - sim.t > 1e-7):
        # Fast path: every busy slot finishes more than 1e-7 s from now (its finish event is in
        # the heap), so EFT sees it busy; look at the idle slots first, the busy ones only when
        # no idle slot fits.
        for s in compress(range(sim.n_slots), map(not_, busy)):
            if not acc[s] or mem_l[s] < tmem:
                continue
            m = mdec[s]
            if m * tol < tm or (exclude and s in exclude):
                continue
            t_s = 0.0 if s == pslot else tr
            run = tc / cdec[s]
            if tds:
                run = run + t_s
            idle.append((run + (1e-6 * t_s + 1e-9 * m), s))
        if idle:
            idle.sort()
            return idle, busy_fit  # busy_fit left empty: not needed when an idle slot fits
    for s in range(sim.n_slots):
        if not acc[s] or mem_l[s] < tmem:
            continue
        m = mdec[s]
        if m * tol < tm or (exclude and s in exclude):
            continue
        any_fit = True
        if busy[s]:
            if bu is None:
                bu = sim.busy_until.tolist()
            if _eft_busy(sim, s, bu):
                busy_fit.append(s)
                continue
        t_s = 0.0 if s == pslot else tr
        run = tc / cdec[s]
        if tds:
            run = run + t_s
        idle.append((run + (1e-6 * t_s + 1e-9 * m), s))
    if not any_fit and not exclude:  # nothing fits (no feasibility mask): EFT falls back to valid
        bu = sim.busy_until.tolist()
        for s in range(sim.n_slots):
            if acc[s] and not mem_l[s] < tmem:
                if busy[s] and _eft_busy(sim, s, bu):
                    busy_fit.append(s)
                else:
                    t_s = 0.0 if s == pslot else tr
                    run = tc / cdec[s] + (t_s if tds else 0.0)
                    idle.append((run + (1e-6 * t_s + 1e-9 * mdec[s]), s))
    idle.sort()
    return idle, busy_fit


def eft_act(sim: Simulator, dec: _Decoded, exclude: set | frozenset = frozenset()) -> int:
    """The slot :class:`policies.heuristics.EarliestFinish` picks for the current task, computed
    on the simulator's lists (no observation); with ``exclude``, among the other slots."""
    idle, busy_fit = eft_ranking(sim, dec, exclude)
    if idle:
        return idle[0][1]
    if not busy_fit:
        if exclude:  # every fitting server is reserved for another task: EFT over all of them
            return eft_act(sim, dec)
        return 0  # nothing fits: EFT's argmax over -inf is slot 0
    best, best_s = None, 0
    for s in busy_fit:  # soonest free, lowest slot on ties
        r = _remaining(sim, s)
        if best is None or r < best:
            best, best_s = r, s
    return best_s
