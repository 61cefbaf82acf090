"""Typed configuration: unknown keys and bad values are rejected with the key's name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envs.config import ConfigError, EnvConfig, build, load_env_config
from scale_ray.config import load_env, parse_overrides


@pytest.mark.parametrize("data,match", [
    ({"workload": {"horizon": 10}}, r"unknown key env\.workload\.horizon"),
    ({"workload": {"arrival_rate_16": -1}}, r"env\.workload\.arrival_rate_16: -1\.0 is out of range; allowed: > 0"),
    ({"workload": {"arrival_rate_16": "fast"}}, r"env\.workload\.arrival_rate_16: expected a number"),
    ({"cluster": {"servers": 0}}, r"env\.cluster\.servers: 0 is out of range; allowed: >= 1"),
    ({"mdp": {"first_level": "fifo"}}, r"env\.mdp\.first_level: 'fifo' is not allowed"),
    ({"mdp": {"order": "lifo"}}, r"env\.mdp\.order: 'lifo' is not allowed; choose one of \['hop', "
                                 r"'upward_rank', 'fifo', 'edf', 'srpt', 'las'\]"),
    ({"mdp": {"order": "fifo", "first_level": "hop"}}, r"mdp\.first_level: 'hop' contradicts"),
    ({"mdp": {"edf_factor": -1}}, r"env\.mdp\.edf_factor: -1\.0 is out of range"),
    ({"mdp": {"mask_infeasible": "yes"}}, r"env\.mdp\.mask_infeasible: expected true/false"),
    ({"reward": {"invalid_penalty": 0.5}}, r"env\.reward\.invalid_penalty"),
    ({"workload": {"min_tasks": 9, "max_tasks": 3}}, r"min_tasks"),
    ({"cluster": {"tiers": [{"name": "a", "compute": 0, "memory_gb": 1}]}}, r"env\.cluster\.tiers\[0\]\.compute"),
    ({"cluster": {"tiers": []}}, r"at least one tier"),
    ({"dynamics": {"events": [{"t": 1, "kind": "add"}]}}, r"dynamics\.events\[0\]\.tier"),
    ({"dynamics": {"events": [{"t": 1, "kind": "explode"}]}}, r"dynamics\.events\[0\]\.kind"),
    ({"workload": {"compute_gflop": {"mean": float("nan")}}}, r"must be finite"),
    ({"n_max": 4}, r"n_max: 4 is smaller than cluster\.servers"),
])
def test_bad_values_name_the_key(data, match):
    with pytest.raises(ConfigError, match=match):
        load_env_config(data)


@pytest.mark.parametrize("n,expected", [(16, (4, 10, 2)), (32, (8, 20, 4)), (48, (12, 30, 6)),
                                        (1024, (256, 640, 128)), (10, (3, 6, 1)), (1, (0, 1, 0))])
def test_tier_mix_scales_by_ratio(n, expected):
    cfg = load_env(None, servers=n)
    assert tuple(cfg.cluster.tier_counts().values()) == expected
    assert sum(expected) == n


def test_explicit_tier_mix():
    cfg = build(EnvConfig, {"cluster": {"servers": 10, "tiers": [
        {"name": "small", "compute": 1, "memory_gb": 8, "ratio": 6},
        {"name": "medium", "compute": 2, "memory_gb": 32, "ratio": 2},
        {"name": "large", "compute": 4, "memory_gb": 80, "count": 2}]}})
    assert cfg.cluster.tier_counts() == {"small": 6, "medium": 2, "large": 2}
    with pytest.raises(ConfigError, match="explicit tier counts"):
        build(EnvConfig, {"cluster": {"servers": 3, "tiers": [
            {"name": "a", "compute": 1, "memory_gb": 8, "count": 2},
            {"name": "b", "compute": 1, "memory_gb": 8, "count": 2}]}})


def test_shipped_env_configs_load_and_inherit(repo):
    paper = load_env(repo / "configs/env/paper.yaml")
    high = load_env(repo / "configs/env/high_load.yaml")
    assert paper.workload.arrival_rate_16 == 0.7 and high.workload.arrival_rate_16 == 1.14
    assert high.cluster == paper.cluster and high.mdp == paper.mdp
    real = load_env(repo / "configs/env/realistic.yaml")  # beyond the paper: inherits high_load
    assert real.workload == high.workload and real.cluster == paper.cluster
    assert real.mdp.transfer_delays_start and not real.mdp.head_of_line_blocking
    assert real.mdp.mask_infeasible and real.mdp.ask_only_startable
    assert real.reward.kind == "response"
    assert (real.reward.w1, real.reward.w2) == (paper.reward.w1, paper.reward.w2)
    # the paper's regime as issue 48 reads it: paper.yaml with 12-decision episodes
    regime = load_env(repo / "configs/env/paper_regime.yaml")
    assert regime.mdp.max_decisions == 12 and regime.workload == paper.workload
    assert regime.cluster == paper.cluster and regime.reward == paper.reward


def test_overrides_are_validated():
    cfg = load_env(None, ["workload.horizon_s=50", "mdp.mask_infeasible=true"])
    assert cfg.workload.horizon_s == 50.0 and cfg.mdp.mask_infeasible
    assert parse_overrides(["a.b.c=[1, 2]"]) == {"a": {"b": {"c": [1, 2]}}}
    with pytest.raises(ConfigError, match="unknown key env.workload.nope"):
        load_env(None, ["workload.nope=1"])


def test_cli_reports_config_errors_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload:\n  arrival_rate_16: 0\n")
    p = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--env-config", str(bad),
                        "--workers", "1", "--episodes", "1"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "env.workload.arrival_rate_16: 0.0 is out of range; allowed: > 0" in p.stderr


def test_yaml_off_and_on_are_the_choices_they_spell():
    """YAML 1.1 reads `off` / `on` as booleans: a choice named so still means that choice."""
    from scale_ray.live import LiveConfig

    assert build(LiveConfig, parse_overrides(["hedge=off", "estimator=off"]), "live").hedge == "off"
    with pytest.raises(ConfigError, match="hedge: True is not allowed"):
        build(LiveConfig, {"hedge": True}, "live")  # no choice spells `on`


def _config_classes():
    """Every dataclass a config file or a Serve app's args can build: the roots and the
    sections and items reachable through their fields."""
    import dataclasses
    import typing

    from envs.config import EnvConfig
    from envs.runtime import RuntimeConfig
    from policies.guard import GuardConfig
    from policies.lookahead import LookaheadConfig
    from policies.networks import ModelConfig
    from policies.srr import SrrConfig
    from scale_ray.distill import DistillConfig
    from scale_ray.live.config import LiveConfig
    from scale_ray.train_config import TrainConfig
    from serve_apps.placement import PlacementArgs
    from serve_apps.scheduler_config import SchedulerArgs

    seen: dict[type, None] = {}
    stack = [EnvConfig, RuntimeConfig, GuardConfig, LookaheadConfig, ModelConfig, SrrConfig,
             DistillConfig, LiveConfig, TrainConfig, PlacementArgs, SchedulerArgs]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen[c] = None
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            todo = [hints[f.name]]
            while todo:
                t = todo.pop()
                if dataclasses.is_dataclass(t):
                    stack.append(t)
                todo.extend(typing.get_args(t))
    return list(seen)


def test_every_config_field_says_what_it_is():
    """Each field of each config section carries a one-line doc where it is declared (its
    ``rng(doc=...)`` metadata): 0 without."""
    import dataclasses

    classes = _config_classes()
    assert len(classes) >= 25  # the walk reaches the sections, not only the roots
    missing = [f"{c.__module__}.{c.__name__}.{f.name}" for c in classes
               for f in dataclasses.fields(c) if not f.metadata.get("doc", "").strip()]
    assert not missing, missing
