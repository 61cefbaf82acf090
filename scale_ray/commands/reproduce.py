"""`scale-ray reproduce`: train every method at N=16 and produce the paper's tables and plots."""

from __future__ import annotations

import argparse
import os

from scale_ray.reproduce.budgets import BUDGETS, METHODS
from scale_ray.reproduce.pipeline import run as reproduce


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", choices=sorted(BUDGETS), default="quick",
                   help="quick: ~20 min on 2 cores; paper: the paper's 1000 iterations (hours); "
                        "smoke: a minutes-long check of the pipeline")
    p.add_argument("--out", default=None,
                   help="run directory (default: results/<budget>); running the same command "
                        "again resumes: finished trainings are skipped, unfinished ones continue "
                        "from their last checkpoint")
    p.add_argument("--methods", nargs="+", default=None, choices=[m.name for m in METHODS],
                   help="train and report only these methods")
    p.add_argument("--train-only", action="store_true",
                   help="train (or resume) and stop before the evaluation; several such processes "
                        "with different --methods may share --out (one trainer per run directory)")
    p.add_argument("--jobs", type=int, default=None,
                   help="trainings at once (default: 2 where there are 2+ CPUs, else 1): helper "
                        "processes take runs this one is not training; one training uses about "
                        "one core")
    p.add_argument("--skip-busy", action="store_true",
                   help="leave runs another process is training to it (what --jobs helpers do)")
    p.add_argument("--env-config", default=None,
                   help="the env config every run trains and is evaluated in (default: the "
                        "methods' train configs', configs/env/paper.yaml); e.g. "
                        "configs/env/paper_regime.yaml. Give it its own --out: a run directory "
                        "trained in another env is refused")
    p.add_argument("--sizes", nargs="+", type=int, default=None,
                   help="Table 4 sizes N (default: the budget's); e.g. leave out 1024 for a "
                        "shorter evaluation, and say so")


def run(args: argparse.Namespace) -> int:
    if args.sizes is not None:
        bad = [n for n in args.sizes if not 1 <= n <= 100_000]
        if bad:
            raise ValueError(f"--sizes: {bad[0]} is not in [1, 100000]")
    jobs = args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1)
    if args.skip_busy:
        if not args.train_only:
            raise ValueError("--skip-busy needs --train-only (a helper only trains)")
        jobs = min(jobs, 1)  # a helper never starts helpers of its own (run() checks >= 1)
    reproduce(args.budget, args.out or f"results/{args.budget}", methods=args.methods,
              sizes=args.sizes, train_only=args.train_only, jobs=jobs, skip_busy=args.skip_busy,
              env_config=args.env_config)
    return 0
