"""Probe: does a change to Ray default's twin explain why live Ray default is ~2 % slower?

Reruns the twin of every stored run that has the live cluster's tie order, under one of:
  queue=ready|random   waiting tasks keyed by ready time / at random, not oldest request first
  release=D            a finished run's resources seen D model s late (a stale resource view)
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
from envs.events import HEDGE
from policies.node_rules import RayHybrid
from scale_ray.bench.agents_cluster import CONFIG, requests
from scale_ray.relative import rel

E = node_sim._Episode
_ready, _end, _straggler = E.ready, E._end_run, E.straggler
MODE = {"queue": "fifo", "release": 0.0, "rng": np.random.default_rng(0)}


def ready(self, t):
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
    else:
        _straggler(self, token, t)


E.ready, E._end_run, E.straggler = ready, end_run, straggler


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
                k, v = m.split("=")
                MODE.update(queue="fifo", release=0.0, rng=np.random.default_rng(0))
                MODE[k] = float(v) if k == "release" else v
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
