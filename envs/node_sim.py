"""Discrete-event simulator of agent requests on nodes in Ray's resource model (``envs.nodes``):
the decision core (``envs.decision.DecisionCore`` over a :class:`envs.nodes.NodeTable`) places
ready tasks; a node runs every task whose demands fit its free resources.

Semantics: requests arrive as a Poisson process (the rate that gives ``gpu_load``, see
:func:`arrival_rate`) until ``horizon_s``; the run continues until every request finished. A
task is ready when its parents finished (no transfer time: agent calls pass small messages). At
every instant where something happened (an arrival, a task's end) one placement round runs:
ready tasks in the configured order (``envs.order.Order``; ``fifo``: the oldest request first,
then the longest hop path; ``upward_rank``: HEFT's; ``edf``, ``srpt``, ``las`` on run times at
each kind's mean node speed), each placed where the policy picks; a task no node can
start now waits without asking (``ask_only_startable``), a pick that does not fit now is a
wait (the policy chose to wait for a node), neither blocks the tasks behind it.

Learned speeds (``learn_speeds``): the node rules plan as the live scheduler does with no speed
configured and ``live.estimator: online``: every node's speed is 1 to them, and the run-time
estimator (``envs.estimator``) learns each kind's run per node shape from the runs that finished;
the runs themselves take compute / the node's true speed.

Randomness: arrivals, requests, the policy's own draws and the runs' noise come from separate
generators spawned from one seed, so every policy sees the same requests (paired comparisons).
Runs that take other than planned, and hedged copies of stragglers: ``envs.node_hedging``.

A learned policy steps an episode through :meth:`NodeSimulator.episode` (``.decisions()``, a
generator over the decision core's :meth:`~envs.decision.DecisionCore.round`): the gym env
``envs.node_env``. A planner (a policy with a ``plan(episode, task)`` method,
``policies.node_lookahead``) is asked with the episode itself and tries its candidates on
:meth:`_Episode.fork`: the present work (no new arrivals), the running tasks ending when they are
expected to, runs taking what the rules plan with (``NodeTable.run_time``). The slot-model
:class:`envs.simulator.Simulator` is the paper's model.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Generator, Sequence

import numpy as np

from . import order as orders
from .agents import AgentsConfig, expected_gpu_seconds, node_specs, sample_request
from .decision import DONE, NODE_LOOK, READY, RUNNING, WAITING, DecisionCore, Rules
from .estimator import RuntimeEstimator
from .events import ARRIVAL, FINISH, HEDGE, EventQueue
from .node_hedging import Copy, NodeRuns
from .nodes import NodeSpec, NodeTable
from .runtime import kind_of_name

__all__ = ["NodeTask", "NodeSimulator", "Present", "Request", "arrival_rate", "Policy"]

# (table, task, now, rng) -> node index (a pick that does not fit now is a wait)
Policy = Callable[[NodeTable, "NodeTask", float, np.random.Generator], int]


class NodeTask:
    """A task of a request in the decision core's terms (state, key, demands, waits)."""
    __slots__ = ("id", "wf", "idx", "name", "kind", "demands", "compute", "memory_gb",
                 "children", "parents_left", "state", "key", "waits", "rank", "work", "start",
                 "finish", "node", "token", "copy", "factors")

    def __init__(self, tid: int, wf: "Request", idx: int, name: str, demands: tuple,
                 compute: float, kind: str = ""):
        self.id, self.wf, self.idx, self.name, self.kind = tid, wf, idx, name, kind
        self.demands, self.compute = demands, compute
        self.memory_gb = dict(demands).get("memory", 0.0)
        self.children: list[NodeTask] = []
        self.parents_left = 0
        self.state = WAITING
        self.key: tuple = ()
        self.waits = 0
        self.rank = 0
        self.work = 0.0  # seconds at its kind's mean node speed (the order's work estimate)
        self.start = self.finish = math.nan
        self.node = -1
        self.token = 0  # runs started (a straggler's HEDGE event names the run it was for)
        self.copy: Copy | None = None  # its backup run (envs.node_hedging)
        self.factors: tuple[float, float] | None = None  # its runs' given factors (AgentTask)


