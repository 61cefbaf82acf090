"""Classic placement heuristics (docs/training.md) on the encoder's observation, and EFT's fast
path on the simulator's state.

Each reads raw quantities back from the fixed feature normalisation (``envs.encoding.decode``).
"Fits" means the server's memory holds the task; "idle" means no remaining busy time. When no
idle server fits, every pick is a wait; all heuristics then wait for the fitting server that
frees up first (the least harmful wait), except random, which waits on a random fitting server.

EFT is one rule, :func:`eft_scan` (the key :func:`eft_key`, the fit test, the fallback), on
per-slot lists from three inputs: :class:`EarliestFinish` on an observation (its decoded
features); ``eft_act`` / ``eft_ranking`` on the simulator's state through its read-only view
(``envs.sim_view``), the features' float32 rounding read back by :class:`EftServerView` and
:func:`task_view`, without building an observation; and the lookahead planner's fast rollouts
(``policies.fast_rollout``). :func:`soonest_free` picks the wait. Each passes the idle slots
alone first when every busy one is certainly busy; on an observation and in the rollouts,
identical idle servers are represented by their lowest slot (EFT's ties go to it).
tests/test_lookahead.py checks that the state and the observation pick the same slot,
tests/test_lookahead_fast.py that the rollouts cost the same.
"""

from __future__ import annotations

from itertools import compress
from operator import not_
from typing import Callable, Collection, Iterable

import numpy as np

from envs.config import EnvConfig, FeatureConfig
from envs.encoding import decode
from envs.simulator import Simulator

from .base import Obs, Policy

# Idle servers always outrank busy ones: a busy pick is a wait.
_IDLE_BONUS = 1e9
MEM_TOL = 1e-5  # float32 round trip of the normalised memory feature
_CLASS_MIN = 32  # EarliestFinish on an observation: idle slots beyond which it groups them
F32 = np.float32


def eft_key(run_s, transfer_s, memory_gb):
    """EFT's key of an idle fitting server, lower is better: the run (plus the transfer when
    transfers delay starts), ties to no transfer (the parent's server), then smaller memory.
    Scalars or arrays alike."""
    return run_s + (1e-6 * transfer_s + 1e-9 * memory_gb)


class Heuristic(Policy):
    def __init__(self, features: FeatureConfig | None = None, transfer_delays_start: bool = False,
                 seed: int | None = None):
        self.features = features or FeatureConfig()
        self.transfer_delays_start = transfer_delays_start
        self._seed = seed
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(self._seed if seed is None else seed)

    def read_obs(self, obs: Obs):
        task, srv = decode(obs, self.features)
        fits = srv.valid & (srv.memory_gb * (1 + MEM_TOL) >= task[1])
        if not fits.any():  # nothing fits (only possible without the feasibility mask): any valid
            fits = srv.valid.copy()
        idle = fits & (srv.remaining_s <= 1e-9)
        return task, srv, fits, idle

    def run_time(self, task: np.ndarray, srv) -> np.ndarray:
        with np.errstate(divide="ignore"):
            run = task[0] / np.where(srv.compute > 0, srv.compute, np.nan)
        if self.transfer_delays_start:
            run = run + srv.transfer_s
        return run

    def _soonest_free(self, srv, fits: np.ndarray) -> np.ndarray:
        return np.where(fits, -srv.remaining_s, -np.inf)


class RandomFeasible(Heuristic):
    """Uniformly random among idle servers that fit; a random fitting server when none is idle."""
    name = "random"

    def scores(self, obs: Obs) -> np.ndarray:
        _, _, fits, idle = self.read_obs(obs)
        pool = idle if idle.any() else fits
        return np.where(pool, 1.0, -np.inf)

    def act(self, obs: Obs) -> int:
        pool = np.flatnonzero(np.isfinite(self.scores(obs)))
        return int(pool[self.rng.integers(0, pool.size)])


class RoundRobin(Heuristic):
    """The next idle fitting server after the last one chosen, in slot order."""
    name = "round-robin"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._last = -1

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, idle = self.read_obs(obs)
        if not idle.any():
            return self._soonest_free(srv, fits)
        n = idle.shape[0]
        dist = (np.arange(n) - self._last - 1) % n  # 0 for the slot right after the last pick
        return np.where(idle, -dist.astype(float), -np.inf)

    def act(self, obs: Obs) -> int:
        a = super().act(obs)
        self._last = a
        return a


