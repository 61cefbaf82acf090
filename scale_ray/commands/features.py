"""`scale-ray features`: statistics of the attention feature z on fixed-seed episodes (paper
Table 5): mean |off-diagonal covariance| and mean per-dimension KL to N(0, 1), at each cluster size;
the mean |off-diagonal correlation| and the pointer's calibration (pick probability, normalised
entropy) with them.

The policy acts greedily; z is recorded at every decision (all decisions of ``--episodes``
episodes, the same seeds as ``scale-ray eval``), then the statistics are taken over that batch
(:mod:`scale_ray.features`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scale_ray.config import load_env
from scale_ray.features import feature_table, plot_shift


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None,
                   help="policy artifact directory or shipped name (required unless --plot)")
    p.add_argument("--servers", nargs="+", type=int, default=[16, 32, 48], help="cluster sizes N")
    p.add_argument("--episodes", type=int, default=3, help="episodes per size")
    p.add_argument("--seed", type=int, default=0, help="base seed of the fixed episode set")
    p.add_argument("--env-config", default=None, help="environment YAML (default: paper.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an env key (repeatable)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    p.add_argument("--plot", nargs="+", default=None, metavar=("OUT.png", "JSON"),
                   help="instead: plot earlier --json files against N (one line per file name "
                        "without its _s<seed> part, seeds averaged) into OUT.png")


def run(args: argparse.Namespace) -> int:
    if args.plot is not None:
        if len(args.plot) < 2:
            raise ValueError("--plot: give OUT.png and at least one --json file of this command")
        avg = plot_shift(args.plot[1:], args.plot[0])
        print(f"wrote {args.plot[0]}: {', '.join(avg)}")
        return 0
    if args.policy is None:
        raise ValueError("--policy: required (a trained artifact), unless --plot")
    for n in args.servers:
        if n < 1:
            raise ValueError(f"--servers: {n} must be >= 1")
    if args.episodes < 1:
        raise ValueError(f"--episodes: {args.episodes} must be >= 1")
    env = load_env(args.env_config, args.set)
    rows = feature_table(args.policy, env, args.servers, args.episodes, args.seed)
    print(f"{'N':>6} {'decisions':>10} {'mean|offdiag cov|':>18} {'mean KL':>10} {'mean var':>9} "
          f"{'mean|corr|':>10} {'p(pick)':>8} {'H/logn':>7} {'valid':>7}")
    for r in rows:
        print(f"{r['servers']:>6} {r['decisions']:>10} {r['mean_abs_offdiag_cov']:>18.4f} "
              f"{r['mean_kl']:>10.4f} {r['mean_var']:>9.4f} {r['mean_abs_corr']:>10.4f} "
              f"{r['mean_pick_prob']:>8.3f} {r['mean_entropy_norm']:>7.3f} "
              f"{r['mean_valid_servers']:>7.1f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"policy": args.policy, "episodes": args.episodes,
                                               "seed": args.seed, "results": rows}, indent=2))
    return 0
