"""`scale-ray reproduce`'s pipeline: train every method, evaluate everything (Tables 3-5, the
masked and robustness tables), write ``results.json``, ``results.md`` and the plots."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from envs.config import to_dict
from policies.guard import GuardConfig

from ..config import REPO_ROOT, load_env
from ..evaluation import evaluate, paired_differences
from ..features import feature_table
from .budgets import BUDGETS, EVAL_SEED, HEURISTICS, METHODS, table4_policies, to_dict_budget
from .plots import write_plots
from .report import gaps, render_markdown
from .runs import start_helpers, train_one, wait_helpers


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(budget_name: str = "quick", out: str | Path = "results/quick",
        echo: Callable[[str], None] | None = None, methods: Sequence[str] | None = None,
        sizes: Sequence[int] | None = None, train_only: bool = False, jobs: int = 1,
        skip_busy: bool = False, env_config: str | None = None) -> dict:
    """Train every method, evaluate everything, write results.json/results.md and the plots.
    ``sizes`` replaces the budget's Table 4 sizes (recorded in the results' budget);
    ``train_only`` stops after training (returns the runs). ``jobs`` > 1 trains that many runs
    at once: ``jobs - 1`` helper processes (``reproduce --train-only --skip-busy``) and this one
    take the runs one by one, each skipping the runs another is training (the run locks), and
    this one waits for the helpers before it evaluates. ``skip_busy`` leaves runs another
    process is training to it (a helper's mode). ``env_config`` is the env every run trains
    and is evaluated in (default: the methods' train configs', configs/env/paper.yaml)."""
    if budget_name not in BUDGETS:
        raise ValueError(f"--budget: {budget_name!r} is not one of {sorted(BUDGETS)}")
    if jobs < 1:
        raise ValueError(f"--jobs: {jobs} is not >= 1")
    budget = BUDGETS[budget_name]
    if sizes is not None:
        budget = replace(budget, sizes=tuple(sizes))
    if env_config is not None:
        load_env(env_config)  # a bad file or key fails here, naming it, before any training
        budget = replace(budget, env_config=str(env_config))
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    chosen = [m for m in METHODS if (methods is None or m.name in methods)
              and (budget.off_policy or m.name not in ("DQN", "SAC"))]
    runs = train_all(chosen, budget, budget_name, out, echo, jobs, skip_busy)
    if skip_busy or train_only:  # a helper: what another process trains is not ours to report
        return {"runs": runs}
    results = evaluate_all(chosen, budget, runs, echo)
    # 3. Plots and report ----------------------------------------------------------------------
    results["wall_s"] = time.perf_counter() - t_start
    write_plots(out, runs, results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(render_markdown(results))
    echo(f"wrote {out / 'results.md'} ({results['wall_s']:.0f} s)")
    return results


def train_all(chosen: list, budget: Any, budget_name: str, out: Path,
              echo: Callable[[str], None], jobs: int, skip_busy: bool) -> list[dict]:
    """1. Training: every (method, seed) run, ``jobs - 1`` helper processes beside this one (see
    :func:`run`); the runs' rows (a helper's own only, with ``skip_busy``)."""
    todo = [(m, seed) for m in chosen for seed in (budget.seeds if m.main else budget.other_seeds)]
    helpers = start_helpers(budget_name, out, [m.name for m in chosen], jobs - 1, echo,
                            budget.env_config)
    done: dict[tuple[str, int], dict] = {}
    try:
        for m, seed in todo:
            row = train_one(m, seed, budget, out, echo, skip_busy=skip_busy or bool(helpers))
            if row is not None:
                done[(m.name, seed)] = row
    except BaseException:
        for h in helpers:  # interrupted or failed: do not leave helpers training behind us
            h.terminate()
            h.wait()
        raise
    failed = wait_helpers(helpers, echo)
    if skip_busy:
        return list(done.values())
    # runs a helper trained (or left unfinished, if it failed: resumed here from its checkpoint)
    runs = [done.get((m.name, seed)) or train_one(m, seed, budget, out, echo) for m, seed in todo]
    if failed:
        echo(f"{failed} helper process(es) failed; their unfinished runs were trained here")
    return runs


class _Tables:
    """Evaluates (policy, size) rows into ``results`` under a label (:meth:`rows`)."""

    def __init__(self, budget: Any, env: Any, results: dict[str, Any], label_of: dict[str, str],
                 echo: Callable[[str], None]):
        self.budget, self.env, self.results = budget, env, results
        self.label_of, self.echo = label_of, echo

    def rows(self, label: str, specs: list[str], sizes: Sequence[int], env_cfg: Any = None
             ) -> list[dict]:
        """Rows of every (policy, size), labelled; also stores the paired differences to EFT on
        the same episodes under ``results[label + "_paired"]``."""
        budget, results, label_of = self.budget, self.results, self.label_of
        t0 = time.perf_counter()
        rows: list[dict] = []
        episodes_all: list[dict] = []
        by_episodes: dict[int, list[int]] = {}
        for n in sizes:
            by_episodes.setdefault(budget.episodes_at(n), []).append(n)
        for episodes, group in by_episodes.items():
            self.echo(f"evaluating {label}: {len(specs)} policies x sizes {group} x {episodes} "
                      f"episodes")
            # the paper's methods as trained, without policies.guard (its fallback is EFT)
            r, e = evaluate(env_cfg or self.env, specs, group, episodes, EVAL_SEED,
                            budget.workers, guard=GuardConfig(enabled=False))
            rows += r
            episodes_all += e
        results.setdefault("eval_wall_s", {})[label] = time.perf_counter() - t0
        if "eft" in specs:
            results[label + "_paired"] = [{**p, "label": label_of.get(p["policy"], p["policy"])}
                                          for p in paired_differences(episodes_all, "eft", "task")]
        order = {n: i for i, n in enumerate(sizes)}
        return [{**r, "label": label_of.get(r["policy"], r["policy"])}
                for r in sorted(rows, key=lambda r: (r["policy"], order[r["servers"]]))]


def evaluate_all(chosen: list, budget: Any, runs: list[dict], echo: Callable[[str], None]
                 ) -> dict[str, Any]:
    """2. Evaluation: Tables 3-5, the masked tables and the robustness tables."""
    policies = {(r["method"], r["seed"]): r["policy"] for r in runs}
    overrides = dict(budget.env_overrides)
    if budget.horizon_s is not None:
        overrides.setdefault("workload", {})["horizon_s"] = budget.horizon_s
    env = load_env(budget.env_config, overrides)
    results: dict[str, Any] = {"budget": to_dict_budget(budget), "commit": git_commit(),
                               "eval_seed": EVAL_SEED, "runs": runs, "env": to_dict(env)}
    label_of = {p: f"{m}/s{s}" for (m, s), p in policies.items()}
    label_of.update({h: h for h in HEURISTICS})
    ev = _Tables(budget, env, results, label_of, echo).rows

    # Table 3: every method at N=16 (first seed of each), with all heuristics.
    t3_specs = [policies[(m.name, (budget.seeds if m.main else budget.other_seeds)[0])] for m in chosen]
    results["table3"] = ev("table3", t3_specs + list(HEURISTICS), [16])

    # Table 4: every size-free policy zero-shot at every size, heuristics beside them.
    t4_specs = table4_policies(chosen, budget, policies)
    results["table4"] = ev("table4", t4_specs + ["eft", "heft", "fastest-idle", "random"], budget.sizes)
    results["gap"] = gaps(results["table4"], budget)

    # Beyond the paper: the same, with servers that can never hold the task masked at inference
    # (what Serve and the live scheduler do). In the paper's unmasked action space a greedy
    # policy that prefers such a server waits for it forever: the episode is cut at the time cap.
    masked = load_env(budget.env_config, {**overrides, "mdp": {"mask_infeasible": True}})
    results["table4_masked"] = ev("table4_masked", t4_specs + ["eft", "heft"], budget.sizes, masked)
    results["gap_masked"] = gaps(results["table4_masked"], budget)

    # Table 5: statistics of z.
    results["table5"] = feature_rows(chosen, budget, policies, env, echo)

    # Robustness: another tier mix, and failing/joining servers (each also masked).
    robust_specs = [policies[(m.name, budget.seeds[0])] for m in chosen if m.main] + ["eft", "heft"]
    tiers = {"cluster": {"tiers": [{**to_dict(t), "ratio": r} for t, r in zip(env.cluster.tiers, (6, 2, 2))]}}
    churn = {"dynamics": {"fail_rate_per_server_s": 0.002, "rejoin_after_s": 10.0,
                          "join_rate_s": 0.02, "leave_rate_s": 0.02}}
    for name, change in (("robust_tiers", tiers), ("robust_dynamics", churn)):
        for suffix, mdp in (("", {}), ("_masked", {"mdp": {"mask_infeasible": True}})):
            cfg = load_env(budget.env_config, {**overrides, **change, **mdp})
            results[name + suffix] = ev(name + suffix, robust_specs, budget.robustness_sizes, cfg)
    return results


def feature_rows(chosen, budget, policies, env, echo) -> list[dict]:
    """Table 5: mean |off-diagonal covariance| and mean KL of z per size (size-free PPO models)."""
    rows = []
    for m in chosen:
        if not m.main:
            continue
        for seed in budget.seeds:
            path = policies[(m.name, seed)]
            echo(f"feature statistics of {m.name}/s{seed} at {list(budget.feature_sizes)}")
            for n in budget.feature_sizes:
                for r in feature_table(path, env, [n], max(1, budget.episodes_at(n) // 2), EVAL_SEED):
                    rows.append({"label": f"{m.name}/s{seed}", **r})
    return rows