class Request:
    __slots__ = ("id", "arrival", "tasks", "done", "finish", "level")

    def __init__(self, rid: int, arrival: float):
        self.id, self.arrival = rid, arrival
        self.tasks: list[NodeTask] = []
        self.done = 0
        self.finish = math.nan
        self.level = 0.0  # its order level (envs.order: deadline, work left, attained service)


def arrival_rate(cfg: AgentsConfig, nodes: Sequence[NodeSpec], seed: int = 12345) -> float:
    """Requests per second that offer ``cfg.gpu_load``: load x the cluster's GPU capacity (GPUs
    x their speed) / the expected GPU-seconds of a request on a speed-1 GPU."""
    cap = sum(float(nd.resources.get("GPU", 0.0)) * nd.gpu_speed for nd in nodes)
    if cap <= 0:
        raise ValueError("the cluster has no GPU: gpu_load cannot set an arrival rate")
    return cfg.gpu_load * cap / expected_gpu_seconds(cfg, np.random.default_rng(seed))


class NodeSimulator:
    """One episode per :meth:`run` of ``cfg``'s workload on ``nodes`` (module docstring)."""

    def __init__(self, cfg: AgentsConfig, nodes: Sequence[NodeSpec] | int,
                 rate: float | None = None, learn_speeds: bool = False,
                 node_look: int = NODE_LOOK):
        self.cfg = cfg
        self.learn_speeds = learn_speeds
        self.node_look = node_look  # DecisionCore.node_look (0: a round looks at every task)
        self.nodes = node_specs(cfg, nodes) if isinstance(nodes, int) else list(nodes)
        self.rate = rate if rate is not None else arrival_rate(cfg, self.nodes)
        gpu = [nd.gpu_speed for nd in self.nodes if nd.resources.get("GPU")]
        self._gpu_mean = sum(gpu) / len(gpu) if gpu else 1.0
        self._cpu_mean = sum(nd.cpu_speed for nd in self.nodes) / len(self.nodes)
        self._gpu_max = max(gpu, default=1.0)
        self._cpu_max = max(nd.cpu_speed for nd in self.nodes)
        #: the ready-task order (envs.order), in seconds at each kind's mean node speed
        self.order = orders.Order(cfg.order, cfg.edf_factor)
        table = NodeTable(self.nodes)
        for t in (cfg.llm, cfg.tool):  # every call the workload can make fits some node
            for g in t.gpu:
                d = {"CPU": max(t.cpu), "memory": t.memory_gb[1]} | ({"GPU": g} if g else {})
                why = table.missing(tuple(sorted(d.items())))
                if why is not None:
                    raise ValueError(f"the workload asks for {why}: no node of the cluster "
                                     f"could ever run it")

    def run(self, policy: Policy, seed: int, arrivals: Sequence[tuple[float, list]] | None = None
            ) -> dict[str, Any]:
        """One episode under ``policy``; its metrics. ``arrivals``: explicit ``(time, tasks)``
        requests (``envs.agents.AgentTask`` lists) instead of the Poisson process."""
        return _Episode(self, policy, seed, arrivals).run()

    def episode(self, seed: int, arrivals: Sequence[tuple[float, list]] | None = None
                ) -> "_Episode":
        """One episode to step by hand (``.decisions()``; ``.table``, ``.now``, ``.area``):
        the gym env's (``envs.node_env``). Its policy's own draws use ``.r_pol``."""
        return _Episode(self, None, seed, arrivals)

    def _admit(self, spec: list, now: float, requests: list, tasks: list,
               ready: Callable[[NodeTask], None]) -> None:
        wf = Request(len(requests), now)
        requests.append(wf)
        kids: list[list[int]] = [[] for _ in spec]
        for i, s in enumerate(spec):
            for p in s.parents:
                kids[p].append(i)
        gpu = ["GPU" in dict(s.demands) for s in spec]
        # seconds at the kind's mean node speed (HEFT's upward rank, srpt's work) and at its
        # fastest (edf's critical-path bound)
        work = [s.compute / (self._gpu_mean if g else self._cpu_mean) for s, g in zip(spec, gpu)]
        order = self.order
        ranks = order.ranks(work, [0.0] * len(spec), kids, 1.0, math.inf, 0.0)
        fastest = [s.compute / (self._gpu_max if g else self._cpu_max) for s, g in zip(spec, gpu)]
        wf.level = order.level(now, fastest if order.name == "edf" else work, [0.0] * len(spec),
                               [s.parents for s in spec], ((1.0, math.inf),), 1.0)
        for i, s in enumerate(spec):
            t = NodeTask(len(tasks), wf, i, s.name, s.demands, s.compute, kind_of_name(s.name))
            t.factors = s.factors
            t.rank = ranks[i]
            t.work = work[i]
            t.parents_left = len(s.parents)
            tasks.append(t)
            wf.tasks.append(t)
        for i, s in enumerate(spec):
            for p in s.parents:
                wf.tasks[p].children.append(wf.tasks[i])
        for t in wf.tasks:
            if t.parents_left == 0:
                ready(t)

