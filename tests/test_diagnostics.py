"""The greedy-livelock diagnosis of results/paper/README.md, on the paper-budget run kept in git."""

from pathlib import Path

import pytest

from scale_ray.config import load_env
from scale_ray.diagnostics import main, stuck_tail

ROOT = Path(__file__).resolve().parents[1]
STUCK = ROOT / "results/paper/runs/crossattn_s42/policy"
pytestmark = pytest.mark.skipif(not STUCK.is_dir(), reason="results/paper run not in checkout")


@pytest.mark.slow
def test_the_documented_truncated_episode_is_a_livelock_on_a_never_fitting_server():
    env = load_env(ROOT / "configs/env/paper.yaml", servers=16)
    r = stuck_tail(env, str(STUCK), episode=6, base_seed=20260605, after_s=1900.0)
    assert r["truncated"] and r["completed_tasks"] < r["arrived_tasks"]
    (d,) = r["tail"][:1]
    # one task, answered with one server that can never hold it, while servers that fit are idle
    assert d["decisions"] >= 900
    assert d["server_memory_gb"] < d["task_memory_gb"]
    assert d["idle_servers_that_fit"] > 0
    assert d["server_id"] in d["parents_server_ids"]   # the data-local choice


@pytest.mark.slow
def test_masking_never_fitting_servers_ends_the_livelock():
    env = load_env(ROOT / "configs/env/paper.yaml", ["mdp.mask_infeasible=true"], servers=16)
    r = stuck_tail(env, str(STUCK), episode=6, base_seed=20260605, after_s=1900.0)
    assert not r["truncated"] and r["completed_tasks"] == r["arrived_tasks"]
    assert r["tail"] == []


def test_diagnostics_cli_rejects_a_bad_size(capsys):
    with pytest.raises(SystemExit):
        main([str(STUCK), "--servers", "0", "--episode", "6"])
    assert "--servers must be >= 1" in capsys.readouterr().err
