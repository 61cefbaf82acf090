"""`scale-ray reproduce`: the paper's experiments (Tables 3-5, Fig. 6) and the ones it lacks.

One run directory holds everything::

    OUT/runs/<method>_s<seed>/   training runs (resumable; a finished run is not trained again)
    OUT/results.json             every table as data, budgets, wall times, commit
    OUT/results.md               the tables, ready for docs/results.md
    OUT/fig6_training.png        training curves (return, response time) of all methods
    OUT/response_vs_n.png        mean task response time against N for all size-free policies

Budgets fix every number of the run (iterations, seeds, evaluation episodes, sizes); DQN and SAC
get the same number of environment steps as PPO, not the same number of iterations. Evaluation
seeds are fixed (``SeedSequence([EVAL_SEED, k])``) and never chosen after looking at results.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from envs.config import to_dict
from policies.guard import GuardConfig

from .config import REPO_ROOT, load_env
from .evaluation import evaluate, paired_differences

log = logging.getLogger(__name__)

EVAL_SEED = 20_260_605  # fixed before any result was seen (the paper's arXiv date)
HEURISTICS = ("random", "round-robin", "least-loaded", "fastest-idle", "eft", "eft-wait", "heft")
# t_{0.975, n-1} for 95% confidence intervals of a mean over n seeds.
T975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}


@dataclass(frozen=True)
class Method:
    name: str          # table label
    config: str        # configs/train/*.yaml
    size_free: bool    # runs at any N (cross-attention)
    main: bool = False  # trained with every seed of the budget


METHODS = (
    Method("SCALE", "configs/train/scale.yaml", True, True),
    Method("CrossAttn", "configs/train/crossattn.yaml", True, True),
    Method("PPO", "configs/train/ppo_mlp.yaml", False),
    Method("PPO+SRR", "configs/train/ppo_mlp_srr.yaml", False),
    Method("DQN", "configs/train/dqn.yaml", True),
    Method("SAC", "configs/train/sac.yaml", True),
)


@dataclass(frozen=True)
class Budget:
    """Everything that sizes a reproduction run."""
    name: str
    ppo_iterations: int                 # PPO iterations (1024 env steps each)
    seeds: tuple[int, ...]              # training seeds of SCALE and CrossAttn
    other_seeds: tuple[int, ...]        # training seeds of the other methods
    episodes: int                       # evaluation episodes per (policy, size)
    sizes: tuple[int, ...]              # Table 4 sizes
    feature_sizes: tuple[int, ...]      # Table 5 sizes
    robustness_sizes: tuple[int, ...]
    horizon_s: float | None = None      # evaluation arrival horizon (None: the env config's)
    srr_ramp: tuple[int, int] | None = None  # SRR ramp (iterations) for short runs
    off_policy: bool = True             # train DQN and SAC
    workers: int = 2
    env_overrides: dict = field(default_factory=dict)
    # Fewer episodes at large N (servers -> episodes): an episode has N/16 times the tasks of
    # one at N=16 and every decision scores N servers.
    max_episodes: dict = field(default_factory=dict)

    @property
    def env_steps(self) -> int:
        return self.ppo_iterations * 1024

    def episodes_at(self, servers: int) -> int:
        return min(self.episodes, self.max_episodes.get(servers, self.episodes))


BUDGETS = {
    # The paper: 1000 iterations, 30 evaluation episodes; 3 seeds for SCALE and CrossAttn.
    "paper": Budget("paper", 1000, (42, 43, 44), (42,), 30, (16, 32, 48, 64, 128, 256, 1024),
                    (16, 32, 48, 256), (16, 48), max_episodes={256: 10, 1024: 4}),
    # About 20 minutes on a quiet 2-core machine: the same tables with smaller numbers (40
    # iterations, about 1 s each). The SRR ramp is compressed with the run (the paper's 10->60
    # of 1000 iterations would barely switch on).
    "quick": Budget("quick", 40, (42, 43, 44), (42,), 4, (16, 32, 48, 256, 1024), (16, 48, 256),
                    (16, 48), horizon_s=40.0, srr_ramp=(4, 16)),
    # A smoke run for tests (minutes): one seed, tiny everything.
    "smoke": Budget("smoke", 1, (42,), (42,), 2, (16, 48), (16,), (16,), horizon_s=10.0,
                    srr_ramp=(0, 1), off_policy=False, max_episodes={48: 1}),
}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _train_one(method: Method, seed: int, budget: Budget, out: Path,
               echo: Callable[[str], None], skip_busy: bool = False) -> dict[str, Any] | None:
    """Train (or resume, or skip when finished) one method/seed; returns a summary row, or None
    when ``skip_busy`` and another live process is training this run."""
    from .training import latest_checkpoint, load_train_config, train

    run_dir = out / "runs" / f"{method.name.lower().replace('+', '_')}_s{seed}"
    overrides: dict[str, Any] = {"run": {"seed": seed, "checkpoint_every": max(1, budget.ppo_iterations // 4)}}
    if budget.srr_ramp is not None:
        overrides["srr"] = {"ramp_start": budget.srr_ramp[0], "ramp_end": budget.srr_ramp[1]}
    cfg, env = load_train_config(method.config, overrides)
    # Equal environment steps for every algorithm: PPO samples steps_per_iteration per iteration
    # (plus the few steps that finish episodes); DQN and SAC sample a varying number per
    # iteration, so they stop at the PPO budget's env steps (the iterations are then a cap).
    iterations = max(1, math.ceil(budget.env_steps / cfg.steps_per_iteration))
    if cfg.algorithm != "ppo":
        cfg, env = load_train_config(method.config, {
            **overrides, "run": {**overrides["run"], "max_env_steps": budget.env_steps}})
    policy_json = run_dir / "policy" / "policy.json"

    def finished_row() -> dict[str, Any] | None:
        if not (policy_json.exists() and _finished(json.loads(policy_json.read_text()),
                                                   iterations, cfg.run.max_env_steps)):
            return None
        echo(f"[{method.name} seed {seed}] done already ({run_dir})")
        meta = json.loads(policy_json.read_text())
        return {"method": method.name, "seed": seed, "run_dir": str(run_dir),
                "policy": str(run_dir / "policy"), "iterations": meta.get("iterations"),
                "env_steps": meta.get("env_steps"), "wall_s": _wall(run_dir), "resumed": False}

    if (row := finished_row()) is not None:
        return row
    if skip_busy and _locked_by_other(run_dir):
        echo(f"[{method.name} seed {seed}] being trained by another process; skipped for now")
        return None
    lock = _run_lock(run_dir)
    try:
        lock.__enter__()
    except RuntimeError:
        if skip_busy:  # lost the race for the lock to another process
            return None
        raise
    with contextlib.ExitStack() as held:
        held.push(lock)  # released however the training ends
        if (row := finished_row()) is not None:  # another process finished it meanwhile
            return row
        resume = latest_checkpoint(run_dir) is not None
        echo(f"[{method.name} seed {seed}] {'resuming' if resume else 'training'} to {iterations} "
             f"iterations ({iterations * cfg.steps_per_iteration} env steps) in {run_dir}")
        t0 = time.perf_counter()
        summary = train(cfg, env, run_dir, iterations=iterations, resume=resume,
                        echo=lambda s: echo(f"  [{method.name} s{seed}] {s}"))
        total = time.perf_counter() - t0 + _wall(run_dir)  # plus earlier sessions of a resume
        (run_dir / "wall_s.txt").write_text(f"{total:.1f}\n")
    return {"method": method.name, "seed": seed, "run_dir": str(run_dir),
            "policy": summary["policy"], "iterations": summary["iterations"],
            "env_steps": summary["last"].get("env_steps"), "wall_s": total, "resumed": resume}


def _finished(meta: dict, iterations: int, max_env_steps: int | None) -> bool:
    """Whether an exported policy (its policy.json) already holds the whole budget."""
    if meta.get("iterations", 0) >= iterations:
        return True
    steps = meta.get("env_steps")
    return (max_env_steps is not None and isinstance(steps, (int, float))
            and math.isfinite(steps) and steps >= max_env_steps)


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """One trainer per run directory: several ``reproduce --train-only --methods ...``
    processes may share an output directory (on 2 cores one training uses about one)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / "train.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            raise RuntimeError(f"{run_dir} is being trained by process {pid}; wait for it (or "
                               f"remove {lock} if that process is not ours)") from None
        lock.unlink(missing_ok=True)  # stale: its process is gone
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _locked_by_other(run_dir: Path) -> bool:
    """Whether a live process other than this one holds ``run_dir``'s train lock."""
    try:
        pid = int((run_dir / "train.lock").read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    return bool(pid) and pid != os.getpid() and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wall(run_dir: Path) -> float:
    f = run_dir / "wall_s.txt"
    return float(f.read_text()) if f.exists() else 0.0


def _mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t confidence interval (nan for one value)."""
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return math.nan, math.nan
    m = float(np.mean(v))
    if len(v) < 2:
        return m, math.nan
    return m, T975.get(len(v), 1.96) * float(np.std(v, ddof=1)) / math.sqrt(len(v))


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def run(budget_name: str = "quick", out: str | Path = "results/quick",
        echo: Callable[[str], None] | None = None, methods: Sequence[str] | None = None,
        sizes: Sequence[int] | None = None, train_only: bool = False, jobs: int = 1,
        skip_busy: bool = False) -> dict:
    """Train every method, evaluate everything, write results.json/results.md and the plots.
    ``sizes`` replaces the budget's Table 4 sizes (recorded in the results' budget);
    ``train_only`` stops after training (returns the runs). ``jobs`` > 1 trains that many runs
    at once: ``jobs - 1`` helper processes (``reproduce --train-only --skip-busy``) and this one
    take the runs one by one, each skipping the runs another is training (the run locks), and
    this one waits for the helpers before it evaluates. ``skip_busy`` leaves runs another
    process is training to it (a helper's mode)."""
    if budget_name not in BUDGETS:
        raise ValueError(f"--budget: {budget_name!r} is not one of {sorted(BUDGETS)}")
    if jobs < 1:
        raise ValueError(f"--jobs: {jobs} is not >= 1")
    budget = BUDGETS[budget_name]
    if sizes is not None:
        budget = replace(budget, sizes=tuple(sizes))
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    chosen = [m for m in METHODS if (methods is None or m.name in methods)
              and (budget.off_policy or m.name not in ("DQN", "SAC"))]

    # 1. Training -------------------------------------------------------------------------
    todo = [(m, seed) for m in chosen for seed in (budget.seeds if m.main else budget.other_seeds)]
    helpers = _start_helpers(budget_name, out, [m.name for m in chosen], jobs - 1, echo)
    done: dict[tuple[str, int], dict] = {}
    try:
        for m, seed in todo:
            row = _train_one(m, seed, budget, out, echo, skip_busy=skip_busy or bool(helpers))
            if row is not None:
                done[(m.name, seed)] = row
    except BaseException:
        for h in helpers:  # interrupted or failed: do not leave helpers training behind us
            h.terminate()
            h.wait()
        raise
    failed = _wait_helpers(helpers, echo)
    if skip_busy:  # a helper: what another process trains is not ours to report
        return {"runs": list(done.values())}
    # runs a helper trained (or left unfinished, if it failed: resumed here from its checkpoint)
    runs = [done.get((m.name, seed)) or _train_one(m, seed, budget, out, echo) for m, seed in todo]
    if failed:
        echo(f"{failed} helper process(es) failed; their unfinished runs were trained here")
    policies = {(r["method"], r["seed"]): r["policy"] for r in runs}
    if train_only:
        return {"runs": runs}

    # 2. Evaluation ---------------------------------------------------------------------
    overrides = dict(budget.env_overrides)
    if budget.horizon_s is not None:
        overrides.setdefault("workload", {})["horizon_s"] = budget.horizon_s
    env = load_env(None, overrides)
    results: dict[str, Any] = {"budget": to_dict_budget(budget), "commit": git_commit(),
                               "eval_seed": EVAL_SEED, "runs": runs, "env": to_dict(env)}

    def ev(label: str, specs: list[str], sizes: Sequence[int], env_cfg=env) -> list[dict]:
        """Rows of every (policy, size), labelled; also stores the paired differences to EFT on
        the same episodes under ``results[label + "_paired"]``."""
        t0 = time.perf_counter()
        rows: list[dict] = []
        episodes_all: list[dict] = []
        by_episodes: dict[int, list[int]] = {}
        for n in sizes:
            by_episodes.setdefault(budget.episodes_at(n), []).append(n)
        for episodes, group in by_episodes.items():
            echo(f"evaluating {label}: {len(specs)} policies x sizes {group} x {episodes} episodes")
            # the paper's methods as trained, without policies.guard (its fallback is EFT)
            r, e = evaluate(env_cfg, specs, group, episodes, EVAL_SEED, budget.workers,
                            guard=GuardConfig(enabled=False))
            rows += r
            episodes_all += e
        results.setdefault("eval_wall_s", {})[label] = time.perf_counter() - t0
        if "eft" in specs:
            results[label + "_paired"] = [{**p, "label": label_of.get(p["policy"], p["policy"])}
                                          for p in paired_differences(episodes_all, "eft")]
        order = {n: i for i, n in enumerate(sizes)}
        return [{**r, "label": label_of.get(r["policy"], r["policy"])}
                for r in sorted(rows, key=lambda r: (r["policy"], order[r["servers"]]))]

    label_of = {p: f"{m}/s{s}" for (m, s), p in policies.items()}
    label_of.update({h: h for h in HEURISTICS})

    # Table 3: every method at N=16 (first seed of each), with all heuristics.
    t3_specs = [policies[(m.name, (budget.seeds if m.main else budget.other_seeds)[0])] for m in chosen]
    results["table3"] = ev("table3", t3_specs + list(HEURISTICS), [16])

    # Table 4: every size-free policy zero-shot at every size, heuristics beside them.
    t4_specs = table4_policies(chosen, budget, policies)
    results["table4"] = ev("table4", t4_specs + ["eft", "heft", "fastest-idle", "random"], budget.sizes)
    results["gap"] = _gaps(results["table4"], budget)

    # Beyond the paper: the same, with servers that can never hold the task masked at inference
    # (what Serve and the live scheduler do). In the paper's unmasked action space a greedy
    # policy that prefers such a server waits for it forever: the episode is cut at the time cap.
    masked = load_env(None, {**overrides, "mdp": {"mask_infeasible": True}})
    results["table4_masked"] = ev("table4_masked", t4_specs + ["eft", "heft"], budget.sizes, masked)
    results["gap_masked"] = _gaps(results["table4_masked"], budget)

    # Table 5: statistics of z.
    results["table5"] = _feature_table(chosen, budget, policies, env, echo)

    # Robustness: another tier mix, and failing/joining servers (each also masked).
    robust_specs = [policies[(m.name, budget.seeds[0])] for m in chosen if m.main] + ["eft", "heft"]
    tiers = {"cluster": {"tiers": [{**to_dict(t), "ratio": r} for t, r in zip(env.cluster.tiers, (6, 2, 2))]}}
    churn = {"dynamics": {"fail_rate_per_server_s": 0.002, "rejoin_after_s": 10.0,
                          "join_rate_s": 0.02, "leave_rate_s": 0.02}}
    for name, change in (("robust_tiers", tiers), ("robust_dynamics", churn)):
        for suffix, mdp in (("", {}), ("_masked", {"mdp": {"mask_infeasible": True}})):
            cfg = load_env(None, {**overrides, **change, **mdp})
            results[name + suffix] = ev(name + suffix, robust_specs, budget.robustness_sizes, cfg)

    # 3. Plots and report ----------------------------------------------------------------------
    results["wall_s"] = time.perf_counter() - t_start
    _plots(out, runs, results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(render_markdown(results))
    echo(f"wrote {out / 'results.md'} ({results['wall_s']:.0f} s)")
    return results


def _start_helpers(budget_name: str, out: Path, methods: Sequence[str], n: int,
                   echo: Callable[[str], None]) -> list[subprocess.Popen]:
    """``n`` helper processes that train the same runs (skipping busy ones); output inherited."""
    procs = []
    for _ in range(max(0, n)):
        cmd = [sys.executable, "-m", "scale_ray.cli", "reproduce", "--budget", budget_name,
               "--out", str(out), "--train-only", "--skip-busy", "--methods", *methods]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT))
        echo(f"training helper started (pid {procs[-1].pid})")
        time.sleep(2.0)  # let each process lock its first run before the next one looks
    return procs


