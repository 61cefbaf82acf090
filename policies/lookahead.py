"""``lookahead``: a rollout planner that acts on the simulator's state (issue 17).

At each decision the planner proposes a few servers for the current task, tries each on a
:func:`envs.fork.fork` of the simulator, rolls the fork ``horizon_s`` simulated seconds forward
with a fast EFT, and keeps the server whose rollout gives the lowest total response of the work
present now (``objective: task``; ``workflow``: the sum of workflow completions).

Candidates: the ``candidates`` best idle fitting servers by EFT's finish time (servers that look
the same to EFT, same speed, memory and transfer, count once; the first candidate is EFT's own
choice), plus, with ``wait: true``, the busy fitting server that would finish the task first if
it beats the best idle one. A single candidate is taken without a rollout. Choosing a busy server
*reserves* it: the task is deferred (a wait) and no other task is placed on that server. With
``reservations: instant`` (default) the reservation lasts this instant (this placement round):
once the clock moves the task is planned afresh like any other. With ``until_start`` it keeps
choosing that server until it starts there (the first version; measured worse:
results/lookahead/README.md).

The future of a rollout (``future``): ``none`` (default) rolls out the present work alone;
``sampled`` draws new arrivals from fresh random streams (one per decision, the same for every
candidate: common random numbers), so the planner never sees the episode's real future;
``oracle`` keeps the simulator's own streams, so rollouts see the real future arrivals (an upper
bound for comparison; not a scheduler one could deploy).

Where no simulator runs (the placement service's ``/v1/schedule``, the live scheduler),
:meth:`Lookahead.decide` plans on a simulator built from a snapshot of the present
(``envs.snapshot``); ``snapshot: true`` makes every decision that way in the simulator too, to
measure the deployed planner.

Not an observation policy: the evaluation harness calls :meth:`Lookahead.act_state` with the
simulator (:func:`has_state_protocol`); :meth:`scores` on an observation raises. Never guarded
(``policies.guard.is_learned`` is False for it), never batched.
"""

from __future__ import annotations

import time
from itertools import compress
from operator import not_
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from envs.config import EnvConfig, build, rng
from envs.objective import completion_cost
from envs.fork import drop_arrivals, fork, unfinished_range
from envs.simulator import DONE, READY, RUNNING, Simulator
from envs.snapshot import ServerState, WorkflowState
from envs.snapshot import build as build_snapshot
from envs.snapshot import describe as describe_snapshot

from .base import Obs, Policy