class LeastLoaded(Heuristic):
    """The fitting server with the least remaining busy time; ties at random. With one task per
    server this is a random idle server while any is idle."""
    name = "least-loaded"

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, _ = self.read_obs(obs)
        return np.where(fits, -srv.remaining_s, -np.inf)

    def act(self, obs: Obs) -> int:
        s = self.scores(obs)
        best = np.flatnonzero(s == s.max())
        return int(best[self.rng.integers(0, best.size)])


class FastestIdle(Heuristic):
    """The idle fitting server with the highest compute; ties to the smallest memory."""
    name = "fastest-idle"

    def scores(self, obs: Obs) -> np.ndarray:
        _, srv, fits, idle = self.read_obs(obs)
        if not idle.any():
            return self._soonest_free(srv, fits)
        return np.where(idle, srv.compute - 1e-6 * srv.memory_gb, -np.inf)


class EarliestFinish(Heuristic):
    """EFT: the idle fitting server where the task finishes first (transfer counted when
    transfers delay starts; otherwise ties go to the parent's server, then smallest memory).
    Never waits while a fitting server is idle."""
    name = "eft"

    def scores(self, obs: Obs) -> np.ndarray:
        """:func:`eft_scan` on the observation's servers: ``-eft_key`` on each idle fitting
        server; when none is idle, minus the remaining time on each fitting busy one; -inf
        elsewhere. The observation carries one transfer time, 0 on the parent's server."""
        task, srv = decode(obs, self.features)
        n = srv.valid.shape[0]
        tr_col, valid = srv.transfer_s, srv.valid
        tr = float(tr_col.max()) if n else 0.0
        parent = np.flatnonzero(valid & (tr_col == 0.0)) if tr > 0.0 else ()
        ps = int(parent[0]) if len(parent) else -1  # absent servers show no transfer either
        comp, mem = srv.compute, srv.memory_gb
        acc = valid & (comp > 0)
        busy = srv.remaining_s > 1e-9
        view = (float(task[0]), float(task[1]), -1.0, tr, ps)
        tds = self.transfer_delays_start
        # The idle slots first (as eft_ranking): busy ones matter only when none fits.
        out = np.full(n, -np.inf)
        cand = np.flatnonzero(acc & ~busy)
        if cand.size > _CLASS_MIN:  # identical servers have equal keys: one slot per class
            others = cand[cand != ps]
            _, first, inverse = np.unique(comp[others] + 1j * mem[others], return_index=True,
                                          return_inverse=True)
            reps = others[first].tolist()
            alone = [ps] if ps >= 0 and acc[ps] and not busy[ps] else []
            idle, _ = eft_scan(reps + alone, acc, mem, busy, comp, mem, view, tds, (),
                               never_busy, fallback=False)
            if idle:
                key = {s: -float(k) for k, s in idle}
                out[others] = np.array([key.get(r, -np.inf) for r in reps])[inverse]
                if alone and ps in key:
                    out[ps] = key[ps]
                return out
        else:
            idle, _ = eft_scan(cand.tolist(), acc, mem, busy, comp, mem, view, tds, (),
                               never_busy, fallback=False)
            if idle:
                for k, s in idle:
                    out[s] = -float(k)
                return out
        lists = (acc.tolist(), mem.tolist(), busy.tolist(), comp.tolist())
        idle, busy_fit = eft_scan(range(n), *lists, lists[1], view, tds, (), _always)
        for k, s in idle:
            out[s] = -k
        if not idle:
            out[busy_fit] = -srv.remaining_s[busy_fit]
        return out


# ------------------------------------------------ EFT on the simulator's state (fast path)
class EftServerView:
    """Per-slot compute and memory as EarliestFinish reads them back from the observation
    (float32 features times their constants), recomputed when the server set changes."""

    def __init__(self) -> None:
        self.key: tuple[list, list] | None = None
        self.cdec: list[float] = []
        self.mdec: list[float] = []

    def get(self, sim: Simulator) -> "EftServerView":
        comp, mem = sim.servers.compute_l, sim.servers.memory_l
        if self.key is None or self.key[0] != comp or self.key[1] != mem:
            f = sim.cfg.features
            c = np.minimum(np.array(comp) / f.server_compute, f.clip).astype(np.float32)
            m = np.minimum(np.array(mem) / f.server_memory_gb, f.clip).astype(np.float32)
            self.cdec = (c.astype(np.float64) * f.server_compute).tolist()
            self.mdec = (m.astype(np.float64) * f.server_memory_gb).tolist()
            self.key = (list(comp), list(mem))
        return self