def _wait_helpers(procs: Sequence[subprocess.Popen], echo: Callable[[str], None]) -> int:
    """Wait for the helpers to finish; the number that failed."""
    failed = 0
    for p in procs:
        rc = p.wait()
        if rc != 0:
            echo(f"training helper pid {p.pid} exited with status {rc}")
            failed += 1
    return failed


def table4_policies(chosen: Sequence[Method], budget: Budget,
                    policies: dict[tuple[str, int], str]) -> list[str]:
    """Table 4's learned policies: SCALE and CrossAttn with every seed, the other size-free
    methods (DQN, SAC: pointer networks) with their first seed; the fixed-N MLPs cannot run."""
    specs = [policies[(m.name, s)] for m in chosen if m.main for s in budget.seeds]
    return specs + [policies[(m.name, budget.other_seeds[0])] for m in chosen
                    if m.size_free and not m.main]


def to_dict_budget(b: Budget) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in b.__dict__.items()}


def _gaps(table4: list[dict], budget: Budget) -> dict[str, Any]:
    """Per size: SCALE vs CrossAttn mean response over seeds, the relative gap
    1 - SCALE/CrossAttn per seed pair, its mean and 95% CI, and SCALE vs EFT."""
    out = {}
    for n in budget.sizes:
        rows = [r for r in table4 if r["servers"] == n]

        def by_seed(method: str, key: str = "mean_response_s") -> dict[str, float]:
            return {r["label"].split("/s")[1]: r.get(key, math.nan) for r in rows
                    if r["label"].startswith(method + "/")}

        sc, ca = by_seed("SCALE"), by_seed("CrossAttn")
        eft = next((r["mean_response_s"] for r in rows if r["label"] == "eft"), math.nan)
        pairs = [1 - sc[s] / ca[s] for s in sc if s in ca and ca[s] > 0]
        # the same on the censored mean (every arrived task; unfinished ones at their age)
        sc_c, ca_c = by_seed("SCALE", "censored_response_s"), by_seed("CrossAttn", "censored_response_s")
        pairs_c = [1 - sc_c[s] / ca_c[s] for s in sc_c if s in ca_c and ca_c[s] > 0]
        # response means are over completed tasks: compare them only where both finished alike
        done = {r["label"]: r.get("completed_tasks", math.nan) for r in rows}
        eft_done = done.get("eft", math.nan)
        completed = {lbl: v / eft_done - 1 for lbl, v in done.items()
                     if lbl.split("/s")[0] in ("SCALE", "CrossAttn") and eft_done and eft_done > 0}
        gap, ci = _mean_ci(pairs)
        gap_c, ci_c = _mean_ci(pairs_c)
        sc_m, sc_ci = _mean_ci(list(sc.values()))
        ca_m, ca_ci = _mean_ci(list(ca.values()))
        out[str(n)] = {"scale_mean": sc_m, "scale_ci": sc_ci, "crossattn_mean": ca_m,
                       "crossattn_ci": ca_ci, "gap_mean": gap, "gap_ci": ci, "gap_per_seed": pairs,
                       "censored_gap_mean": gap_c, "censored_gap_ci": ci_c,
                       "eft": eft, "scale_vs_eft": sc_m / eft - 1 if eft and not math.isnan(eft) else math.nan,
                       "completed_vs_eft": completed}
    return out


