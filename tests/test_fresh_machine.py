"""The live path on a machine where Ray never ran (issue 15), and progress lines in CI logs.

A fresh machine has no ``<system temp>/ray`` (``ray.cluster_utils.Cluster`` writes its address file
there) and no ``~/.ray/auth_token`` (needed under ``RAY_AUTH_MODE=token``): our local clusters
prepare both through :func:`scale_ray.live.raylocal.prepare_local_ray`, without writing ``~/.ray``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scale_ray.live.raylocal import has_auth_token, prepare_local_ray, ray_temp_root

REPO = Path(__file__).resolve().parent.parent


def _fresh_env(tmp: Path, auth_mode: str | None) -> dict[str, str]:
    """This process's environment with a fresh RAY_TMPDIR and HOME, no token, no cluster."""
    env = dict(os.environ)
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "TMPDIR"):
        env.pop(var, None)
    (tmp / "home").mkdir()
    (tmp / "t").mkdir()
    env.update(HOME=str(tmp / "home"), RAY_TMPDIR=str(tmp / "t"))
    if auth_mode is not None:
        env["RAY_AUTH_MODE"] = auth_mode
    return env


# ---- prepare_local_ray on an environment mapping (no Ray started) ----

def test_prepare_creates_the_ray_temp_dir_and_no_token_without_token_auth(tmp_path):
    env = _fresh_env(tmp_path, None)
    assert not (tmp_path / "t" / "ray").exists()
    prepare_local_ray(env)
    assert ray_temp_root(env) == tmp_path / "t" / "ray"
    assert (tmp_path / "t" / "ray").is_dir()
    assert "RAY_AUTH_TOKEN" not in env
    env["RAY_AUTH_MODE"] = "disabled"
    prepare_local_ray(env)
    assert "RAY_AUTH_TOKEN" not in env
    assert list((tmp_path / "home").iterdir()) == []


def test_prepare_brings_a_token_under_token_auth_without_writing_home(tmp_path):
    env = _fresh_env(tmp_path, "token")
    assert not has_auth_token(env)
    prepare_local_ray(env)
    token = env["RAY_AUTH_TOKEN"]
    assert len(token) == 64 and int(token, 16) >= 0
    assert has_auth_token(env)
    prepare_local_ray(env)  # again: the same token
    assert env["RAY_AUTH_TOKEN"] == token
    assert list((tmp_path / "home").iterdir()) == [], "~/.ray must not be written"


@pytest.mark.parametrize("source", ["env", "path", "home"])
def test_prepare_keeps_an_existing_token(tmp_path, source):
    env = _fresh_env(tmp_path, "token")
    if source == "env":
        env["RAY_AUTH_TOKEN"] = "a" * 64
    elif source == "path":
        (tmp_path / "tok").write_text("b" * 64)
        env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "tok")
    else:
        (tmp_path / "home" / ".ray").mkdir()
        (tmp_path / "home" / ".ray" / "auth_token").write_text("c" * 64)
    prepare_local_ray(env)
    assert env.get("RAY_AUTH_TOKEN") == ("a" * 64 if source == "env" else None)


# ---- the smallest live run, in a subprocess with a fresh RAY_TMPDIR and HOME ----

@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("auth_mode", [None, "token"], ids=["auth-unset", "auth-token"])
def test_run_workflows_on_a_fresh_machine(tmp_path, auth_mode):
    # a short base: Ray's unix sockets live below the cluster's temp dir (108-byte limit)
    tmp = Path(tempfile.mkdtemp(prefix="sfm_", dir="/tmp"))
    try:
        env = _fresh_env(tmp, auth_mode)
        cmd = [sys.executable, "-m", "scale_ray.cli", "run-workflows", "--nodes", "2",
               "--servers-per-node", "1", "--policy", "eft", "--workflows", "3",
               "--time-scale", "0.05", "--timeout", "120"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=360)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # our own subprocess's group only
            out, _ = proc.communicate(timeout=60)
            pytest.fail(f"run-workflows did not finish:\n{out[-4000:]}")
        assert proc.returncode == 0, out[-4000:]
        assert "policy eft: 3/3 workflows completed, 0 failed" in out, out[-4000:]
        assert (tmp / "t" / "ray").is_dir()
        assert not (tmp / "home" / ".ray").exists(), "~/.ray was written in the fresh HOME"
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


# ---- progress lines: one line per update off a terminal, one rewritten line on it ----

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_eval_progress_writes_one_summary_line_off_a_terminal(capsys):
    """Off a terminal (a CI log, `make demo` piped) one line when the last episode is done,
    not one per episode (issue 73 item 10: 56 lines in the demo)."""
    from scale_ray.evaluation import stderr_progress

    report = stderr_progress("eval")
    for i in range(4):
        report(i, 3)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n")
    assert lines[0].startswith("eval: 3 episodes in ")


def test_eval_progress_rewrites_one_line_on_a_terminal(monkeypatch):
    from scale_ray.evaluation import stderr_progress

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    report = stderr_progress("eval")
    report(1, 2)
    assert tty.getvalue().startswith("\reval: 1/2") and "\n" not in tty.getvalue()
    report(2, 2)
    assert tty.getvalue().count("\r") == 2 and tty.getvalue().endswith("\n")


def test_live_progress_writes_whole_lines_off_a_terminal(capsys):
    from scale_ray.live.runner import stderr_progress

    show = stderr_progress("eft")
    for i in range(11):
        show(i, 10)
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    assert err.splitlines()[-1] == "eft: 10/10 workflows done"
