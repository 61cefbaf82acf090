"""The figures of a reproduction: training curves (``fig6_training.png``) and mean task
response against N (``response_vs_n.png``)."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def write_plots(out: Path, runs: list[dict], results: dict) -> None:
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
        for ax, key in ((axes[0], "episode_return"), (axes[1], "mean_task_response_s")):
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
    panels = [("table4", "censored_task_response_s", "paper action space (resp all)"),
              ("table4_masked", "mean_task_response_s", "never-fitting servers masked")]
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
