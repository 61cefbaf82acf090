"""Training runs of a reproduction: each method/seed trained (or resumed, or skipped when
finished) in ``OUT/runs/<method>_s<seed>/``, one trainer per run directory (a lock file), and
helper processes that train runs in parallel."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from scale_ray.live.raylocal import pid_alive

from envs.config import to_dict

from ..checkpoints import latest_checkpoint
from ..config import REPO_ROOT
from ..train_config import load_train_config
from ..training import train
from .budgets import Budget, Method


def train_one(method: Method, seed: int, budget: Budget, out: Path,
              echo: Callable[[str], None], skip_busy: bool = False) -> dict[str, Any] | None:
    """Train (or resume, or skip when finished) one method/seed; returns a summary row, or None
    when ``skip_busy`` and another live process is training this run."""
    run_dir = out / "runs" / f"{method.name.lower().replace('+', '_')}_s{seed}"
    overrides: dict[str, Any] = {"run": {"seed": seed, "checkpoint_every": max(1, budget.ppo_iterations // 4)}}
    if budget.srr_ramp is not None:
        overrides["srr"] = {"ramp_start": budget.srr_ramp[0], "ramp_end": budget.srr_ramp[1]}
    if budget.env_config is not None:
        overrides["env"] = budget.env_config
    cfg, env = load_train_config(method.config, overrides)
    same_env(run_dir, env)
    # Equal environment steps for every algorithm: PPO samples steps_per_iteration per iteration
    # (plus the few steps that finish episodes); DQN and SAC sample a varying number per
    # iteration, so they stop at the PPO budget's env steps (the iterations are then a cap).
    iterations = max(1, math.ceil(budget.env_steps / cfg.steps_per_iteration))
    if cfg.algorithm != "ppo":
        cfg, env = load_train_config(method.config, {
            **overrides, "run": {**overrides["run"], "max_env_steps": budget.env_steps}})
    policy_json = run_dir / "policy" / "policy.json"

    def finished_row() -> dict[str, Any] | None:
        if not (policy_json.exists() and finished(json.loads(policy_json.read_text()),
                                                  iterations, cfg.run.max_env_steps)):
            return None
        echo(f"[{method.name} seed {seed}] done already ({run_dir})")
        meta = json.loads(policy_json.read_text())
        return {"method": method.name, "seed": seed, "run_dir": str(run_dir),
                "policy": str(run_dir / "policy"), "iterations": meta.get("iterations"),
                "env_steps": meta.get("env_steps"), "wall_s": wall(run_dir), "resumed": False}

    if (row := finished_row()) is not None:
        return row
    if skip_busy and _locked_by_other(run_dir):
        echo(f"[{method.name} seed {seed}] being trained by another process; skipped for now")
        return None
    lock = run_lock(run_dir)
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
        total = time.perf_counter() - t0 + wall(run_dir)  # plus earlier sessions of a resume
        (run_dir / "wall_s.txt").write_text(f"{total:.1f}\n")
    return {"method": method.name, "seed": seed, "run_dir": str(run_dir),
            "policy": summary["policy"], "iterations": summary["iterations"],
            "env_steps": summary["last"].get("env_steps"), "wall_s": total, "resumed": resume}


def same_env(run_dir: Path, env: Any) -> None:
    """Refuse to reuse or resume a run directory trained in another environment (a resume
    trains on in the saved one, so a changed ``--env-config`` would silently not apply)."""
    saved = run_dir / "config.json"
    if not saved.exists() or not hasattr(env, "__dataclass_fields__"):
        return
    if json.loads(saved.read_text()).get("env") != json.loads(json.dumps(to_dict(env))):
        raise ValueError(f"--env-config: {run_dir} was trained in another environment (its "
                         f"config.json); give another --out, or the env config it was trained in")


def finished(meta: dict, iterations: int, max_env_steps: int | None) -> bool:
    """Whether an exported policy (its policy.json) already holds the whole budget."""
    if meta.get("iterations", 0) >= iterations:
        return True
    steps = meta.get("env_steps")
    return (max_env_steps is not None and isinstance(steps, (int, float))
            and math.isfinite(steps) and steps >= max_env_steps)


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
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
        if pid and pid_alive(pid):
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
    return bool(pid) and pid != os.getpid() and pid_alive(pid)


def wall(run_dir: Path) -> float:
    f = run_dir / "wall_s.txt"
    return float(f.read_text()) if f.exists() else 0.0


def start_helpers(budget_name: str, out: Path, methods: Sequence[str], n: int,
                  echo: Callable[[str], None], env_config: str | None = None
                  ) -> list[subprocess.Popen]:
    """``n`` helper processes that train the same runs (skipping busy ones); output inherited."""
    procs = []
    for _ in range(max(0, n)):
        cmd = [sys.executable, "-m", "scale_ray.cli", "reproduce", "--budget", budget_name,
               "--out", str(out), "--train-only", "--skip-busy", "--methods", *methods]
        if env_config is not None:
            cmd += ["--env-config", env_config]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT))
        echo(f"training helper started (pid {procs[-1].pid})")
        time.sleep(2.0)  # let each process lock its first run before the next one looks
    return procs


def wait_helpers(procs: Sequence[subprocess.Popen], echo: Callable[[str], None]) -> int:
    """Wait for the helpers to finish; the number that failed."""
    failed = 0
    for p in procs:
        rc = p.wait()
        if rc != 0:
            echo(f"training helper pid {p.pid} exited with status {rc}")
            failed += 1
    return failed
