"""Connect a driver to the Ray cluster that runs the scheduler service (``client.connect``).

Two things a new user met in the README's second shell (issue 73):

* **Token authentication.** A cluster started by ``serve run`` (or ``ray.init()``) on Ray 2.60
  requires a token, kept in the ``~/.ray/auth_token`` of whoever started it. A driver without
  it retries for about 20 s and fails with ``ConnectionError``, the only hint being
  "RAY_AUTH_MODE is currently 'disabled'". :func:`connect` uses a token it has (setting
  ``RAY_AUTH_MODE=token`` when unset, as Ray does for ``address="auto"`` only), and asks the
  GCS once, with a one-second timeout, whether it accepts this process; if not it raises
  :class:`AuthNeeded` with the one line that fixes it (the starter's token file when it can be
  read from the cluster's local processes).
* **Other processes' log lines.** Ray forwards the Serve replicas' log lines (``CALL submit OK
  44.4ms``, audit lines) to every driver, and Serve's handle logs at INFO and WARNING in the
  caller (``Failed to get queue length ... within 0.1s`` on a busy machine). A client does not
  need them: :func:`quiet_serve_logs` drops them (the replica log keeps them).

Ray's auth and log plumbing used here is private (``ray._private``): it is wrapped here only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .live.raylocal import AUTH_MODE_VAR, AUTH_TOKEN_PATH_VAR, AUTH_TOKEN_VAR, read_auth_token

PROBE_TIMEOUT_S = 1.0
#: Serve's own actors: their forwarded log lines are the service's, not the client's
SERVE_ACTORS = ("ServeReplica:", "ServeController", "ProxyActor", "ServeProxy")
_QUIET = "_scale_ray_quiet"


class AuthNeeded(ConnectionError):
    """The cluster requires a Ray auth token this process does not have (or sends a wrong
    one); the message is the line that fixes it."""


def connect(address: str = "auto", **init_kwargs: Any) -> Any:
    """``ray.init(address, **init_kwargs)`` for a client of the service, after the token check
    (:class:`AuthNeeded` in about a second instead of Ray's 20 s of retries); Serve's log lines
    quieted in this driver. Already connected: nothing but the quieting. Returns ``ray``."""
    import ray

    if not ray.is_initialized():
        gcs = gcs_address(address)
        if gcs is not None:
            use_token_if_present()
            check_token(gcs)
        ray.init(address=address, **init_kwargs)
    quiet_serve_logs()
    return ray


def gcs_address(address: str | None) -> str | None:
    """The ``host:port`` of the GCS ``address`` means (``auto``: the local cluster Ray would
    pick, ``RAY_ADDRESS`` first), or None when there is none to check (Ray Client ``ray://``,
    no cluster found: ``ray.init`` then says what is wrong)."""
    from ray._private.services import get_ray_address_from_environment

    try:
        addr = get_ray_address_from_environment(address, None)
    except ConnectionError:
        return None
    if not addr or "://" in addr or ":" not in addr:
        return None
    return addr


def use_token_if_present(environ: dict | None = None) -> None:
    """``RAY_AUTH_MODE=token`` when it is unset and a token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), for any address (Ray does it for
    ``auto`` only)."""
    env = os.environ if environ is None else environ
    if AUTH_MODE_VAR not in env and read_auth_token(env) is not None:
        env[AUTH_MODE_VAR] = "token"
        if env is os.environ:  # Ray caches the mode per process: re-read it, as Ray does when
            from ray._raylet import Config  # it enables token auth itself

            Config.initialize("")


def check_token(gcs: str, timeout_s: float = PROBE_TIMEOUT_S, environ: dict | None = None
                ) -> None:
    """Ask the GCS at ``gcs`` for its cluster id with this process's token (if token auth is
    on in ``environ``, default this process's); :class:`AuthNeeded` when it answers
    ``UNAUTHENTICATED``. Any other failure (nothing listening, a timeout) is left to
    ``ray.init``."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    env = os.environ if environ is None else environ
    token = read_auth_token(env) if env.get(AUTH_MODE_VAR, "").lower() == "token" else None
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(gcs) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s,
                              metadata=metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise AuthNeeded(auth_fix(gcs, token is not None, env)) from None


def auth_fix(gcs: str, sent_token: bool, environ: dict | None = None) -> str:
    """The one line that connects this process to ``gcs``."""
    env = os.environ if environ is None else environ
    path = starter_token_path(gcs)
    where = (f"RAY_AUTH_TOKEN_PATH={path}" if path is not None else
             f"{AUTH_TOKEN_PATH_VAR}=<the ~/.ray/auth_token of whoever started Ray> (or "
             f"{AUTH_TOKEN_VAR}=<its token>)")
    why = ("the token this process sends is not the cluster's" if sent_token
           else "this process has no token for it")
    unset = f"unset {AUTH_TOKEN_VAR}; " if env.get(AUTH_TOKEN_VAR) and path else ""
    return (f"the Ray cluster at {gcs} requires token authentication and {why}; run: "
            f"{unset}export {AUTH_MODE_VAR}=token {where}")


def starter_token_path(gcs: str) -> Path | None:
    """The token file of the cluster at ``gcs`` when its processes run on this machine as this
    user (their environment names ``RAY_AUTH_TOKEN_PATH`` or a ``HOME`` holding
    ``.ray/auth_token``); None otherwise. The token itself is never read here."""
    needle = f"--gcs-address={gcs}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "cmdline").read_bytes():
                continue
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0")
                       if b"=" in kv)
        except OSError:
            continue
        named = env.get(AUTH_TOKEN_PATH_VAR.encode())
        candidates = [Path(named.decode())] if named else []
        if env.get(b"HOME"):
            candidates.append(Path(env[b"HOME"].decode()) / ".ray" / "auth_token")
        for path in candidates:
            if path.is_file():
                return path
    return None


def quiet_serve_logs() -> None:
    """In this driver: Serve's own logger at ERROR (its handle's INFO and WARNING lines), and
    the Serve actors' forwarded log lines dropped (this driver's own tasks' lines still
    print). Idempotent."""
    logging.getLogger("ray.serve").setLevel(logging.ERROR)
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    for name, handle in list(dispatcher.handlers):
        if name == "ray_print_logs" and not getattr(handle, _QUIET, False):
            dispatcher.remove_handler(name)
            dispatcher.add_handler(name, _without_serve_actors(handle))


def _without_serve_actors(handle: Any) -> Any:
    def emit(data: dict) -> None:
        if not str(data.get("actor_name") or "").startswith(SERVE_ACTORS):
            handle(data)

    setattr(emit, _QUIET, True)
    return emit