def _feature_table(chosen, budget, policies, env, echo) -> list[dict]:
    """Table 5: mean |off-diagonal covariance| and mean KL of z per size (size-free PPO models)."""
    from .features import feature_table

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


def _plots(out: Path, runs: list[dict], results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, r in enumerate(runs):
        f = Path(r["run_dir"]) / "metrics.csv"  # metrics.csv, not .jsonl: the one kept in git
        if not f.exists():
            continue
        with f.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        lbl = f"{r['method']} s{r['seed']}"
        for ax, key in ((axes[0], "episode_return"), (axes[1], "mean_response_s")):
            # iterations in which no episode ended report nan: connect the points that exist
            pts = [(float(x["env_steps"]), float(x[key])) for x in rows
                   if x.get(key) not in (None, "") and math.isfinite(float(x[key]))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=lbl, lw=1,
                    color=colors[i % len(colors)])
    axes[0].set(xlabel="env steps", ylabel="episode return", title="Training reward")
    axes[1].set(xlabel="env steps", ylabel="mean task response (s, log)", yscale="log",
                title="Training response time")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig6_training.png", dpi=120)
    plt.close(fig)

    # Left: the paper's action space, mean over every arrived task (`resp all`: unfinished tasks
    # at their age, so a policy that strands tasks is not flattered). Right: never-fitting
    # servers masked at inference, where every policy completes every task.
    panels = [("table4", "censored_response_s", "paper action space (resp all)"),
              ("table4_masked", "mean_response_s", "never-fitting servers masked")]
    panels = [p for p in panels if results.get(p[0])]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    labels = sorted({r["label"] for key, _, _ in panels for r in results[key]})
    for ax, (key, metric, title) in zip(axes[0], panels):
        by: dict[str, list[tuple[int, float]]] = {}
        for r in results[key]:
            by.setdefault(r["label"], []).append((r["servers"], r[metric]))
        for label, pts in sorted(by.items()):
            pts.sort()
            learned = "/" in label
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                    marker="o" if learned else "s", ms=4, ls="-" if learned else "--",
                    color=colors[labels.index(label) % len(colors)])
        ax.set(xscale="log", yscale="log", xlabel="servers N (trained at 16)",
               ylabel="mean task response (s, log)", title=title)
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend([handles[k] for k in sorted(handles)], sorted(handles), fontsize=7,
               loc="center right")
    fig.suptitle("Zero-shot response time vs cluster size")
    fig.tight_layout(rect=(0, 0, 0.87, 1))
    fig.savefig(out / "response_vs_n.png", dpi=120)
    plt.close(fig)


