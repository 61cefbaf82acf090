"""`scale-ray cluster up|down|status` (issue 27): a local heterogeneous cluster started in the
background with its own temp dir and token, reachable from another process, stopped by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.config import ConfigError
from scale_ray.config import load_env
from scale_ray.live.localcluster import parse_tiers

REPO = Path(__file__).resolve().parent.parent


def test_tiers_spec_is_validated():
    c = parse_tiers("small:1,large:2", load_env(None).cluster)
    assert {t.name: t.count for t in c.tiers} == {"small": 1, "medium": 0, "large": 2}
    assert c.servers == 3
    for bad, what in [("huge:1", "unknown tier"), ("small", "NAME:COUNT"), ("small:0", "no server"),
                      ("small:x", "NAME:COUNT")]:
        with pytest.raises(ConfigError, match=what):
            parse_tiers(bad, load_env(None).cluster)


def _cli(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "scale_ray.cli", "cluster", *args],
                          capture_output=True, text=True, cwd=str(REPO), env=env, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cluster_up_connect_and_down(tmp_path):
    state = tmp_path / "state.json"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "RAY_TMPDIR": str(tmp_path / "rt")}
    env.pop("RAY_ADDRESS", None)
    up = _cli("up", "--tiers", "small:1,large:1", "--servers-per-node", "1", "--state", str(state),
              "--address-file", str(tmp_path / "addr"), "--json", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    info = json.loads(up.stdout)
    try:
        assert info["servers"] == {"small": 1, "large": 1} and info["token"]
        assert (tmp_path / "addr").read_text().strip() == info["address"]
        assert _cli("up", "--state", str(state), env=env).returncode == 1  # one at a time
        # another process connects with the printed address and token and sees both tiers
        code = ("import ray; from scale_ray.live.cluster import live_nodes; ray.init(); "
                "print(sorted(n.tier for n in live_nodes()))")
        drv = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=str(REPO), timeout=120,
                             env={**env, "RAY_ADDRESS": info["address"], "RAY_AUTH_MODE": "token",
                                  "RAY_AUTH_TOKEN": info["token"]})
        assert drv.returncode == 0, drv.stderr[-2000:]
        assert drv.stdout.strip().splitlines()[-1] == "['large', 'small']"
        st = _cli("status", "--state", str(state), env=env)
        assert st.returncode == 0 and info["address"] in st.stdout
    finally:
        down = _cli("down", "--state", str(state), env=env)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    alive = [p for p in info["pids"] + [info["pid"]] if Path(f"/proc/{p}").exists()
             and b"zombie" not in Path(f"/proc/{p}/status").read_bytes().lower()]
    assert alive == [] and not state.exists()
    assert _cli("status", "--state", str(state), env=env).returncode == 1
