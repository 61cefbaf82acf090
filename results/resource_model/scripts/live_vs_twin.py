"""Each policy's live mean workflow response against its twin's, in %, over stored
`bench live --setting agents` JSON files (known speeds, no run noise; rules whose twin was
broken before a fix, such as `eft` here, show as outliers):

    python results/resource_model/scripts/live_vs_twin.py results/resource_model/bench_live_agents*.json \
        results/resource_model/ray_tie_order.json
"""
import json
import sys

import numpy as np

from scale_ray.relative import rel

rows: dict[str, list[float]] = {}
for f in sys.argv[1:]:
    d = json.load(open(f))
    if d.get("speeds", "known") != "known" or d.get("run_noise", 0):
        continue
    for run in d.get("runs", []):
        for name, live in run["live"].items():
            twin = run["twin"][name]["mean_workflow_response_model_s"]
            rows.setdefault(name, []).append(
                100 * (live["mean_workflow_response_model_s"] / twin - 1))
for name, v in rows.items():
    a = np.array(v)
    print(f"{name}: {len(a)} runs, live vs twin mean {rel(a.mean() / 100, 2)}, sd "
          f"{a.std(ddof=1):.2f} points")
