"""``lookahead``: a rollout planner that acts on the simulator's state (issue 17).

At each decision the planner proposes a few servers for the current task, tries each on a copy
of the present, rolls the copy ``horizon_s`` simulated seconds forward with EFT, and keeps the
server whose rollout gives the lowest total response of the work present now (the env's
``objective``, envs/objective.py, unless the planner's own says otherwise: ``workflow``, the sum
of workflow completions, what an agent user waits for; ``task``, of task completions, the
paper's proxy).

The copy: where the server set cannot change during the rollout, the exact fast rollouts of
``policies.fast_rollout`` (the same costs, bit for bit, at a fraction of the time: issue 26);
otherwise (server dynamics, ``srpt``/``las``, ``future`` other than ``none``) an
:meth:`Simulator.fork` (envs/fork.py) of the simulator stepped with EFT (``policies.heuristics.eft_pick``).

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

Where no simulator runs (the placement service's ``/v1/schedule``, the live runtime),
:meth:`Lookahead.plan` plans on a simulator built from a snapshot of the present
(``envs.snapshot``); ``snapshot: true`` makes every decision that way in the simulator too, to
measure the deployed planner.

The rollouts' rule (``base``) is EFT, or EFT with ties spread (``eft_spread``, live on Ray
nodes). On Ray nodes the rollouts run on forks (the fast rollouts model servers of one slot);
``max_open_per_node`` bounds the cost in a burst (the base rule decides then).

Not an observation policy: the evaluation harness calls :meth:`Lookahead.decide` with the
simulator (a :class:`policies.base.Planner`). Never guarded, never batched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from envs.config import EnvConfig, build, rng
from envs.objective import completion_cost
from envs.simulator import DONE, READY, RUNNING, Simulator
from envs.snapshot import ServerState, WorkflowState
from envs.snapshot import build as build_snapshot
from envs.snapshot import describe as describe_snapshot

from .base import Policy
from .heuristics import HEURISTICS, eft_heads, eft_pick, finish_key, finish_s
from .fast_rollout import Rollouts, ServerClasses, supported
from .rollout_core import TaskViews

DEFER = -1  # first_k: the candidate "the current task waits this instant, nothing reserved"


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of the ``lookahead`` planner (``--policy lookahead:key=value,...``)."""
    candidates: int = field(default=3, metadata=rng(
        ge=1, le=64, doc="idle servers tried (best by EFT finish time; EFT's own choice first)"))
    objective: Literal["task", "workflow"] | None = field(default=None, metadata=rng(
        doc="workflow: total workflow response of the work present now; task: total task "
            "response (the paper's proxy); null (default): the env's objective (envs.objective)"))
    base: Literal["eft", "eft_spread"] = field(default="eft", metadata=rng(
        doc="policy of the rollouts (and of a decision with one candidate): eft, or eft_spread "
            "(live on Ray nodes: EFT's ties spread over the nodes keep Ray's workers warm)"))
    horizon_s: float = field(default=20.0, metadata=rng(gt=0, le=1e5, doc="rollout length, sim s"))
    wait: bool = field(default=True, metadata=rng(
        doc="also try waiting for the busy server that finishes the task first (reserves it)"))
    future: Literal["none", "sampled", "oracle"] = field(default="none", metadata=rng(
        doc="arrivals in a rollout: fresh random ones, none, or the episode's real ones"))
    reservations: Literal["instant", "until_start"] = field(default="instant", metadata=rng(
        doc="how long a chosen wait reserves its busy server: this instant only (the task is "
            "planned afresh once the clock moves), or until the task starts there"))
    first_k: int = field(default=1, metadata=rng(
        ge=1, le=16, doc="which of the first K ready tasks starts first: K > 1 adds the "
            "candidate 'defer' (the task waits this instant, nothing reserved, and the next "
            "ready task is planned), at most K - 1 times per instant; needs no head-of-line "
            "blocking"))
    snapshot: bool = field(default=False, metadata=rng(
        doc="plan every decision on a snapshot of the present (envs.snapshot), remembering "
            "only this instant's waits: how /v1/schedule and the live scheduler run it"))
    max_open_per_node: float = field(default=0.0, metadata=rng(
        ge=0, doc="above this many open workflows a node (a burst, a flooded cluster) decide "
                  "with the base rule alone, counted in stats['skipped'] (0: no bound): a "
                  "rollout runs the present work, so its cost grows with the backlog"))


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


