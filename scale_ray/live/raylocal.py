"""What a Ray cluster started by this process needs on a machine where Ray never ran.

Two things break a fresh machine (nothing under ``<system temp>/ray``, no ``~/.ray``):

* ``ray.cluster_utils.Cluster`` writes the head's address to
  ``<system temp>/ray/ray_current_cluster`` (``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``) even
  when the cluster has its own temp dir, and does not create that directory first
  (``FileNotFoundError``).
* With ``RAY_AUTH_MODE=token`` every process of the cluster needs a token. Ray's ``ray.init``
  writes one to ``~/.ray/auth_token`` when none exists, but ``Cluster`` does not: without a token
  the GCS exits at once and the start fails with ``Timed out waiting for file
  .../gcs_server_port_...``.

:func:`prepare_local_ray` fixes both for the clusters we start ourselves: it creates the
directory, and when token auth is asked for and no token is configured it generates one and puts
it in ``RAY_AUTH_TOKEN`` of this process's environment, which the driver and every Ray process we
start (they inherit it) read. It never writes ``~/.ray``. Call it before starting a cluster;
calling it again is cheap and keeps the same token.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import MutableMapping

AUTH_MODE_VAR = "RAY_AUTH_MODE"
AUTH_TOKEN_VAR = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"


def ray_temp_root(environ: MutableMapping[str, str] | None = None) -> Path:
    """``<system temp>/ray``: where Ray keeps ``ray_current_cluster`` (its own rule)."""
    env = os.environ if environ is None else environ
    if env.get("RAY_TMPDIR"):
        base = env["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and env.get("TMPDIR"):
        base = env["TMPDIR"]
    else:
        base = "/tmp"
    return Path(base) / "ray"


def token_auth_requested(environ: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(AUTH_MODE_VAR, "").strip().lower() == "token"


def has_auth_token(environ: MutableMapping[str, str] | None = None) -> bool:
    """A token Ray would find (:func:`read_auth_token`)."""
    return read_auth_token(environ) is not None


def read_auth_token(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The token Ray would use, in its order: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``; None without one."""
    env = os.environ if environ is None else environ
    if env.get(AUTH_TOKEN_VAR, "").strip():
        return env[AUTH_TOKEN_VAR].strip()
    path = env.get(AUTH_TOKEN_PATH_VAR)
    if path:
        return _read(Path(path).expanduser())
    home = env.get("HOME") or str(Path.home())
    return _read(Path(home) / ".ray" / "auth_token")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def ensure_auth_token(environ: MutableMapping[str, str] | None = None) -> bool:
    """When ``RAY_AUTH_MODE=token`` and no token is configured, put a fresh one in
    ``RAY_AUTH_TOKEN`` of ``environ`` (default: this process's environment). Returns whether it
    set one."""
    env = os.environ if environ is None else environ
    if not token_auth_requested(env) or has_auth_token(env):
        return False
    env[AUTH_TOKEN_VAR] = secrets.token_hex(32)  # 256 bits, as `ray get-auth-token --generate`
    if env is os.environ and "ray._raylet" in sys.modules:
        # Ray caches the token (or its absence) per process: read the new one from now on.
        try:
            sys.modules["ray._raylet"].AuthenticationTokenLoader.instance().reset_cache()
        except Exception:  # an older/newer Ray without the loader: nothing cached to drop
            pass
    return True


def prepare_local_ray(environ: MutableMapping[str, str] | None = None) -> None:
    """Make this machine ready for a Ray cluster this process starts (see the module doc):
    create ``<system temp>/ray`` and, under ``RAY_AUTH_MODE=token`` without a token, generate one
    into ``RAY_AUTH_TOKEN``. Pass ``environ`` to prepare the environment of a subprocess instead."""
    ray_temp_root(environ).mkdir(parents=True, exist_ok=True)
    ensure_auth_token(environ)


def pid_alive(pid: int, reap: bool = False) -> bool:
    """Whether process ``pid`` exists. With ``reap``, an exited child of this process is reaped
    first (a zombie still answers signal 0; not for a child a ``Popen`` will wait for)."""
    if reap:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        except ChildProcessError:
            pass
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