class _Episode:
    """One :meth:`NodeSimulator.run`: the node table and the decision core over it, the event
    queue, the requests and tasks so far, and what happens at each event."""

    def __init__(self, sim: NodeSimulator, policy: Policy | None, seed: int,
                 arrivals: Sequence[tuple[float, list]] | None):
        self.sim, self.policy, self.cfg = sim, policy, sim.cfg
        arr_ss, wl_ss, pol_ss, run_ss = np.random.SeedSequence(seed).spawn(4)
        self.r_arr, self.r_wl = np.random.default_rng(arr_ss), np.random.default_rng(wl_ss)
        self.r_pol = np.random.default_rng(pol_ss)
        self.runs = NodeRuns(sim.cfg.run_noise, sim.cfg.hedge_quantile,
                             np.random.default_rng(run_ss))
        self.table = table = NodeTable(sim.nodes)
        self.est = est = RuntimeEstimator() if sim.learn_speeds else None
        self.shapes = shapes = [nd.name for nd in sim.nodes]
        if est is not None:  # speed 1 everywhere to the rules, then what the estimator learned
            table.estimate = lambda t, i, _run: est.duration(t.kind, shapes[i],
                                                             t.compute)
        self.core = DecisionCore(table, Rules(head_of_line_blocking=False,
                                              ask_only_startable=True, mask_infeasible=True))
        self.core.node_look = sim.node_look
        self.events = EventQueue()
        self.scripted = arrivals is not None
        if arrivals is None:
            self.events.push(float(self.r_arr.exponential(1.0 / sim.rate)), ARRIVAL, None, None)
            self.explicit: list = []
        else:
            self.explicit = sorted(arrivals, key=lambda a: a[0])[::-1]
            if self.explicit:
                self.events.push(self.explicit[-1][0], ARRIVAL, None, None)
        self.requests: list[Request] = []
        self.tasks: list[NodeTask] = []
        self.order = sim.order
        self.now = 0.0
        self.busy = {"cpu": 0.0, "gpu": 0.0}
        self.open = 0  # requests arrived and not finished
        self.area = 0.0  # the integral of ``open`` over time so far (request-seconds)

    def run(self, now_first: bool = False) -> dict[str, Any]:
        """The whole episode under the policy (``now_first``: :meth:`decisions`'); its
        metrics."""
        steps = self.decisions(now_first)
        try:
            task = next(steps)
            while True:
                task = steps.send(self.ask(task))
        except StopIteration as done:
            return done.value

    def decisions(self, now_first: bool = False) -> Generator[NodeTask, int, dict[str, Any]]:
        """The episode as a generator (a gym env steps it, ``envs.node_env``): yields each task
        to place, is sent the node index picked, returns the metrics. ``now_first``: a round at
        the present instant before the next event (a fork's rollout)."""
        events, core = self.events, self.core
        if now_first:
            yield from core.round(self.start)
        while events:
            now, kind, _, _, t = events.pop()
            self.area += (now - self.now) * self.open
            self.now = now
            if kind == ARRIVAL:
                self.arrive()
            elif kind == FINISH:
                self.finish(t)
            else:  # HEDGE: (token, task)
                self.straggler(*t)
            if events and events.peek() == now:
                continue  # every event of this instant first
            yield from core.round(self.start)
            if self.runs.due:  # after the round: copies where a node still has room
                self.launch_copies()
        left = sum(1 for t in self.tasks if t.state != DONE)
        if left:
            raise RuntimeError(f"{left} tasks never ran (a bug: every task fits some node)")
        return _metrics(self.requests, self.tasks, self.now, self.busy, self.table.nodes,
                        core) | self.runs.metrics()

    def _end_run(self, t: NodeTask, node: int, start: float, key: Any, done: bool) -> None:
        """A run of ``t`` on ``node`` since ``start`` ends (``done``) or is cancelled: its
        resources are free; its time is counted busy (a cancelled one also as waste)."""
        self.table.finish(key)
        d, ran = dict(t.demands), self.now - start
        self.busy["gpu"] += ran * d.get("GPU", 0.0)
        self.busy["cpu"] += ran * d.get("CPU", 0.0)
        if not done:
            self.runs.waste_s += ran
            if isinstance(key, Copy):
                key.cancelled = True

    def ready(self, t: NodeTask) -> None:
        t.state = READY
        t.key = self.order.key(t.rank, t.wf.arrival, t.wf.id, t.wf.level)
        self.core.queue.push(t.key, t.id, t)

    def ask(self, t: NodeTask) -> int:
        plan = getattr(self.policy, "plan", None)
        if plan is not None:  # a planner: it reads the episode (module docstring)
            return plan(self, t)
        return self.policy(self.table, t, self.now, self.r_pol)

    def fork(self, policy: Policy) -> "_Fork":
        """The present as an independent episode decided by ``policy`` (module docstring):
        copies of the unfinished requests and their tasks, the node table, the ready queue and
        the running tasks' ends; no arrivals, no learning. ``_Fork.task(t)``: the copy of
        ``t``."""
        return _Fork(self, policy)

    def start(self, t: NodeTask, i: int) -> None:
        now, runs = self.now, self.runs
        planned = t.compute / self.table.speed(i, t.demands)
        t.state, t.start, t.node = RUNNING, now, i
        t.token += 1
        self.table.start(i, t, t.demands, now + planned)
        given = t.factors[0] if t.factors is not None else None
        self.events.push(now + planned * runs.factor(given), FINISH, i, t)
        if runs.hedging:
            self.events.push(now + planned * runs.due_factor, HEDGE, i, (t.token, t))

    def straggler(self, token: int, t: NodeTask) -> None:
        """``t``'s run passed its hedge quantile: a copy now, or once a node has room."""
        if t.state == RUNNING and t.token == token and t.copy is None:
            self.runs.due.append(t)
            self.launch_copies()

    def launch_copies(self) -> None:
        """Copies of the due stragglers on the fastest other node where each fits now."""
        table, runs, keep = self.table, self.runs, []
        for t in runs.due:
            if t.state != RUNNING or t.copy is not None:
                continue
            fits = [i for i in table.fitting(t.demands) if i != t.node]
            if not fits:
                keep.append(t)
                continue
            i = max(fits, key=lambda j: (table.speed(j, t.demands), -j))
            c = t.copy = Copy(t, i, self.now)
            planned = t.compute / table.speed(i, t.demands)
            table.start(i, c, t.demands, self.now + planned)
            given = t.factors[1] if t.factors is not None else None
            self.events.push(self.now + planned * runs.factor(given), FINISH, i, c)
            runs.copies += 1
        runs.due = keep

    def arrive(self) -> None:
        now, events = self.now, self.events
        if not self.scripted:
            spec = sample_request(self.cfg, self.r_wl)
            nxt = now + float(self.r_arr.exponential(1.0 / self.sim.rate))
            if nxt < self.cfg.horizon_s:
                events.push(nxt, ARRIVAL, None, None)
        else:
            spec = self.explicit.pop()[1]
            if self.explicit:
                events.push(self.explicit[-1][0], ARRIVAL, None, None)
        self.sim._admit(spec, now, self.requests, self.tasks, self.ready)
        self.open += 1

    def finish(self, run: NodeTask | Copy) -> None:
        """A run ended: its task is done (a hedged task's other run is cancelled)."""
        now = self.now
        if isinstance(run, Copy):
            if run.cancelled:
                return
            t = run.task
            self.runs.wins += 1
            self._end_run(t, run.node, run.start, run, done=True)
            self._end_run(t, t.node, t.start, t, done=False)
            t.node, t.start = run.node, run.start  # (the copy's run is the task's now)
        else:
            t = run
            if t.state == DONE:
                return  # its copy ended first: this run was cancelled then
            self._end_run(t, t.node, t.start, t, done=True)
            if t.copy is not None:
                self._end_run(t, t.copy.node, t.copy.start, t.copy, done=False)
        if self.est is not None:  # the run it took against its run at speed 1
            self.est.observe(t.kind, self.shapes[t.node], now - t.start, t.compute)
        t.state, t.finish = DONE, now
        wf, order = t.wf, self.order
        wf.done += 1
        if wf.done == len(wf.tasks):
            wf.finish = now
            self.open -= 1
        elif order.dynamic:  # srpt / las: the request's level moves; re-key its ready tasks
            wf.level = order.finished(wf.level, t.work, now - t.start, 1.0)
            for tk in wf.tasks:
                if tk.state == READY:
                    self.ready(tk)
        for c in t.children:
            c.parents_left -= 1
            if c.parents_left == 0:
                self.ready(c)


