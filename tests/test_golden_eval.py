"""Evaluation numbers do not move under refactoring: episode 0 at N = 16 of several settings
(paper, unmasked, realistic with the lookahead planner, backlog features, no head-of-line
blocking, advance-to-next-event, run-time noise with hedging under server failures), replayed and compared exactly with what the same command
printed before the decision core existed (tests/data/golden_eval.json, commit fae517d)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scale_ray.config import load_env
from scale_ray.evaluation import evaluate

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_eval.json").read_text())["cases"]


@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c['case']}-{c['policy']}" for c in GOLDEN])
def test_evaluation_equals_the_recorded_numbers(case, repo, monkeypatch):
    monkeypatch.chdir(repo)  # env config paths are relative to the repo
    env = load_env(case["env"], case["set"])
    _, episodes = evaluate(env, [case["policy"]], [case["servers"]], 1, case["seed"], workers=1)
    got = episodes[0]
    assert got["episode"] == 0
    assert {k: got[k] for k in case["metrics"]} == case["metrics"]