class RoundChoices:
    """What a planner chose earlier in one placement round, for the next asks of that round
    (:meth:`Lookahead.decide`'s ``waiting`` and ``deferred``): tasks that wait for a busy server
    (reserved for them) and tasks it deferred (``first_k``). Keys are the caller's task ids
    (the live scheduler's gids, a request's positions, the simulator's task ids)."""

    __slots__ = ("waiting", "deferred")

    def __init__(self) -> None:
        self.waiting: dict[Any, int] = {}  # task key -> position of the busy server it waits for
        self.deferred: list[Any] = []

    def clear(self) -> None:
        self.waiting.clear()
        self.deferred.clear()

    def for_snapshot(self, where: Mapping[Any, tuple[int, int]] | None = None
                     ) -> tuple[dict[tuple[int, int], int], list[tuple[int, int]]]:
        """(waiting, deferred) as snapshot positions; ``where``: task key -> (workflow, task)
        of the snapshot (None: the keys are positions); tasks no longer listed are left out."""
        if where is None:
            return dict(self.waiting), list(self.deferred)
        return ({where[k]: s for k, s in self.waiting.items() if k in where},
                [where[k] for k in self.deferred if k in where])

    def record(self, key: Any, choice: int, deferred: bool, busy: bool) -> None:
        """Remember the planner's answer ``choice`` for task ``key`` (``deferred``: the planner
        deferred it; ``busy``: that server is busy, so the answer is a wait unless deferred)."""
        if deferred:
            self.deferred.append(key)
        elif busy:
            self.waiting[key] = choice