class _Fork(_Episode):
    """:meth:`_Episode.fork`'s episode: the present work only, planned run times (no noise, no
    new copies; a hedged task's two runs both go on, the first to end as planned wins)."""

    def __init__(self, ep: _Episode, policy: Policy):  # noqa: D107 - (not _Episode's)
        self.sim, self.policy, self.cfg, self.order = ep.sim, policy, ep.cfg, ep.order
        self.r_pol = np.random.default_rng(0)  # (the rollout policy's draws, if any)
        self.est, self.shapes, self.scripted, self.explicit = None, ep.shapes, True, []
        self.now, self.busy, self.area = ep.now, {"cpu": 0.0, "gpu": 0.0}, 0.0
        self.runs = NodeRuns(0.0, 0.0, None)
        copies: dict[Any, Any] = {}
        self.requests = []
        for w in ep.requests:
            if w.done == len(w.tasks):
                continue
            wc = Request(w.id, w.arrival)
            wc.done, wc.level = w.done, w.level
            for t in w.tasks:
                c = copies[t] = NodeTask(t.id, wc, t.idx, t.name, t.demands, t.compute, t.kind)
                c.parents_left, c.state, c.key, c.waits = t.parents_left, t.state, t.key, t.waits
                c.rank, c.work, c.start, c.node = t.rank, t.work, t.start, t.node
                wc.tasks.append(c)
            for t in w.tasks:
                copies[t].children = [copies[k] for k in t.children]
            self.requests.append(wc)
        self.open = len(self.requests)
        self.tasks = list(copies.values())
        for t in ep.tasks:  # running backup copies (envs.node_hedging), as the task's
            if t.copy is not None and t.state != DONE and not t.copy.cancelled:
                c = copies[t.copy] = Copy(copies[t], t.copy.node, t.copy.start)
                copies[t].copy = c
        self._copies = copies
        self.table = ep.table.copy(lambda t, _i: copies[t])
        self.core = DecisionCore(self.table, ep.core.rules)
        self.core.node_look = ep.core.node_look
        self.core.queue = ep.core.queue.copy(lambda t: copies.get(t, t))  # (finished: stale)
        self.events = EventQueue()
        for i, running in enumerate(self.table.running):
            for t, end in running.items():  # when they are expected to end
                self.events.push(max(end, self.now), FINISH, i, t)

    def task(self, t: NodeTask) -> NodeTask:
        return self._copies[t]

    def start(self, t: NodeTask, i: int) -> None:
        run_s = self.table.run_time(i, t)  # what the rules plan with (no hidden truth)
        t.state, t.start, t.node = RUNNING, self.now, i
        self.table.start(i, t, t.demands, self.now + run_s)
        self.events.push(self.now + run_s, FINISH, i, t)


