"""Statistics and the Markdown report of a reproduction (``OUT/results.md``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from scale_ray.relative import rel

from .budgets import Budget

# t_{0.975, n-1} for 95% confidence intervals of a mean over n seeds.
T975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
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


def gaps(table4: list[dict], budget: Budget) -> dict[str, Any]:
    """Per size: SCALE vs CrossAttn mean response over seeds, the relative gap
    1 - SCALE/CrossAttn per seed pair, its mean and 95% CI, and SCALE vs EFT."""
    out = {}
    for n in budget.sizes:
        rows = [r for r in table4 if r["servers"] == n]

        def by_seed(method: str, key: str = "mean_task_response_s") -> dict[str, float]:
            return {r["label"].split("/s")[1]: r.get(key, math.nan) for r in rows
                    if r["label"].startswith(method + "/")}

        sc, ca = by_seed("SCALE"), by_seed("CrossAttn")
        eft = next((r["mean_task_response_s"] for r in rows if r["label"] == "eft"), math.nan)
        pairs = [1 - sc[s] / ca[s] for s in sc if s in ca and ca[s] > 0]
        # the same on the censored mean (every arrived task; unfinished ones at their age)
        sc_c = by_seed("SCALE", "censored_task_response_s")
        ca_c = by_seed("CrossAttn", "censored_task_response_s")
        pairs_c = [1 - sc_c[s] / ca_c[s] for s in sc_c if s in ca_c and ca_c[s] > 0]
        # response means are over completed tasks: compare them only where both finished alike
        done = {r["label"]: r.get("completed_tasks", math.nan) for r in rows}
        eft_done = done.get("eft", math.nan)
        completed = {lbl: v / eft_done - 1 for lbl, v in done.items()
                     if lbl.split("/s")[0] in ("SCALE", "CrossAttn") and eft_done and eft_done > 0}
        gap, ci = mean_ci(pairs)
        gap_c, ci_c = mean_ci(pairs_c)
        sc_m, sc_ci = mean_ci(list(sc.values()))
        ca_m, ca_ci = mean_ci(list(ca.values()))
        out[str(n)] = {"scale_mean": sc_m, "scale_ci": sc_ci, "crossattn_mean": ca_m,
                       "crossattn_ci": ca_ci, "gap_mean": gap, "gap_ci": ci, "gap_per_seed": pairs,
                       "censored_gap_mean": gap_c, "censored_gap_ci": ci_c,
                       "eft": eft, "scale_vs_eft": sc_m / eft - 1 if eft and not math.isnan(eft) else math.nan,
                       "completed_vs_eft": completed}
    return out


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
                     + (", ".join(f"{k} {rel(v)}" for k, v in sorted(g.get("completed_vs_eft", {}).items())
                                  if abs(v) > 1e-9) or "equal") + " |")
    return lines


def paired_matrix(paired: list[dict]) -> list[str]:
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
                 ("mean_task_response_s", "resp s", 3), ("std_task_response_s", "± std", 3),
                 ("censored_task_response_s", "resp all s", 3),
                 ("mean_workflow_response_s", "wf resp s", 3), ("p95_task_response_s", "p95 s", 3),
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
             *paired_matrix(res.get("table4_paired", []))]
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
                  *paired_matrix(res.get("table4_masked_paired", [])), "",
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