# ------------------------------------------------------------------------------------ planner
class Lookahead(Policy):
    """The rollout planner (module docstring). ``decide(sim)`` -> node. ``fast = False``
    rolls every candidate out on a fork (the same decisions, slower: tests and ``scale-ray bench
    lookahead --forked`` compare the two)."""

    name = "lookahead"
    planner = True  # not a learned policy: never guarded
    batched = False

    def __init__(self, env: EnvConfig | None = None, config: LookaheadConfig | None = None,
                 seed: int | None = None):
        self.env = env or EnvConfig()
        self.config = config or LookaheadConfig()
        self._seed = seed
        self._base = None if self.config.base == "eft" else HEURISTICS[self.config.base](seed)
        self._classes = ServerClasses()
        self._views = TaskViews()
        self.fast = True  # exact fast rollouts where supported (policies.fast_rollout)
        self._pool = [[np.random.Generator(np.random.PCG64(i)) for _ in range(3)]
                      for i in range(self.config.candidates + 2)]  # + wait, + defer
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        seed = self._seed if seed is None else seed
        ss = np.random.SeedSequence([0 if seed is None else seed, 17])
        a, w = ss.spawn(2)
        self._future = (np.random.Generator(np.random.PCG64(a)),
                        np.random.Generator(np.random.PCG64(w)))
        self._reserved: dict[int, tuple[int, int]] = {}  # task id -> (node, node id)
        self._inner = None  # snapshot: true: the planner run on each snapshot
        self._round_t = None  # the instant whose waits hold (reservations instant, snapshot)
        self._round = RoundChoices()  # snapshot: this instant's waits and defers, by task id
        self._deferred_t, self._deferred_n = None, 0  # first_k: defers chosen at this instant
        self.last_deferred = False  # the last answer was a defer (first_k), not a wait
        self.stats = {"decisions": 0, "planned": 0, "rollouts": 0, "waits_chosen": 0,
                      "deferred": 0, "changed": 0, "skipped": 0, "plan_s": 0.0}

    def describe(self) -> dict:
        from envs.config import to_dict
        return {"name": self.name, "algorithm": "planner", "version": "builtin",
                "order": self.order, "config": to_dict(self.config)}

    def fresh(self) -> "Lookahead":
        """A planner with the same settings and its own state (one per thread or round)."""
        return Lookahead(self.env, self.config, self._seed)

    def base_pick(self, sim: Simulator, exclude=frozenset()) -> int:
        """The rollouts' rule (``base``) for ``sim``'s current task."""
        if self._base is None:
            return eft_pick(sim, exclude)
        return self._base.decide(sim)

    def plan(self, servers: Sequence[ServerState], workflows: Sequence[WorkflowState],
             focus: tuple[int, int], waiting: Mapping[tuple[int, int], int] | None = None,
             env: EnvConfig | None = None, deferred: Sequence[tuple[int, int]] = ()) -> int:
        """The node position for task ``focus`` = (workflow, task) of a snapshot of the
        present (``envs.snapshot``: the placement service's request, the live runtime's
        record). ``waiting``: tasks of the snapshot that chose to wait for a busy node earlier
        in this round -> that node (they stay reserved for them in the rollouts). ``env``: rules
        and constants of the snapshot (default: the planner's). ``deferred``: tasks this planner
        deferred earlier in the round (``first_k``; they wait until the clock moves). After the
        call :attr:`last_deferred` tells whether the answer is such a defer (a busy node's
        position that reserves nothing) rather than a wait for that node. Not thread-safe: one
        planner per thread (:meth:`fresh`)."""
        snap = build_snapshot(env or self.env, servers, workflows, focus, deferred=deferred)
        sim = snap.sim
        saved = self._reserved, self._round_t, self._deferred_t, self._deferred_n
        sids = sim.server_ids
        self._reserved = {snap.ids[w][j]: (s, sids[s]) for (w, j), s in (waiting or {}).items()}
        self._round_t = sim.t  # this instant's waits hold
        self._deferred_t, self._deferred_n = sim.t, len(deferred)
        try:
            return self.decide(sim)
        finally:
            self._reserved, self._round_t, self._deferred_t, self._deferred_n = saved

    # -------------------------------------------------------------- acting
    def decide(self, state: Simulator) -> int:
        sim = state.simulator()
        self.last_deferred = False
        if self.config.snapshot:
            return self._decide_snapshot(sim)
        self.stats["decisions"] += 1
        if self.config.reservations == "instant" and self._round_t != sim.t:
            self._round_t = sim.t  # the clock moved: every task is planned afresh
            self._reserved.clear()
        slot = _reserved_slot(sim, self._reserved)
        if slot is not None:
            return slot
        bound = self.config.max_open_per_node
        if bound and sim.open_workflows > bound * sim.cluster.count:
            self.stats["skipped"] += 1  # a burst: the base rule, at bounded cost
            return self.base_pick(sim)
        t0 = time.perf_counter()
        excl = _exclusions(sim, self._reserved)
        cands = self._candidates(sim, excl)
        defer_slot = self._defer_slot(sim, cands)
        if defer_slot is not None:
            cands.append(DEFER)
        if len(cands) == 1:
            slot = cands[0]
        else:
            slot = self._plan(sim, cands, defer_slot)
            self.stats["planned"] += 1
            self.stats["changed"] += slot != cands[0]
        if slot == DEFER:  # the task waits this instant, unreserved; the next one is planned
            self._deferred_n += 1
            self.stats["deferred"] += 1
            self.last_deferred = True
            slot = defer_slot
        elif not sim.table.fits_now(slot, sim.current.demands):  # a wait: reserve the node
            self._reserved[sim.current.id] = (slot, sim.server_ids[slot])
            self.stats["waits_chosen"] += 1
        self.stats["plan_s"] += time.perf_counter() - t0
        return slot

    def _decide_snapshot(self, sim: Simulator) -> int:
        """``snapshot: true``: the decision as Serve and the live runtime make it. Waits chosen
        at this instant (one placement round) stay reserved; earlier ones are forgotten."""
        if self._round_t != sim.t:
            self._round_t = sim.t
            self._round.clear()
        t0 = time.perf_counter()
        servers, workflows, ids = describe_snapshot(sim)
        where = {tid: (w, j) for w, tids in enumerate(ids) for j, tid in enumerate(tids)}
        waiting, deferred = self._round.for_snapshot(where)
        if self._inner is None:
            self._inner = Lookahead(self.env, replace(self.config, snapshot=False), self._seed)
        inner = self._inner
        slot = inner.plan(servers, workflows, where[sim.current.id], waiting, env=sim.cfg,
                          deferred=deferred)
        self.last_deferred = inner.last_deferred
        self._round.record(sim.current.id, slot, inner.last_deferred,
                           not sim.table.fits_now(slot, sim.current.demands))
        for k in ("decisions", "planned", "rollouts", "waits_chosen", "deferred", "changed",
                  "skipped"):
            self.stats[k] = inner.stats[k]
        self.stats["plan_s"] += time.perf_counter() - t0
        return slot

    def _defer_slot(self, sim: Simulator, cands: list[int]) -> int | None:
        """``first_k``: a node whose pick makes the current task wait (a busy one) when
        deferring it is still allowed at this instant; None otherwise (K = 1, head-of-line
        blocking, the K - 1 defers of this instant spent, or no busy node to name)."""
        k = self.config.first_k
        if k <= 1 or sim.core.rules.head_of_line_blocking:
            return None
        if self._deferred_t != sim.t:
            self._deferred_t, self._deferred_n = sim.t, 0
        d = sim.current.demands
        table = sim.table
        if self._deferred_n >= k - 1 or not table.fits_now(cands[0], d):
            return None  # EFT's own choice is already a wait: nothing to defer for
        return next((i for i in range(table.n) if table.running[i]
                     and not table.fits_now(i, d)), None)

    def _candidates(self, sim: Simulator, excl: set) -> list[int]:
        """The ``candidates`` nodes of the least EFT finish where the task fits now (nodes that
        look the same to EFT count once; EFT's own first), plus with ``wait`` the node it fits
        later that would finish it first, if that beats the best."""
        table, task = sim.table, sim.current
        heads = eft_heads(sim, excl)
        if not heads:
            return [self.base_pick(sim, excl)]
        first = self.base_pick(sim, excl)
        ranked = sorted((finish_key(sim, i, table.run_time(i, task)), i) for i in heads)
        cfg = self.config
        out, seen = [], set()
        pslot = sim.parent
        for i in [first] + [i for _, i in ranked if i != first]:
            sig = (table.speed(i, task.demands), table.memory_l[i], i == pslot)
            if sig not in seen:
                seen.add(sig)
                out.append(i)
                if len(out) == cfg.candidates:
                    break
        if cfg.wait:
            now, d = sim.t, task.demands
            best = finish_s(sim, out[0], table.run_time(out[0], task))
            best_s = -1
            for i in range(table.n):
                if (i in excl or not table.accept_l[i] or table.fits_now(i, d)
                        or not table.fits_total(i, d)):
                    continue
                fin = (table.earliest_fit(i, d, now) - now
                       + finish_s(sim, i, table.run_time(i, task)))
                if fin < best:
                    best, best_s = fin, i
            if best_s >= 0:
                out.append(best_s)
        return out

    def _plan(self, sim: Simulator, cands: list[int], defer_slot: int | None = None) -> int:
        """The candidate of the lowest rollout cost; :data:`DEFER` is rolled out as a wait on
        ``defer_slot`` that reserves nothing."""
        cfg = self.config
        t_end = sim.t + cfg.horizon_s
        objective = cfg.objective or sim.cfg.objective
        if self.fast and self._base is None and supported(sim, cfg.future):
            fast = Rollouts(sim, self._classes.get(sim), self._reserved, objective, self._views)
            if fast.ok:  # the forked rollouts' costs, exactly (policies.fast_rollout)
                costs = (fast.cost(defer_slot, t_end, reserve=False) if slot == DEFER
                         else fast.cost(slot, t_end) for slot in cands)
                return self._best(cands, costs)
        if sim.submission.hidden:  # a fork would run calls that do not exist yet
            raise ValueError(f"lookahead: under mdp.submission={sim.submission.mode!r} the "
                             f"rollouts see only the calls that exist, which only the fast "
                             f"rollouts model (policies/fast_rollout.py `supported`: a static "
                             f"order such as fifo or edf, runs as estimated, no hedging or "
                             f"node events); this setting needs forked rollouts")
        return self._best(cands, self._forked_costs(sim, cands, t_end, objective, defer_slot))

    def _best(self, cands: list[int], costs) -> int:
        """The candidate of the lowest cost (the earlier one on a tie within 1e-9)."""
        best_cost, best_slot = None, cands[0]
        for slot, cost in zip(cands, costs):
            self.stats["rollouts"] += 1
            if best_cost is None or cost < best_cost - 1e-9 * max(1.0, abs(best_cost)):
                best_cost, best_slot = cost, slot
        return best_slot

    def _forked_costs(self, sim: Simulator, cands: list[int], t_end: float, objective: str,
                      defer_slot: int | None = None):
        """Each candidate's cost from a rollout on a fork of the simulator (any setting)."""
        cfg = self.config
        lo = sim.unfinished_range()
        present = [tk.id for tk in sim.tasks[lo:] if tk.state != DONE]
        wf_ids = sorted({sim.tasks[i].wf.id for i in present})
        future = None
        if cfg.future == "sampled":
            future = (self._future[0].bit_generator.state, self._future[1].bit_generator.state)
            for g in self._future:
                g.bit_generator.advance(1 << 40)  # the next decision's streams
        task_id = sim.current.id
        for i, slot in enumerate(cands):
            f = sim.fork(self._pool[i])
            if cfg.future == "none":
                f.drop_arrivals()
            elif future is not None:
                f.arrivals.resample(future)
            res = dict(self._reserved)
            if slot == DEFER:
                slot = defer_slot
            elif not f.table.fits_now(slot, f.current.demands):
                res[task_id] = (slot, f.server_ids[slot])
            f.step(slot)
            self._rollout(f, res, t_end, [f.workflows[w] for w in wf_ids])
            yield _cost(f, present, t_end, objective)

    def _rollout(self, f: Simulator, res: dict, t_end: float, wfs: list) -> None:
        """Step fork ``f`` with the base rule (honouring reservations ``res``) until ``t_end``,
        the end of the episode, or the completion of every workflow in ``wfs``."""
        n = 0
        while f.current is not None and f.t < t_end:
            slot = _reserved_slot(f, res) if res else None
            if slot is None:
                slot = self.base_pick(f, _exclusions(f, res) if res else frozenset())
            f.step(slot)
            n += 1
            if not n & 7 and all(w.done == w.n for w in wfs):
                return


