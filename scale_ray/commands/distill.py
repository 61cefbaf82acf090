"""`scale-ray distill`: train a student policy that imitates the lookahead planner (behaviour
cloning with DAgger, scale_ray/distill.py) and write it as a policy artifact."""

from __future__ import annotations

import argparse
import json
import logging

from scale_ray.config import parse_overrides, read_yaml
from scale_ray.distill import distill, load_distill_config

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None,
                   help="distill config YAML (e.g. configs/train/student.yaml); default: defaults")
    p.add_argument("--out", required=True, help="run directory: OUT/policy, OUT/progress.jsonl")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. --set rounds=2 (repeatable)")


def run(args: argparse.Namespace) -> int:
    data = dict(read_yaml(args.config) or {}) if args.config else {}
    data.update(parse_overrides(args.set))
    cfg = load_distill_config(data)
    path = distill(cfg, args.out)
    print(json.dumps({"artifact": str(path), "progress": f"{args.out}/progress.jsonl"}))
    return 0
