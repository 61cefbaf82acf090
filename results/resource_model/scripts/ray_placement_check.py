"""Does the twin's `RayHybrid` pick the node live Ray picked, given the same cluster state? For
each Ray default task of a run dumped by ray_worker_starts.py (its rows JSON), in the order its
lease was asked for: the cluster's true state when it asked (every other task holding its
demands from its lease's grant to its end, from Ray's task events), `RayHybrid` in the cluster's
own tie order asked there, and its pick against the node Ray ran the task on. Then the GPU
calls whose lease waited (over 0.05 model s): on which node kind and of which GPU size they ran,
and how many were granted on their node before a call that had asked earlier and was still
waiting there (out of ask order). An experiment script (results/resource_model/README.md),
seconds:

    python results/resource_model/scripts/ray_placement_check.py rows.json
"""
import json
import sys
from collections import Counter

import numpy as np

from envs.nodes import NodeSpec, NodeTable
from policies.node_rules import RayHybrid, ray_node_order

TS = 0.5
KEYS = ("PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER", "FINISHED")


class Ask:
    def __init__(self, demands):
        self.demands = demands


def demands_of(req):
    return tuple(sorted((k, v / 1e9 if k == "memory" else v) for k, v in req.items()))


def main(path):
    d = json.load(open(path))
    specs = []
    for i, r in enumerate(d["nodes"]):
        acc = next((k.split(":", 1)[1] for k in r if k.startswith("accelerator_type:")), "")
        res = {"CPU": r["CPU"], "memory": r["memory"] / 1e9} | (
            {"GPU": r["GPU"]} if r.get("GPU") else {})
        specs.append(NodeSpec(f"n{i}", res, accelerator=acc))
    order = ray_node_order(d["ids"])
    kind = ["A100" if s.accelerator == "A100" else "A10G" if s.accelerator else "cpu"
            for s in specs]
    print("nodes in Ray's tie order:", [f"{i}:{kind[i]}" for i in order])
    runs = sorted((tuple(r["ts"][k] for k in KEYS), r["node"], demands_of(r["demands"]))
                  for r in d["runs"]["ray-default"] if all(k in r["ts"] for k in KEYS))
    rng = np.random.default_rng(0)
    tally = Counter()
    for (p, sub, f), node, dem in runs:
        table = NodeTable(specs)
        for j, ((p2, s2, f2), n2, d2) in enumerate(runs):
            if s2 <= p < f2 and (p2, s2) != (p, sub) and n2 >= 0:
                table.start(n2, j, d2, 0.0)
        pick = RayHybrid(order=order)(table, Ask(dem), 0.0, rng)
        waited = (sub - p) / 1e9 / TS > 0.05
        gpu = "GPU" if dict(dem).get("GPU") else "CPU"
        what = "no room" if pick < 0 else "same" if pick == node else \
            f"other {kind[pick]}->{kind[node]}" if kind[pick] != kind[node] else "other same-kind"
        tally[(gpu, "waited" if waited else "at once", what)] += 1
    for k, v in sorted(tally.items()):
        print(f"  {k[0]} task, lease {k[1]}: twin's pick {k[2]}: {v}")
    picks = Counter(kind[n] for _, n, dem in runs if dict(dem).get("GPU"))
    print("GPU tasks by node kind, live:", dict(picks))
    waited = [(p, sub, n, dict(dem)["GPU"]) for (p, sub, _), n, dem in runs
              if dict(dem).get("GPU") and (sub - p) / 1e9 / TS > 0.05]
    by = Counter((kind[n], g) for _, _, n, g in waited)
    print("GPU calls whose lease waited, by node kind and GPU size:",
          ", ".join(f"{k} {g:g}: {v}" for (k, g), v in sorted(by.items())))
    jumped = sum(1 for p, sub, n, _ in waited if any(
        p2 < p and sub2 > sub and n2 == n for p2, sub2, n2, _ in waited))
    print(f"  granted before an earlier-asked call still waiting on the same node: "
          f"{jumped} of {len(waited)}")


if __name__ == "__main__":
    main(sys.argv[1])