def _reserved_slot(sim: Simulator, reserved: dict) -> int | None:
    """The current task's reserved node while it is still usable (the reservation ends when
    the task starts there); None otherwise."""
    task = sim.current
    r = reserved.get(task.id)
    if r is None:
        return None
    slot, sid = r
    table = sim.table
    if sim.server_ids[slot] == sid and table.accept_l[slot] and table.fits_total(slot,
                                                                                task.demands):
        if table.fits_now(slot, task.demands):
            del reserved[task.id]
        return slot
    del reserved[task.id]
    return None


def _exclusions(sim: Simulator, reserved: dict) -> set:
    """Nodes reserved for other tasks that still wait for them (stale reservations dropped)."""
    if not reserved:
        return set()
    out = set()
    cur = sim.current.id
    for tid, (slot, sid) in list(reserved.items()):
        if sim.tasks[tid].state != READY or sim.server_ids[slot] != sid:
            del reserved[tid]
        elif tid != cur:
            out.add(slot)
    return out


def _cost(f: Simulator, present: list[int], t_end: float, objective: str) -> float:
    """``envs.objective.completion_cost`` of the present tasks' (estimated) completions: the
    finish time when done, the expected end when running, else the rollout's end plus the run
    time at the mean speed."""
    now = max(f.t, t_end)
    mc = f.mean_compute
    tasks, running = f.tasks, f.table.running

    def completions():
        for i in present:
            tk = tasks[i]
            st = tk.state
            yield tk.wf.id, (tk.finish if st == DONE else running[tk.slot].get(tk, f.t)
                             if st == RUNNING else now + tk.compute / mc)

    return completion_cost(objective, completions())


def make_lookahead(spec: str, env: EnvConfig | None = None, seed: int | None = None) -> Lookahead:
    """``--policy lookahead[:key=value,...]`` -> the planner."""
    return Lookahead(env, parse_spec(spec), seed)
