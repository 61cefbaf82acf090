"""The trained policies shipped in policies/artifacts load by name and run at any N."""

from __future__ import annotations

import numpy as np
import pytest

from envs.encoding import ServerView, TaskView, encode
from envs.config import FeatureConfig
from policies import ARTIFACTS_DIR, default_policy, get_policy, shipped_policies
from policies.artifact import read_meta


def test_scale_and_crossattn_are_shipped_and_scale_is_the_default():
    assert {"scale", "crossattn"} <= set(shipped_policies())
    assert default_policy() == "scale"


@pytest.mark.parametrize("name,algorithm", [("scale", "ppo+srr"), ("crossattn", "ppo")])
@pytest.mark.parametrize("n", [4, 16, 48, 1024])
def test_shipped_policy_runs_at_any_size(name, algorithm, n):
    pol = get_policy(name)
    meta = read_meta(ARTIFACTS_DIR / name)
    assert meta["algorithm"] == algorithm and meta["train_servers"] == 16 and meta["iterations"] > 0
    servers = [ServerView(compute=c, memory_gb=m, remaining_s=r)
               for c, m, r in ((1.0, 8.0, 0.0), (2.0, 32.0, 1.0), (4.0, 80.0, 0.0), (2.0, 32.0, 0.0))] * (n // 4)
    obs = encode(TaskView(4.0, 16.0, 0.3, 1, 0.5), servers, FeatureConfig())
    scores = pol.scores(obs)
    assert scores.shape == (n,) and np.isfinite(scores[obs["action_mask"] > 0]).all()
    assert 0 <= pol.act(obs) < n