def _table(rows: list[dict], cols: Sequence[tuple[str, str, int]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c[0]), c[2]) if c[2] >= 0 else str(r.get(c[0]))
                                      for c in cols) + " |")
    return "\n".join(lines)


def _pct(x: float, nd: int = 1) -> str:
    return _fmt(x * 100 if not math.isnan(x) else math.nan, nd) + "%"


def _gap_table(gap: dict) -> list[str]:
    lines = ["| N | SCALE s (±95% CI) | CrossAttn s (±95% CI) | gap 1−SCALE/CrossAttn (±95% CI) | "
             "gap on resp all (±95% CI) | EFT s | SCALE/EFT − 1 | completed tasks vs EFT |",
             "|---|---|---|---|---|---|---|---|"]
    for n, g in gap.items():
        lines.append(f"| {n} | {_fmt(g['scale_mean'])} ± {_fmt(g['scale_ci'])} | "
                     f"{_fmt(g['crossattn_mean'])} ± {_fmt(g['crossattn_ci'])} | "
                     f"{_pct(g['gap_mean'])} ± {_pct(g['gap_ci'])} | "
                     f"{_pct(g.get('censored_gap_mean', math.nan))} ± {_pct(g.get('censored_gap_ci', math.nan))} | "
                     f"{_fmt(g['eft'])} | {_pct(g['scale_vs_eft'])} | "
                     + (", ".join(f"{k} {100 * v:+.1f}%" for k, v in sorted(g.get("completed_vs_eft", {}).items())
                                  if abs(v) > 1e-9) or "equal") + " |")
    return lines


