"""`scale-ray reproduce`: train every method at N=16 and produce the paper's tables and plots."""

from __future__ import annotations

import argparse

from scale_ray import reproduce


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", choices=sorted(reproduce.BUDGETS), default="quick",
                   help="quick: ~20 min on 2 cores; paper: the paper's 1000 iterations (hours); "
                        "smoke: a minutes-long check of the pipeline")
    p.add_argument("--out", default=None, help="run directory (default: results/<budget>)")
    p.add_argument("--methods", nargs="+", default=None, choices=[m.name for m in reproduce.METHODS],
                   help="train and report only these methods")


def run(args: argparse.Namespace) -> int:
    reproduce.run(args.budget, args.out or f"results/{args.budget}", methods=args.methods)
    return 0
