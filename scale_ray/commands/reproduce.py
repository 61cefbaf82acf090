"""`scale-ray reproduce`: train every method at N=16 and produce the paper's tables and plots."""

from __future__ import annotations

import argparse

from scale_ray import reproduce


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", choices=sorted(reproduce.BUDGETS), default="quick",
                   help="quick: ~20 min on 2 cores; paper: the paper's 1000 iterations (hours); "
                        "smoke: a minutes-long check of the pipeline")
    p.add_argument("--out", default=None,
                   help="run directory (default: results/<budget>); running the same command "
                        "again resumes: finished trainings are skipped, unfinished ones continue "
                        "from their last checkpoint")
    p.add_argument("--methods", nargs="+", default=None, choices=[m.name for m in reproduce.METHODS],
                   help="train and report only these methods")
    p.add_argument("--train-only", action="store_true",
                   help="train (or resume) and stop before the evaluation; several such processes "
                        "with different --methods may share --out (one trainer per run directory)")
    p.add_argument("--sizes", nargs="+", type=int, default=None,
                   help="Table 4 sizes N (default: the budget's); e.g. leave out 1024 for a "
                        "shorter evaluation, and say so")


def run(args: argparse.Namespace) -> int:
    if args.sizes is not None:
        bad = [n for n in args.sizes if not 1 <= n <= 100_000]
        if bad:
            raise ValueError(f"--sizes: {bad[0]} is not in [1, 100000]")
    reproduce.run(args.budget, args.out or f"results/{args.budget}", methods=args.methods,
                  sizes=args.sizes, train_only=args.train_only)
    return 0