def _paired_matrix(paired: list[dict]) -> list[str]:
    """Policies x sizes: mean task response vs EFT on the same episodes (mean of per-episode
    ratios − 1, 95% CI); † where the policy completed fewer tasks than EFT (not comparable)."""
    sizes = sorted({p["servers"] for p in paired})
    labels = sorted({p["label"] for p in paired if p["label"] != "eft"})
    cell = {(p["label"], p["servers"]): p for p in paired}
    lines = ["| policy | " + " | ".join(f"N = {n}" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for lbl in labels:
        row = []
        for n in sizes:
            p = cell.get((lbl, n))
            if p is None:
                row.append("–")
                continue
            flag = " †" if abs(p.get("completed_rel_diff") or 0.0) > 1e-9 else ""
            row.append(f"{100 * p['mean_rel_diff']:+.2f} ± {_fmt(100 * p['ci95_half_width'], 2)}{flag}")
        lines.append(f"| {lbl} | " + " | ".join(row) + " |")
    return lines


def render_markdown(res: dict) -> str:
    b = res["budget"]
    main_cols = [("label", "policy", -1), ("servers", "N", -1), ("completed_tasks", "tasks", 1),
                 ("mean_response_s", "resp s", 3), ("std_response_s", "± std", 3),
                 ("censored_response_s", "resp all s", 3),
                 ("mean_workflow_response_s", "wf resp s", 3), ("p95_response_s", "p95 s", 3),
                 ("slowdown", "slowdown", 3), ("invalid_rate", "invalid", 3)]
    parts = [f"Budget `{b['name']}` (PPO iterations {b['ppo_iterations']}, "
             f"{b['ppo_iterations'] * 1024} env steps per method; SCALE/CrossAttn seeds {b['seeds']}; "
             f"{b['episodes']} evaluation episodes"
             + "".join(f", {e} at N = {n}" for n, e in (b.get("max_episodes") or {}).items())
             + f", seed {res['eval_seed']}; "
             + (f"arrivals for {b['horizon_s']:g} s" if b["horizon_s"]
                else "arrival horizon of the env config")
             + f"), commit `{res['commit']}`, wall time of this command "
             f"{res['wall_s'] / 60:.1f} min (training runs: their own wall time below).", "",
             "### Training runs", "",
             _table(res["runs"], [("method", "method", -1), ("seed", "seed", -1),
                                  ("iterations", "iterations", -1), ("env_steps", "env steps", 0),
                                  ("wall_s", "wall s", 0)]), "",
             "### Table 3 — all methods at N = 16", "", _table(res["table3"], main_cols), "",
             "### Table 4 — zero-shot at every size", "",
             _table(sorted(res["table4"], key=lambda r: (r["label"], r["servers"])), main_cols), "",
             "### SCALE vs CrossAttn gap and SCALE vs EFT", "", *_gap_table(res["gap"]), "",
             "### Table 4, paired: mean task response vs EFT on the same episodes (%, ± 95% CI; "
             "† fewer tasks completed than EFT: not comparable)", "",
             *_paired_matrix(res.get("table4_paired", []))]
    parts += ["", "Response means (`resp s`) are over completed tasks; where a policy completed "
                  "fewer tasks than EFT (last column) its unfinished, slowest tasks are missing from "
                  "its mean. `resp all s` counts every arrived task, an unfinished one at its age "
                  "when the episode was cut (a lower bound of its response): it is comparable "
                  "across policies that finish different numbers of tasks."]
    if "table4_masked" in res:
        parts += ["", "### Beyond the paper: Table 4 with never-fitting servers masked at inference",
                  "", "The same policies and episodes, with `mdp.mask_infeasible: true` at "
                  "evaluation only (what Serve and the live scheduler do): a policy can no longer "
                  "pick a server whose memory can never hold the task. Paired vs EFT (%, ± 95% CI; "
                  "† fewer tasks completed than EFT):", "",
                  *_paired_matrix(res.get("table4_masked_paired", [])), "",
                  "SCALE vs CrossAttn with the mask:", "", *_gap_table(res["gap_masked"])]
    parts += ["", "### Table 5 — statistics of the attention feature z", "",
              _table(res["table5"], [("label", "policy", -1), ("servers", "N", -1),
                                     ("mean_abs_offdiag_cov", "mean |off-diag cov|", 4),
                                     ("mean_kl", "mean KL to N(0,1)", 4)]), "",
              "### Robustness — tier mix small:medium:large = 6:2:2", "",
              _table(res["robust_tiers"], main_cols), "",
              "### Robustness — servers failing (rate 0.002/s each, replaced after 10 s), joining and leaving (0.02/s)", "",
              _table(res["robust_dynamics"], main_cols), ""]
    for name, title in (("robust_tiers_masked", "tier mix 6:2:2"),
                        ("robust_dynamics_masked", "servers failing, joining and leaving")):
        if name in res:
            parts += [f"### Robustness, never-fitting servers masked at inference — {title}", "",
                      _table(res[name], main_cols), ""]
    parts += ["![training curves](fig6_training.png)", "", "![response vs N](response_vs_n.png)", ""]
    return "\n".join(parts)
