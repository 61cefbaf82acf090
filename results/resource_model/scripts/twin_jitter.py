"""How much the twin itself moves when run times move a little: each policy's twin on the
agents bench's requests (8 nodes, 120 requests, seeds 1-2) again under run noise of log-spread
0.005 and 0.02 (10 noise draws each), against the twin without noise. A floor under any
live-vs-twin comparison: live runs never take exactly their emulated time. Experiment script
(results/resource_model/README.md), ~3 min:

    python results/resource_model/scripts/twin_jitter.py
"""
import numpy as np

from envs import node_sim
from envs.agents import load_agents, node_specs
from envs.config import replace
from envs.config_files import read_yaml, resolve_config_path
from policies.node_learned import node_decider
from policies.node_rules import RayHybrid
from scale_ray.bench.agents_cluster import CONFIG, requests
from scale_ray.relative import rel

cfg0 = load_agents(read_yaml(resolve_config_path(CONFIG)))
nodes = node_specs(cfg0, 8)
order = list(range(len(nodes)))  # one fixed tie order for Ray default
for seed in (1, 2):
    reqs = requests(cfg0, nodes, 120, seed, 0.0)
    for name in ("ray", "eft_spread", "lookahead"):
        def policy():
            return RayHybrid(order=order) if name == "ray" else node_decider(name)

        base = node_sim.NodeSimulator(cfg0, nodes).run(policy(), seed, arrivals=reqs)
        base = base["mean_workflow_response_s"]
        for noise in (0.005, 0.02):
            cfg = replace(cfg0, run_noise=noise)
            means = [node_sim.NodeSimulator(cfg, nodes).run(
                policy(), seed + 1000 * j, arrivals=reqs)["mean_workflow_response_s"]
                for j in range(1, 11)]
            d = np.array(means) / base - 1
            print(f"seed {seed} {name:10s} noise {noise}: twin {base:.2f}; with noise "
                  f"{rel(d.mean(), 2)} on average, sd {100 * d.std(ddof=1):.2f} points, "
                  f"range {rel(d.min())} .. {rel(d.max())}", flush=True)
