"""Every real-DAG family, a learned policy against EFT: `scale-ray workloads compare`.

For each family and cluster size it runs, on the same fixed-seed episodes: EFT, the policy as
shipped (through ``policies.guard``, with the family's ``features.workload_scale``), and three
ablations: no guard; no workload scale (``features.workload_scale = 1``); neither. The table
gives the censored mean task response (every arrived task; an unfinished one at its age when the
episode was cut) relative to EFT's, the p95 and the guard's overrides per episode, so "safe on
every family" and "what makes it safe" are one command (docs/workloads.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from envs.config import replace
from policies.guard import GuardConfig
from scale_ray.evaluation import evaluate, paired_differences
from scale_ray.families import family_env

#: (column label, guard on, family workload scale kept)
VARIANTS = (("shipped", True, True), ("no guard", False, True), ("no scale", True, False),
            ("neither", False, False))


def compare_family(family: str, policy: str, servers: Sequence[int], episodes: int, seed: int,
                   workers: int, progress: Callable[[int, int], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Rows (one per size) of EFT vs ``policy`` and its ablations on ``family``."""
    env = family_env(family)
    unscaled = replace(env, features={"workload_scale": 1.0})
    per: dict[str, tuple[list[dict], list[dict]]] = {}
    for label, guard_on, scaled in VARIANTS:
        # EFT twice: with the family's workload scale and without (heuristics must not change)
        specs = [policy, "eft"] if label in ("shipped", "neither") else [policy]
        rows, eps = evaluate(env if scaled else unscaled, specs, servers, episodes, seed, workers,
                             None, progress, GuardConfig(enabled=guard_on))
        per[label] = (rows, eps)
    eft_rows = {r["servers"]: r for r in per["shipped"][0] if r["policy"] == "eft"}
    eft_eps = [e for e in per["shipped"][1] if e["policy"] == "eft"]
    out = []
    for n in servers:
        ref = eft_rows[n]
        unscaled_eft = next(x for x in per["neither"][0] if x["policy"] == "eft" and x["servers"] == n)
        row: dict[str, Any] = {"family": family, "servers": n, "episodes": episodes,
                               "workload_scale": env.features.workload_scale,
                               "eft_censored_s": ref["censored_task_response_s"],
                               "eft_p95_s": ref["p95_task_response_s"],
                               "eft_unscaled_censored_s": unscaled_eft["censored_task_response_s"]}
        for label, _, _ in VARIANTS:
            r = next(x for x in per[label][0] if x["policy"] == policy and x["servers"] == n)
            eps = [e for e in per[label][1] if e["policy"] == policy and e["servers"] == n]
            paired = next(p for p in paired_differences(eps + [e for e in eft_eps
                                                               if e["servers"] == n], "eft",
                                                    "task")
                          if p["servers"] == n)
            row[label] = {"censored_s": r["censored_task_response_s"],
                          "ratio": r["censored_task_response_s"] / ref["censored_task_response_s"],
                          "censored_rel_diff": paired["censored_rel_diff"],
                          "censored_ci95": paired["censored_ci95_half_width"],
                          "p95_s": r["p95_task_response_s"], "completed_tasks": r["completed_tasks"],
                          "eft_completed_tasks": ref["completed_tasks"],
                          "guard_overrides": r["guard_overrides"],
                          "truncated_episodes": r["truncated_episodes"]}
        out.append(row)
    return out


def format_compare(rows: Sequence[dict[str, Any]], policy: str) -> str:
    """A Markdown table: per family and N, EFT and the policy's censored mean / EFT's."""
    def ratio(v: dict) -> str:
        return f"{v['ratio']:.3f}" if math.isfinite(v["ratio"]) else "n/a"

    lines = [f"| family | N | k | EFT resp all s | EFT p95 s | {policy} resp all s | "
             f"{policy} / EFT | {policy} p95 s | guard overrides / ep. | no guard / EFT | "
             f"no scale / EFT | neither / EFT |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["shipped"]
        lines.append(f"| {r['family']} | {r['servers']} | {r['workload_scale']:g} | "
                     f"{r['eft_censored_s']:.3f} | {r['eft_p95_s']:.3f} | {s['censored_s']:.3f} | "
                     f"**{ratio(s)}** | {s['p95_s']:.3f} | {s['guard_overrides']:.1f} | "
                     f"{ratio(r['no guard'])} | {ratio(r['no scale'])} | {ratio(r['neither'])} |")
    return "\n".join(lines)


def write_json(path: str | Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**meta, "rows": list(rows)}, indent=2))
