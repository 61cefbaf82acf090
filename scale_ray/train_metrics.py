"""Per-iteration training metrics: one row per iteration in ``metrics.csv``, ``metrics.jsonl``
and TensorBoard, extracted from RLlib's result dict (split out of :mod:`scale_ray.training`)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Mapping

RESPONSE_KEY = "scale/mean_task_response_s"
COMPLETED_KEY = "scale/completed_tasks"
INVALID_KEY = "scale/invalid_rate"


METRIC_COLUMNS = ("iteration", "env_steps", "time_s", "iter_s", "episodes", "episode_return",
                  "mean_task_response_s", "completed_tasks", "invalid_rate", "lr", "total_loss",
                  "policy_loss", "vf_loss", "entropy", "srr_decorrelation", "srr_kl", "srr_ramp",
                  "z_mean_abs_offdiag_cov", "z_mean_kl", "qf_loss", "alpha")


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def extract_metrics(result: Mapping[str, Any], iteration: int, elapsed_s: float) -> dict[str, float]:
    """One row of METRIC_COLUMNS from an RLlib result dict."""
    from policies.learner import SRR_DEC, SRR_KL, SRR_RAMP, Z_KL, Z_OFFDIAG

    er = result.get("env_runners", {}) or {}
    lrn = (result.get("learners", {}) or {}).get("default_policy", {}) or {}
    lr = lrn.get("default_optimizer_learning_rate", lrn.get("curr_lr"))
    return {
        "iteration": iteration,
        "env_steps": _num(result.get("num_env_steps_sampled_lifetime",
                                     er.get("num_env_steps_sampled_lifetime"))),
        "time_s": elapsed_s,
        "iter_s": _num(result.get("time_this_iter_s")),
        "episodes": _num(er.get("num_episodes_lifetime")),
        "episode_return": _num(er.get("episode_return_mean")),
        "mean_task_response_s": _num(er.get(RESPONSE_KEY)),
        "completed_tasks": _num(er.get(COMPLETED_KEY)),
        "invalid_rate": _num(er.get(INVALID_KEY)),
        "lr": _num(lr),
        "total_loss": _num(lrn.get("total_loss")),
        "policy_loss": _num(lrn.get("policy_loss")),
        "vf_loss": _num(lrn.get("vf_loss")),
        "entropy": _num(lrn.get("entropy")),
        "srr_decorrelation": _num(lrn.get(SRR_DEC)),
        "srr_kl": _num(lrn.get(SRR_KL)),
        "srr_ramp": _num(lrn.get(SRR_RAMP)),
        "z_mean_abs_offdiag_cov": _num(lrn.get(Z_OFFDIAG)),
        "z_mean_kl": _num(lrn.get(Z_KL)),
        "qf_loss": _num(lrn.get("qf_loss")),
        "alpha": _num(lrn.get("alpha_value")),
    }


#: printed once above the per-iteration lines (docs/training.md)
PROGRESS_LEGEND = ("return: mean episode return (over the last run.metrics_window episodes), "
                   "higher is better; resp: their mean task response, model s, lower is better; "
                   "n/a in an iteration in which no episode ended (one spans several)")


def progress_line(row: Mapping[str, float], total: int) -> str:
    """One iteration on one line; ``return``/``resp`` say ``n/a (no episode ended)`` for an
    iteration in which no sampled episode ended (RLlib reports none)."""
    def f(key: str, fmt: str) -> str:
        v = row.get(key, math.nan)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    ret = row.get("episode_return", math.nan)
    if ret is None or math.isnan(ret):
        outcome = "return n/a (no episode ended)"
    else:
        outcome = f"return {ret:.2f} resp {f('mean_task_response_s', '.2f')}s"
    return (f"iter {row['iteration']:>4}/{total} steps {f('env_steps', '.0f')} "
            f"({f('iter_s', '.1f')}s) {outcome} lr {f('lr', '.2e')} "
            f"loss {f('total_loss', '.3f')} "
            f"pi {f('policy_loss', '.3f')} vf {f('vf_loss', '.3f')} ent {f('entropy', '.3f')} "
            f"srr[dec {f('srr_decorrelation', '.3f')} kl {f('srr_kl', '.3f')} "
            f"ramp {f('srr_ramp', '.2f')}]")


class MetricsWriter:
    """Appends rows to metrics.csv / metrics.jsonl and TensorBoard scalars. ``resumed_at``: the
    iteration of the checkpoint a resumed run starts from; rows after it (written by the
    interrupted run, about to be trained again) are dropped first, so every iteration has one
    row."""

    def __init__(self, out: Path, resumed_at: int | None = None):
        self.csv_path = out / "metrics.csv"
        self.json_path = out / "metrics.jsonl"
        if resumed_at is not None:
            self._drop_after(resumed_at)
        new = not self.csv_path.exists()
        self._csv = self.csv_path.open("a", newline="")
        self._w = csv.DictWriter(self._csv, fieldnames=METRIC_COLUMNS)
        if new:
            self._w.writeheader()
        self._json = self.json_path.open("a")
        try:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(out / "tb"))
        except ImportError:  # pragma: no cover - tensorboardX ships with ray[rllib]
            self._tb = None

    def _drop_after(self, iteration: int) -> None:
        if self.csv_path.exists():
            with self.csv_path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            with self.csv_path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
                w.writeheader()
                w.writerows(r for r in rows if int(float(r["iteration"])) <= iteration)
        if self.json_path.exists():
            lines = [ln for ln in self.json_path.read_text().splitlines() if ln.strip()]
            self.json_path.write_text("".join(
                ln + "\n" for ln in lines if int(json.loads(ln)["iteration"]) <= iteration))

    def last(self, key: str) -> float:
        """``key`` of the last row written (after a resume: of the checkpoint's iteration)."""
        if not self.csv_path.exists():
            return math.nan
        with self.csv_path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        return _num(rows[-1][key]) if rows else math.nan

    def write(self, row: Mapping[str, float]) -> None:
        self._w.writerow({k: row.get(k) for k in METRIC_COLUMNS})
        self._csv.flush()
        self._json.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                                     for k, v in row.items()}) + "\n")
        self._json.flush()
        if self._tb is not None:
            step = int(row["iteration"])
            for k, v in row.items():
                if k != "iteration" and isinstance(v, (int, float)) and not math.isnan(v):
                    self._tb.add_scalar(f"train/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        self._csv.close()
        self._json.close()
        if self._tb is not None:
            self._tb.close()
