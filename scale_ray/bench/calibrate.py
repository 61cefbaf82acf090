"""The twin of finished `bench live --trace-dir` runs again, with the run overhead each run
measured (what `bench live` now prints itself as `twin_calibrated`):

    python -m scale_ray.bench.calibrate results/live_twin/bench_live_realistic_seed0_warm.json ...
"""
from __future__ import annotations

import argparse
import json
import sys

from scale_ray.bench.live import arrivals
from scale_ray.bench.twin import METRICS, calibrated, format_calibrated, setting_env


def main(paths: list[str]) -> None:
    for path in paths:
        r = json.load(open(path))
        seed = r["seed"] if "seed" in r else int(path.split("_seed")[1].split("_")[0])
        env = setting_env(r.get("setting", "realistic"), r["servers"])
        args = argparse.Namespace(workflows=r["quality"]["workflows"], load=r.get("load"))
        specs, _, times = arrivals(env, args, seed)
        live = {row["policy"]: {k: row[f"live_{k}"] for k in METRICS} for row in r["twin"]}
        c = calibrated(env, argparse.Namespace(), live, specs, times, seed, r["why"])
        print(f"{path} (seed {seed}): plain twin max gap {r['max_twin_gap_points']:.1f} points")
        print("  " + format_calibrated(c))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    main(sys.argv[1:])
