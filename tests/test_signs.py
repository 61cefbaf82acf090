"""One sign convention (issue 44, item 5): a relative difference is value / reference - 1,
printed signed with its direction (``-21.1 % lower``); no printout says "faster" or prints a gain
with the other sign."""

from __future__ import annotations

import math
import re
from pathlib import Path

from scale_ray.relative import rel

REPO = Path(__file__).resolve().parents[1]

# a signed percentage formatted in code: {x:+.1f}% / {x:+.1%} / %+.1f%% (only relative.py may)
SIGNED_FORMAT = re.compile(r"\{[^{}]*:\+\.\d+%\}|\{[^{}]*:\+\.\d+f\}\s?%|%\+\.\d+f%%")


def test_rel_says_the_direction():
    assert rel(-0.2113) == "-21.1 % lower" and rel(0.03) == "+3.0 % higher"
    assert rel(0.0004) == "+0.0 %" and rel(math.nan) == "n/a"
    assert rel(-0.02101, 2) == "-2.10 % lower"


def test_no_code_formats_a_signed_percentage_or_writes_a_gain_key():
    bad = []
    for root in ("scale_ray", "serve_apps", "envs", "policies"):
        for p in sorted((REPO / root).rglob("*.py")):
            if p.name == "relative.py":
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if SIGNED_FORMAT.search(line) or re.search(
                        r"%\s*faster|negative = faster|[\"']\w*(improvement|gain_vs)\w*[\"']", line):
                    bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, ("format it with scale_ray.relative.rel; JSON keys: *rel_diff* "
                     "(value / reference - 1):\n" + "\n".join(bad))


def test_printouts_follow_the_convention():
    from scale_ray.bench.twin import format_rows
    from scale_ray.commands.run_workflows import format_comparison
    from scale_ray.evaluation import format_paired

    row = {"workflows_completed": 10, "workflows_submitted": 10, "p95_workflow_response_s": 1.0,
           "mean_task_response_s": 0.5}
    out = format_comparison({"scale": {**row, "mean_workflow_response_s": 0.8},
                             "ray-default": {**row, "mean_workflow_response_s": 1.0}})
    assert "-20.0 % lower" in out and "faster" not in out
    paired = format_paired([{"policy": "eft", "reference": "eft@hop", "servers": 16,
                             "metric": "workflow", "mean_rel_diff": -0.0865,
                             "ci95_half_width": 0.0265, "episodes": 30, "better": 28,
                             "worse": 2}])
    assert "-8.65 % lower" in paired and "negative" not in paired
    twin = format_rows([{"policy": "eft", "live_rel_diff_vs_ref": -0.021,
                         "twin_rel_diff_vs_ref": -0.039}])
    assert "-2.1 % lower" in twin and "-3.9 % lower" in twin and "+2.1" not in twin


def test_docs_say_no_faster_percentages():
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    bad = [f"{p.name}: {m.group(0)}" for p in docs
           for m in re.finditer(r"[+−-]?\d+(?:\.\d+)? ?% faster|negative = faster", p.read_text())]
    assert not bad, bad
