"""`scale-ray` command line. Each subcommand lives in its own module exposing
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when used."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from envs.config import ConfigError

# name -> (module, one-line help). Later issues add entries here.
COMMANDS: dict[str, tuple[str, str]] = {
    "eval": ("scale_ray.commands.eval", "evaluate policies on fixed-seed episodes"),
    "run-workflows": ("scale_ray.commands.run_workflows", "stream workflows through the live scheduler on a Ray cluster"),
    "workloads": ("scale_ray.commands.workloads", "real-DAG workload families: list, shape statistics"),
    "train": ("scale_ray.commands.train", "train SCALE or a baseline with RLlib"),
    "distill": ("scale_ray.commands.distill", "train a student that imitates the lookahead planner (BC + DAgger)"),
    "features": ("scale_ray.commands.features", "statistics of the attention feature z (Table 5)"),
    "reproduce": ("scale_ray.commands.reproduce", "train all methods and write the paper's tables"),
    "gantt": ("scale_ray.commands.gantt", "draw a simulator or live trace as a Gantt chart (PNG)"),
    "explain": ("scale_ray.commands.explain", "where a trace's workflow response time goes"),
    "cluster": ("scale_ray.commands.cluster", "a local heterogeneous Ray cluster to try the service: up, down, status"),
}
BENCH: dict[str, tuple[str, str]] = {
    "env": ("scale_ray.bench.env", "environment steps per second vs CartPole"),
    "train": ("scale_ray.bench.train", "RLlib sampling and iteration time vs CartPole"),
    "serve": ("scale_ray.bench.serve", "placement service latency/throughput over HTTP vs in process"),
    "live": ("scale_ray.bench.live", "live scheduler overhead vs plain Ray, and placement quality"),
    "service": ("scale_ray.bench.service", "the scheduler service shared by agent processes vs Ray default"),
    "lookahead": ("scale_ray.bench.lookahead", "cost of one decision of the lookahead planner"),
    "backlog": ("scale_ray.bench.backlog", "cost of a placement round with no free server vs the ready backlog"),
    "headroom": ("scale_ray.bench.headroom", "node rules vs EFT and Ray's default in Ray's resource model (agents.yaml)"),
    "runtime": ("scale_ray.bench.runtime", "what noisy, undeclared run times cost; hints, estimator and hedging"),
    "programs": ("scale_ray.bench.programs", "program-aware scheduling vs the same calls submitted one by one"),
    "autoscale": ("scale_ray.bench.autoscale", "cluster sizing against a latency SLO: cost and attainment vs Ray's autoscaler"),
    "autoscale-rl": ("scale_ray.bench.autoscale_rl", "a learned sizer (RLlib PPO) vs ours on held-out seeds"),
}


#: what ``scale-ray --help`` says first
DESCRIPTION = ("SCALE on Ray: place agentic workflow DAGs on a heterogeneous Ray cluster; "
               "evaluate, train and benchmark the placement policies (README.md, docs/).")
EPILOG = "Each command has --help: scale-ray COMMAND --help, scale-ray bench WHAT --help."
#: loggers that report every request at INFO (httpx: one line per HTTP call, e.g. each metrics
#: scrape of `bench service`); shown with --verbose only
CHATTY_LOGGERS = ("httpx", "httpcore")


class HelpFormatter(argparse.HelpFormatter):
    """Help that ends each option with its default, unless its text already names one or it
    has none (a flag, an option without a default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or default is None
                or default is argparse.SUPPRESS or isinstance(default, bool) or default == []):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def configure_logging(verbose: bool) -> None:
    """INFO (``verbose``: DEBUG) on stderr; the per-request INFO lines of HTTP clients only with
    ``verbose``."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def _lazy(parser: argparse.ArgumentParser, module: str) -> None:
    mod = importlib.import_module(module)
    mod.add_arguments(parser)
    parser.set_defaults(run_command=mod.run)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scale-ray", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the chosen subcommand's module is imported (startup stays fast).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)
        if name == chosen:
            _lazy(p, module)
    bench = sub.add_parser("bench", help="benchmarks that print numbers and ratios")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="WHAT")
    bench_chosen = argv[argv.index("bench") + 1] if chosen == "bench" and argv.index("bench") + 1 < len(argv) else None
    for name, (module, help_) in BENCH.items():
        p = bsub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)
        if name == bench_chosen:
            _lazy(p, module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.run_command(args) or 0)
    except ConfigError as e:
        print(f"scale-ray: config error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        print(f"scale-ray: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