class Present:
    """Another driver's present as an episode a planner forks (``policies.node_lookahead``:
    ``plan(present, task)``; the live scheduler's, ``scale_ray.live.node_planning``).

    ``requests``: the unfinished requests with every task (``NodeTask``: state, parents left,
    rank, key, work; a running one its node and start); ``table``: the node table whose running
    keys are those tasks (a hedged task's other run a ``Copy`` in ``task.copy``); ``queue``: a
    ``ReadyQueue`` of the ready ones under ``order``'s keys; ``rules`` and ``node_look``: the
    driver's core's; ``now`` in the table's clock. Forks run as :meth:`_Episode.fork`'s."""

    def __init__(self, table: NodeTable, requests: list[Request], queue: Any, rules: Rules,
                 node_look: int, order: orders.Order, now: float):
        self.table, self.requests, self.order, self.now = table, requests, order, now
        self.tasks = [t for w in requests for t in w.tasks]
        self.open = len(requests)  # (a planner's bound on its cost)
        self.core = DecisionCore(table, rules)
        self.core.node_look, self.core.queue = node_look, queue
        self.sim = self.cfg = None
        self.shapes: list[str] = []
        self.r_pol = np.random.default_rng(0)

    def fork(self, policy: Policy) -> "_Fork":
        return _Fork(self, policy)


