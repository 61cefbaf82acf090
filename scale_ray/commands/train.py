"""`scale-ray train`: train SCALE or a baseline from a YAML config (locally or inside `ray job submit`)."""

from __future__ import annotations

import argparse
import json

from scale_ray.config import parse_overrides
from scale_ray.train_config import load_train_config
from scale_ray.training import train


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="train config YAML, e.g. configs/train/scale.yaml")
    p.add_argument("--iterations", type=int, default=None,
                   help="training iterations (default: run.iterations of the config)")
    p.add_argument("--out", default=None, help="run directory (default: run.out_dir of the config)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in the run directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set ppo.minibatch_size=128 or "
                        "--set env.workload.horizon_s=100 (repeatable)")
    p.add_argument("--json", default=None, help="write the run summary to this JSON file")


def run(args: argparse.Namespace) -> int:
    if args.iterations is not None and args.iterations < 1:
        raise ValueError(f"--iterations: {args.iterations} must be >= 1")
    cfg, env = load_train_config(args.config, parse_overrides(args.set))
    out = args.out or cfg.run.out_dir
    summary = train(cfg, env, out, iterations=args.iterations, resume=args.resume)
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    return 0
