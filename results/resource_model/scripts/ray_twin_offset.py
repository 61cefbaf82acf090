"""Probe: does a change to Ray default's twin explain why live Ray default is ~2 % slower?

Reruns the twin of every stored run that has the live cluster's tie order, under each mode
given (several changes in one mode joined by commas: pin=0.2,queue=random):
  queue=ready|random   waiting tasks keyed by ready time / at random, not oldest request first
  release=D            a finished run's resources seen D model s late (a stale resource view)
  reuse=L              the owner's lease reuse (Ray's NormalTaskSubmitter::OnWorkerIdle): a run
                       that ends within L model s of its lease's grant hands its worker (node,
                       resources) to the oldest ready task of its scheduling class (the same
                       demands: every call is the same function), bypassing the raylet
                       (worker_lease_timeout_milliseconds 500 = 1.0 model s at time_scale 0.5)
  pin=D                a task that fits no node when it is ready waits at the node Ray's hybrid
                       policy spills it to (the best feasible node: score, then node-id order;
                       ClusterResourceScheduler::GetBestSchedulableNode queues it there) and
                       starts there when it fits; once another node has room for it, it moves
                       D model s later to a node with room then, if any (the busy raylet learns
                       of the room through the resource syncer, then rejects; inf: never)
  grant=class          a granted lease runs the oldest ready task of its scheduling class (the
                       owner's per-class FIFO), not the task the raylet's order asked for
and prints live vs twin in % per run and the mean and sd. Not part of the project's code: it
monkeypatches envs.node_sim for the experiment (results/resource_model/README.md).

    python results/resource_model/scripts/ray_twin_offset.py queue=fifo queue=ready \
        release=0.1 -- results/resource_model/ray_tie_order.json ...
"""
import json
import sys

import numpy as np

from envs import node_sim
from envs.agents import load_agents, node_specs
from envs.config_files import read_yaml, resolve_config_path
from envs.decision import DecisionCore
from envs.events import HEDGE
from policies.node_rules import RayHybrid
from scale_ray.bench.agents_cluster import CONFIG, requests
from scale_ray.relative import rel

E = node_sim._Episode
_ready, _end, _straggler = E.ready, E._end_run, E.straggler
_start, _finish = E.start, E.finish
_ask, _decisions, _round = E.ask, E.decisions, DecisionCore.round
MODE = {"queue": "fifo", "release": 0.0, "reuse": 0.0, "grant": "task", "pin": None,
        "rng": np.random.default_rng(0)}
HOME: dict = {}  # (episode, task id) -> the node its lease waits at (pin=D)
SEEN: dict = {}  # (episode, task id) -> when another node first had room for it
EPISODE: dict = {}  # id(core) -> its episode
READY_AT: dict = {}  # (episode, task id) -> when it became ready
LEASE: dict = {}  # (episode, task id) -> its lease's expiry (model s)


def oldest_same_class(ep, t):
    """The ready task of ``t``'s scheduling class that became ready first (None: none)."""
    best = None
    q = ep.core.queue
    for _, _, c in q.heap + q.deferred + q.blocked:
        if c is not t and c.state == node_sim.READY and c.demands == t.demands:
            if best is None or READY_AT[id(ep), c.id] < READY_AT[id(ep), best.id]:
                best = c
    return best


def ready(self, t):
    READY_AT[id(self), t.id] = self.now
    if MODE["queue"] == "fifo":
        return _ready(self, t)
    t.state = node_sim.READY
    t.key = (self.now if MODE["queue"] == "ready" else float(MODE["rng"].random()), t.id)
    self.core.queue.push(t.key, t.id, t)


def end_run(self, t, node, start, key, done):
    if MODE["release"] <= 0:
        return _end(self, t, node, start, key, done)
    self.table.finish = lambda k: None  # the release comes later, as a no-op HEDGE event
    try:
        _end(self, t, node, start, key, done)
    finally:
        del self.table.finish
    self.events.push(self.now + MODE["release"], HEDGE, node, (-1, key))


def straggler(self, token, t):
    if token == -1:
        self.table.finish(t)
    elif token == -2:
        pass  # a round at this instant (pin=D)
    else:
        _straggler(self, token, t)


def start(self, t, i):
    if MODE["grant"] == "class":  # the lease goes to its class's oldest ready task
        c = oldest_same_class(self, t)
        if c is not None and READY_AT[id(self), c.id] < READY_AT[id(self), t.id]:
            self.core.queue.push(t.key, t.id, t)  # t stays ready; c runs in its place
            t = c
    LEASE[id(self), t.id] = self.now + MODE["reuse"]
    _start(self, t, i)