def task_view(sim: Simulator, task) -> tuple[float, float, float, int]:
    """(compute, memory, transfer, parent slot) of ``task`` as EarliestFinish decodes them."""
    f = sim.cfg.features
    c = float(F32(min(task.compute / f.compute_unit, f.clip))) * f.compute_unit
    m = float(F32(min(task.memory_gb / f.memory_gb, f.clip))) * f.memory_gb
    fp = task.first_parent
    tr, pslot = 0.0, -1
    if fp is not None:
        x = (fp.output / sim.bandwidth_gb_s + sim.latency_s) / f.transfer_s
        if x:
            tr = float(F32(x if x < f.clip else f.clip)) * f.transfer_s
        p = sim.slot_of(fp.sid)
        pslot = -1 if p is None else p
    return c, m, tr, pslot


def decoded_remaining(d: float, inv_tu: F32, tu: float, clip32: float) -> float:
    """A busy time of ``d`` seconds as the observation encodes it and EFT decodes it (float32
    of ``d / time_unit``, clipped; ``inv_tu = F32(1 / time_unit)``, ``clip32 = F32(clip)``)."""
    r = F32(F32(d) * inv_tu)
    return min(max(float(r), 0.0), clip32) * tu


def _remaining_consts(sim: Simulator) -> tuple[F32, float, float]:
    f = sim.cfg.features
    return F32(1.0 / f.time_unit), f.time_unit, float(F32(f.clip))


def remaining_s(sim: Simulator, slot: int) -> float:
    """Remaining busy time of ``slot`` as the observation encodes and EFT decodes it."""
    inv_tu, tu, clip32 = _remaining_consts(sim)
    return decoded_remaining(sim.busy_until[slot] - sim.t, inv_tu, tu, clip32)


def sees_busy(d: float, inv_tu: F32, tu: float, clip32: float) -> bool:
    """Whether EFT sees a server with ``d`` seconds of its run left as busy (its decoded
    remaining time above 1e-9 s)."""
    if d > 1e-7:  # float32 rounding moves it by a relative 1e-7 at most: certainly busy
        return True
    return decoded_remaining(d, inv_tu, tu, clip32) > 1e-9


def eft_scan(slots: Iterable[int], acc: list, mem_l: list, busy: list, cdec: list, mdec: list,
             task: tuple[float, float, float, float, int], tds: bool,
             exclude: Collection[int], is_busy: Callable[[int], bool], fallback: bool = True
             ) -> tuple[list[tuple[float, int]], list[int]]:
    """EFT's rule over per-slot lists (the one copy the simulator's fast path and the planner's
    fast rollouts share; :class:`EarliestFinish` applies it to an observation): ``(idle, busy)``,
    the unsorted ``(eft_key, slot)`` of every idle slot the task fits, and the fitting slots
    ``is_busy`` says are busy. A slot fits when it accepts, holds ``tmem`` (raw memory; -1
    without the feasibility mask) and its decoded memory holds the decoded task memory
    (float32 tolerance). When no slot fits and nothing is excluded, every accepting slot that
    holds ``tmem`` competes (EarliestFinish's fallback over valid actions; not with
    ``fallback`` False, for a pass over part of the slots). ``task``: ``(tc, tm, tmem, tr,
    pslot)``: decoded compute and memory, raw memory bound, the decoded transfer and the
    parent's slot (no transfer there)."""
    tc, tm, tmem, tr, ps = task
    idle: list[tuple[float, int]] = []
    busy_fit: list[int] = []
    tol = 1 + MEM_TOL
    any_fit = False
    for s in slots:
        if not acc[s] or mem_l[s] < tmem:
            continue
        m = mdec[s]
        if m * tol < tm or (exclude and s in exclude):
            continue
        any_fit = True
        if busy[s] and is_busy(s):
            busy_fit.append(s)
            continue
        t_s = 0.0 if s == ps else tr
        # eft_key(run, t_s, m), inlined: a call per slot would double this loop's cost
        idle.append((tc / cdec[s] + (t_s if tds else 0.0) + (1e-6 * t_s + 1e-9 * m), s))
    if not any_fit and not exclude and fallback:
        for s in slots:
            if acc[s] and not mem_l[s] < tmem:
                if busy[s] and is_busy(s):
                    busy_fit.append(s)
                else:
                    t_s = 0.0 if s == ps else tr
                    idle.append((eft_key(tc / cdec[s] + (t_s if tds else 0.0), t_s, mdec[s]),
                                 s))
    return idle, busy_fit