_MEM_TOL = 1e-5  # as policies.heuristics: float32 round trip of the normalised memory feature
_f32 = np.float32


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of the ``lookahead`` planner (``--policy lookahead:key=value,...``)."""
    candidates: int = field(default=3, metadata=rng(
        ge=1, le=64, doc="idle servers tried (best by EFT finish time; EFT's own choice first)"))
    objective: Literal["task", "workflow"] | None = field(default=None, metadata=rng(
        doc="task: total task response of the work present now; workflow: total workflow "
            "response; unset: the env's objective (envs.objective)"))
    base: Literal["eft"] = field(default="eft", metadata=rng(doc="policy of the rollouts"))
    horizon_s: float = field(default=20.0, metadata=rng(gt=0, le=1e5, doc="rollout length, sim s"))
    wait: bool = field(default=True, metadata=rng(
        doc="also try waiting for the busy server that finishes the task first (reserves it)"))
    future: Literal["none", "sampled", "oracle"] = field(default="none", metadata=rng(
        doc="arrivals in a rollout: fresh random ones, none, or the episode's real ones"))
    reservations: Literal["instant", "until_start"] = field(default="instant", metadata=rng(
        doc="how long a chosen wait reserves its busy server: this instant only (the task is "
            "planned afresh once the clock moves), or until the task starts there"))
    snapshot: bool = field(default=False, metadata=rng(
        doc="plan every decision on a snapshot of the present (envs.snapshot), remembering "
            "only this instant's waits: how /v1/schedule and the live scheduler run it"))


def load_lookahead_config(data: Mapping[str, Any] | LookaheadConfig | None,
                          path: str = "lookahead") -> LookaheadConfig:
    """A validated :class:`LookaheadConfig`; a bad key or value raises ConfigError naming it."""
    return build(LookaheadConfig, data, path)


def parse_spec(spec: str) -> LookaheadConfig:
    """``lookahead`` or ``lookahead:candidates=5,horizon_s=10,wait=false`` -> config (values
    parsed as YAML scalars)."""
    import yaml

    _, _, rest = spec.partition(":")
    data: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"--policy {spec!r}: expected key=value, got {item!r}")
        data[key.strip()] = yaml.safe_load(raw)
    return load_lookahead_config(data)


def has_state_protocol(policy: Any) -> bool:
    """Whether ``policy`` acts on the simulator state (``act_state(sim) -> slot``)."""
    return callable(getattr(policy, "act_state", None))


# ------------------------------------------------------------------------------------ fast EFT
class _Decoded:
    """Per-slot compute and memory as EarliestFinish reads them back from the observation
    (float32 features times their constants), recomputed when the server set changes."""

    def __init__(self) -> None:
        self.key: tuple[list, list] | None = None
        self.cdec: list[float] = []
        self.mdec: list[float] = []

    def get(self, sim: Simulator) -> "_Decoded":
        if self.key is None or self.key[0] != sim._compute_l or self.key[1] != sim._memory_l:
            f = sim.cfg.features
            c = np.minimum(np.array(sim._compute_l) / f.server_compute, f.clip).astype(np.float32)
            m = np.minimum(np.array(sim._memory_l) / f.server_memory_gb, f.clip).astype(np.float32)
            self.cdec = (c.astype(np.float64) * f.server_compute).tolist()
            self.mdec = (m.astype(np.float64) * f.server_memory_gb).tolist()
            self.key = (list(sim._compute_l), list(sim._memory_l))
        return self


def _task_view(sim: Simulator, task) -> tuple[float, float, float, int]:
    """(compute, memory, transfer, parent slot) of ``task`` as EarliestFinish decodes them."""
    f = sim.cfg.features
    c = float(_f32(min(task.compute / f.compute_unit, f.clip))) * f.compute_unit
    m = float(_f32(min(task.memory_gb / f.memory_gb, f.clip))) * f.memory_gb
    fp = task.first_parent
    tr, pslot = 0.0, -1
    if fp is not None:
        x = (fp.output / sim._bw + sim._lat) / f.transfer_s
        if x:
            tr = float(_f32(x if x < f.clip else f.clip)) * f.transfer_s
        p = sim._slot_of.get(fp.sid)
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
    acc, busy = sim._accept_l, sim._busy_l
    mem_l = sim._memory_l
    tmem = task.memory_gb if sim._mask_infeasible else -1.0
    tol = 1 + _MEM_TOL
    tds = sim._transfer_delays
    idle: list[tuple[float, int]] = []
    busy_fit: list[int] = []
    bu = None
    any_fit = False
    ev = sim._events
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


# ------------------------------------------------------------------------------------ planner
class Lookahead(Policy):
    """The rollout planner (module docstring). ``act_state(sim)`` -> slot."""

    name = "lookahead"
    planner = True  # policies.guard.is_learned: not a learned policy, never guarded
    batched = False

    def __init__(self, env: EnvConfig | None = None, config: LookaheadConfig | None = None,
                 seed: int | None = None):
        self.env = env or EnvConfig()
        self.config = config or LookaheadConfig()
        self._seed = seed
        self._dec = _Decoded()
        self._pool = [[np.random.Generator(np.random.PCG64(i)) for _ in range(3)]
                      for i in range(self.config.candidates + 1)]
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        seed = self._seed if seed is None else seed
        ss = np.random.SeedSequence([0 if seed is None else seed, 17])
        a, w = ss.spawn(2)
        self._future = (np.random.Generator(np.random.PCG64(a)),
                        np.random.Generator(np.random.PCG64(w)))
        self._reserved: dict[int, tuple[int, int]] = {}  # task id -> (slot, server id)
        self._inner = None  # snapshot: true: the planner run on each snapshot
        self._round_t = None  # the instant whose waits hold (reservations instant, snapshot)
        self._round_waits: dict[int, int] = {}  # snapshot: this instant's waits, task id -> slot
        self.stats = {"decisions": 0, "planned": 0, "rollouts": 0, "waits_chosen": 0,
                      "changed": 0, "plan_s": 0.0}

    def scores(self, obs: Obs) -> np.ndarray:
        raise RuntimeError("lookahead plans on the simulator state: call act_state(sim) "
                           "(scale-ray eval does); it cannot act on an observation alone")

    def describe(self) -> dict:
        from envs.config import to_dict
        return {"name": self.name, "algorithm": "planner", "version": "builtin",
                "order": self.order, "config": to_dict(self.config)}

    def fresh(self) -> "Lookahead":
        """A planner with the same settings and its own state (one per thread or round)."""
        return Lookahead(self.env, self.config, self._seed)

    def decide(self, servers: Sequence[ServerState], workflows: Sequence[WorkflowState],
               focus: tuple[int, int], waiting: Mapping[tuple[int, int], int] | None = None,
               env: EnvConfig | None = None) -> int:
        """The server position for task ``focus`` = (workflow, task) of a snapshot of the
        present (``envs.snapshot``: the placement service's request, the live scheduler's
        record). ``waiting``: tasks of the snapshot that chose to wait for a busy server
        earlier in this round -> that server (they stay reserved for them in the rollouts).
        ``env``: rules and constants of the snapshot (default: the planner's). Not
        thread-safe: one planner per thread (:meth:`fresh`)."""
        snap = build_snapshot(env or self.env, servers, workflows, focus)
        sim = snap.sim
        saved, saved_t = self._reserved, self._round_t
        self._reserved = {snap.ids[w][j]: (s, sim._sid_l[s]) for (w, j), s in (waiting or {}).items()}
        self._round_t = sim.t  # this instant's waits hold
        try:
            return self.act_state(sim)
        finally:
            self._reserved, self._round_t = saved, saved_t

    # -------------------------------------------------------------- acting
    def act_state(self, sim: Simulator) -> int:
        if self.config.snapshot:
            return self._act_snapshot(sim)
        self.stats["decisions"] += 1
        if self.config.reservations == "instant" and self._round_t != sim.t:
            self._round_t = sim.t  # the clock moved: every task is planned afresh
            self._reserved.clear()
        slot = _reserved_slot(sim, self._reserved)
        if slot is not None:
            return slot
        t0 = time.perf_counter()
        dec = self._dec.get(sim)
        excl = _exclusions(sim, self._reserved)
        cands = self._candidates(sim, dec, excl)
        if len(cands) == 1:
            slot = cands[0]
        else:
            slot = self._plan(sim, cands)
            self.stats["planned"] += 1
            self.stats["changed"] += slot != cands[0]
        if sim._busy_l[slot]:  # a wait: reserve the server
            self._reserved[sim.current.id] = (slot, sim._sid_l[slot])
            self.stats["waits_chosen"] += 1
        self.stats["plan_s"] += time.perf_counter() - t0
        return slot

    def _act_snapshot(self, sim: Simulator) -> int:
        """``snapshot: true``: the decision as Serve and the live scheduler make it. Waits chosen
        at this instant (one placement round) stay reserved; earlier ones are forgotten."""
        if self._round_t != sim.t:
            self._round_t, self._round_waits = sim.t, {}
        t0 = time.perf_counter()
        servers, workflows, ids = describe_snapshot(sim)
        where = {tid: (w, j) for w, tids in enumerate(ids) for j, tid in enumerate(tids)}
        waiting = {where[tid]: s for tid, s in self._round_waits.items() if tid in where}
        if self._inner is None:
            self._inner = Lookahead(self.env, replace(self.config, snapshot=False), self._seed)
        inner = self._inner
        slot = inner.decide(servers, workflows, where[sim.current.id], waiting, env=sim.cfg)
        if sim._busy_l[slot]:
            self._round_waits[sim.current.id] = slot
        for k in ("decisions", "planned", "rollouts", "waits_chosen", "changed"):
            self.stats[k] = inner.stats[k]
        self.stats["plan_s"] += time.perf_counter() - t0
        return slot

    def _candidates(self, sim: Simulator, dec: _Decoded, excl: set) -> list[int]:
        idle, busy_fit = eft_ranking(sim, dec, excl, need_busy=self.config.wait)
        if not idle:
            return [eft_act(sim, dec, excl)]
        cfg = self.config
        out, seen = [], set()
        tc, _, tr, pslot = _task_view(sim, sim.current)
        for _, s in idle:
            sig = (dec.cdec[s], dec.mdec[s], s == pslot)
            if sig not in seen:
                seen.add(sig)
                out.append(s)
                if len(out) == cfg.candidates:
                    break
        if cfg.wait and busy_fit:
            tds = sim._transfer_delays
            best_idle = tc / dec.cdec[out[0]] + ((0.0 if out[0] == pslot else tr) if tds else 0.0)
            t, bu = sim.t, sim.busy_until
            best, best_s = best_idle, -1
            for s in busy_fit:
                if not sim._accept_l[s] or sim._memory_l[s] < sim.current.memory_gb:
                    continue
                fin = (bu[s] - t) + tc / dec.cdec[s] + ((0.0 if s == pslot else tr) if tds else 0.0)
                if fin < best:
                    best, best_s = fin, s
            if best_s >= 0:
                out.append(best_s)
        return out

    def _plan(self, sim: Simulator, cands: list[int]) -> int:
        cfg = self.config
        lo = unfinished_range(sim)
        present = [tk.id for tk in sim.tasks[lo:] if tk.state != DONE]
        wf_ids = sorted({sim.tasks[i].wf.id for i in present})
        t_end = sim.t + cfg.horizon_s
        future = None
        if cfg.future == "sampled":
            future = (self._future[0].bit_generator.state, self._future[1].bit_generator.state)
            for g in self._future:
                g.bit_generator.advance(1 << 40)  # the next decision's streams
        task_id = sim.current.id
        best_cost, best_slot = None, cands[0]
        for i, slot in enumerate(cands):
            f = fork(sim, self._pool[i])
            if cfg.future == "none":
                drop_arrivals(f)
            elif future is not None:
                f.rng_arrivals.bit_generator.state = future[0]
                f.rng_workload.bit_generator.state = future[1]
                f._arrivals._gaps = []
                if isinstance(getattr(f._source, "_buffer", None), list):
                    f._source._buffer = []
            res = dict(self._reserved)
            if f._busy_l[slot]:
                res[task_id] = (slot, f._sid_l[slot])
            f.step(slot)
            _rollout(f, res, self._dec, t_end, [f.workflows[w] for w in wf_ids])
            self.stats["rollouts"] += 1
            cost = _cost(f, present, t_end, cfg.objective or sim.cfg.objective)
            if best_cost is None or cost < best_cost - 1e-9 * max(1.0, abs(best_cost)):
                best_cost, best_slot = cost, slot
        return best_slot


def _reserved_slot(sim: Simulator, reserved: dict) -> int | None:
    """The current task's reserved server while it is still usable (the reservation ends when
    the task starts there); None otherwise."""
    task = sim.current
    r = reserved.get(task.id)
    if r is None:
        return None
    slot, sid = r
    if sim._sid_l[slot] == sid and sim._accept_l[slot] and sim._memory_l[slot] >= task.memory_gb:
        if not sim._busy_l[slot]:
            del reserved[task.id]
        return slot
    del reserved[task.id]
    return None


def _exclusions(sim: Simulator, reserved: dict) -> set:
    """Slots reserved for other tasks that still wait for them (stale reservations dropped)."""
    if not reserved:
        return set()
    out = set()
    cur = sim.current.id
    for tid, (slot, sid) in list(reserved.items()):
        if sim.tasks[tid].state != READY or sim._sid_l[slot] != sid:
            del reserved[tid]
        elif tid != cur:
            out.add(slot)
    return out


def _rollout(f: Simulator, res: dict, dec: _Decoded, t_end: float, wfs: list) -> None:
    """Step fork ``f`` with EFT (honouring reservations ``res``) until ``t_end``, the end of the
    episode, or the completion of every workflow in ``wfs``."""
    n = 0
    while f.current is not None and f.t < t_end:
        slot = _reserved_slot(f, res) if res else None
        if slot is None:
            slot = eft_act(f, dec.get(f), _exclusions(f, res) if res else frozenset())
        f.step(slot)
        n += 1
        if not n & 7 and all(w.done == w.n for w in wfs):
            return


def _cost(f: Simulator, present: list[int], t_end: float, objective: str) -> float:
    """``envs.objective.completion_cost`` of the present tasks' (estimated) completions: the
    finish time when done, the scheduled end when running, else the rollout's end plus the run
    time at the mean speed."""
    now = max(f.t, t_end)
    mc = f._mean_compute
    tasks = f.tasks
    busy_until = f.busy_until

    def completions():
        for i in present:
            tk = tasks[i]
            st = tk.state
            yield tk.wf.id, (tk.finish if st == DONE else busy_until[tk.slot] if st == RUNNING
                             else now + tk.compute / mc)

    return completion_cost(objective, completions())


def make_lookahead(spec: str, env: EnvConfig | None = None, seed: int | None = None) -> Lookahead:
    """``--policy lookahead[:key=value,...]`` -> the planner."""
    return Lookahead(env, parse_spec(spec), seed)