def _metrics(requests: list[Request], tasks: list[NodeTask], end: float, busy: dict,
             nodes: Sequence[NodeSpec], core: DecisionCore) -> dict[str, Any]:
    wresp = np.array([w.finish - w.arrival for w in requests]) if requests else np.zeros(0)
    tresp = np.array([t.finish - t.wf.arrival for t in tasks]) if tasks else np.zeros(0)
    gpus = sum(float(nd.resources.get("GPU", 0.0)) for nd in nodes)
    cpus = sum(float(nd.resources.get("CPU", 0.0)) for nd in nodes)
    pct = (lambda a, q: float(np.percentile(a, q)) if a.size else math.nan)
    return {
        "workflows": len(requests),
        "tasks": len(tasks),
        "mean_workflow_response_s": float(wresp.mean()) if wresp.size else math.nan,
        "p95_workflow_response_s": pct(wresp, 95),
        "p99_workflow_response_s": pct(wresp, 99),
        "mean_task_response_s": float(tresp.mean()) if tresp.size else math.nan,
        "gpu_utilization": busy["gpu"] / (gpus * end) if gpus and end else 0.0,
        "cpu_utilization": busy["cpu"] / (cpus * end) if cpus and end else 0.0,
        "makespan_s": end,
        "decisions": core.decisions,
        "waits": core.waits,
        "look_stops": core.look_stops,  # rounds NODE_LOOK ended early (DecisionCore.node_look)
    }