def soonest_free(busy_fit: list[int], remaining: Callable[[int], float]) -> int:
    """The busy slot EFT waits for: the soonest free as decoded, the lowest slot on ties."""
    best, best_s = None, 0
    for s in busy_fit:
        r = remaining(s)
        if best is None or r < best:
            best, best_s = r, s
    return best_s


def eft_ranking(sim: Simulator, dec: EftServerView, exclude: set | frozenset = frozenset(),
                need_busy: bool = False) -> tuple[list[tuple[float, int]], list[int]]:
    """EarliestFinish's view of the current task: (sorted [(score, slot)] of idle fitting
    servers, best first, ties to the lowest slot; fitting busy slots, filled only when no idle
    slot fits unless ``need_busy``). Slots in ``exclude`` are left out."""
    task = sim.current
    tc, tm, tr, pslot = task_view(sim, task)
    cdec, mdec = dec.cdec, dec.mdec
    acc, busy = sim.servers.accept_l, sim.servers.busy_l
    mem_l = sim.servers.memory_l
    tmem = task.memory_gb if sim.core.rules.mask_infeasible else -1.0
    tds = sim.transfer_delays
    view = (tc, tm, tmem, tr, pslot)
    if not need_busy and sim.events.peek() - sim.t > 1e-7:
        # Fast path: every busy slot finishes more than 1e-7 s from now (its finish event is in
        # the heap), so EFT sees it busy; the idle slots alone decide unless none fits.
        idle, _ = eft_scan(compress(range(sim.n_slots), map(not_, busy)), acc, mem_l, busy,
                           cdec, mdec, view, tds, exclude, never_busy, fallback=False)
        if idle:
            idle.sort()
            return idle, []  # busy slots not needed when an idle slot fits
    bu = sim.busy_until.tolist()
    t = sim.t
    k = _remaining_consts(sim)
    idle, busy_fit = eft_scan(range(sim.n_slots), acc, mem_l, busy, cdec, mdec, view, tds,
                              exclude, lambda s: sees_busy(bu[s] - t, *k))
    idle.sort()
    return idle, busy_fit


def _always(s: int) -> bool:  # the busy flags are already EFT's decoded view
    return True


def never_busy(s: int) -> bool:
    """The busy test of a pass over idle slots only."""
    return False


def eft_act(sim: Simulator, dec: EftServerView, exclude: set | frozenset = frozenset()) -> int:
    """The slot :class:`policies.heuristics.EarliestFinish` picks for the current task, computed
    on the simulator's lists (no observation); with ``exclude``, among the other slots."""
    idle, busy_fit = eft_ranking(sim, dec, exclude)
    if idle:
        return idle[0][1]
    if not busy_fit:
        if exclude:  # every fitting server is reserved for another task: EFT over all of them
            return eft_act(sim, dec)
        return 0  # nothing fits: EFT's argmax over -inf is slot 0
    return soonest_free(busy_fit, lambda s: remaining_s(sim, s))


class EarliestFinishWait(Heuristic):
    """EFT-wait: any fitting server, busy ones counted from when they free up; picking a busy
    server is a wait (it shows what waiting costs under the paper's semantics)."""
    name = "eft-wait"

    def scores(self, obs: Obs) -> np.ndarray:
        task, srv, fits, _ = self.read_obs(obs)
        finish = srv.remaining_s + self.run_time(task, srv)
        return np.where(fits, -(finish + 1e-9 * srv.memory_gb), -np.inf)


class Heft(EarliestFinish):
    """HEFT-style: tasks ordered by upward rank (the simulator's first level), placed by EFT."""
    name = "heft"
    order = "upward_rank"


HEURISTICS: dict[str, type[Heuristic]] = {
    cls.name: cls for cls in (RandomFeasible, RoundRobin, LeastLoaded, FastestIdle, EarliestFinish,
                              EarliestFinishWait, Heft)
}


def make_heuristic(name: str, env: EnvConfig | None = None, seed: int | None = None) -> Policy:
    """A heuristic by name, reading features and the transfer switch from ``env``."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown heuristic {name!r}; choose one of {sorted(HEURISTICS)}")
    env = env or EnvConfig()
    return HEURISTICS[name](env.features, env.mdp.transfer_delays_start, seed)