def finish(self, run):
    t = run
    if (MODE["reuse"] > 0 and isinstance(t, node_sim.NodeTask) and t.state == node_sim.RUNNING
            and self.now <= LEASE[id(self), t.id]):
        c = oldest_same_class(self, t)  # before t's children are ready (its reply comes first)
        node, expiry = t.node, LEASE[id(self), t.id]
        _finish(self, t)
        if c is not None:
            _start(self, c, node)
            LEASE[id(self), c.id] = expiry
        return
    _finish(self, t)


def decisions(self, now_first=False):
    EPISODE[id(self.core)] = self
    return (yield from _decisions(self, now_first))


def spill_home(ep, t):
    """The node Ray's hybrid policy spills ``t`` to when no node has room: the lowest score
    (critical utilization, 0 below 0.5) then node-id order among the nodes it fits in total."""
    order = ep.policy._ids.get(id(ep.table)) or ep.policy.order
    feas = []
    for rank, i in enumerate(order):
        if ep.table.fits_total(i, t.demands):
            u = ep.table.utilization(i)
            feas.append((u if u >= 0.5 else 0.0, rank, i))
    feas.sort()
    k = max(1, int(ep.table.n * 0.2))
    return feas[int(ep.r_pol.integers(0, min(k, len(feas))))][2]


def core_round(self, start, waited=None):
    yield from _round(self, start, waited)
    ep = EPISODE.get(id(self))
    if ep is None or MODE["pin"] is None:
        return
    q = self.queue
    for _, _, t in q.heap + q.deferred + q.blocked:
        key = (id(ep), t.id)
        if t.state == node_sim.READY and key not in HOME and not any(
                ep.table.fits_now(i, t.demands) for i in range(ep.table.n)):
            HOME[key] = spill_home(ep, t)


def ask(self, t):
    key = (id(self), t.id)
    h = HOME.get(key)
    if MODE["pin"] is None or h is None:
        return _ask(self, t)
    if self.table.fits_now(h, t.demands):
        del HOME[key]
        return h
    if key not in SEEN:  # another node has room (the core asks only then): a round at +D
        SEEN[key] = self.now
        if MODE["pin"] < float("inf"):
            self.events.push(self.now + MODE["pin"], HEDGE, h, (-2, t))
    if self.now >= SEEN[key] + MODE["pin"]:
        del HOME[key]
        return _ask(self, t)
    return h  # it does not fit there now: a wait


E.ready, E._end_run, E.straggler, E.start, E.finish = ready, end_run, straggler, start, finish
E.decisions, E.ask, DecisionCore.round = decisions, ask, core_round


def main(modes, files):
    cfg = load_agents(read_yaml(resolve_config_path(CONFIG)))
    rows = []
    for f in files:
        d = json.load(open(f))
        nodes = node_specs(cfg, d["nodes"])
        for run in d["runs"]:
            if "ray_node_order" not in run:
                continue
            reqs = requests(cfg, nodes, d["workflows"], run["seed"], 0.0)
            live = run["live"]["ray-default"]["mean_workflow_response_model_s"]
            row = []
            for m in modes:
                MODE.update(queue="fifo", release=0.0, reuse=0.0, grant="task", pin=None,
                            rng=np.random.default_rng(0))
                for kv in m.split(","):  # several changes at once: reuse=1,grant=class
                    k, v = kv.split("=")
                    MODE[k] = float(v) if k in ("release", "reuse", "pin") else v
                twin = node_sim.NodeSimulator(cfg, nodes).run(
                    RayHybrid(order=run["ray_node_order"]), run["seed"], arrivals=reqs)
                row.append(100 * (live / twin["mean_workflow_response_s"] - 1))
            rows.append(row)
            print(f"{f} seed {run['seed']}: live {live:.2f}; live vs twin:",
                  ", ".join(f"{m} {rel(x / 100)}" for m, x in zip(modes, row)), flush=True)
    a = np.array(rows)
    for m, mean, sd in zip(modes, a.mean(0), a.std(0, ddof=1)):
        print(f"{m}: mean {rel(mean / 100, 2)}, sd {sd:.2f} points over {len(a)} runs")


if __name__ == "__main__":
    cut = sys.argv.index("--")
    main(sys.argv[1:cut], sys.argv[cut + 1:])
