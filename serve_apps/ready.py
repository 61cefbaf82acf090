"""The line that says a service is ready: once Serve's proxy routes the application, the replica
logs ``... ready at http://HOST:PORT/PREFIX`` (``serve run`` itself never says so, and a request
sent before then gets Serve's ``Path '...' not found``).

:func:`announce` runs in a daemon thread of the replica: it polls the local proxy's
``/-/routes`` (Serve's own endpoint: route prefix -> application) until the application is
routed, at most ``timeout_s``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from typing import Callable

__all__ = ["announce", "routed_prefix"]


def routed_prefix(base_url: str, app: str) -> str | None:
    """The route prefix the proxy at ``base_url`` routes to application ``app``; None while it
    routes none (or cannot be reached)."""
    try:
        with urllib.request.urlopen(f"{base_url}/-/routes", timeout=2) as r:
            routes = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return next((p for p, a in routes.items() if a == app), None) if isinstance(routes, dict) \
        else None


def _proxy_url() -> str:
    """``http://HOST:PORT`` of this node's Serve proxy (the controller's HTTP options)."""
    from ray.serve.context import _get_global_client

    cfg = _get_global_client().http_config
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
    return f"http://{host}:{cfg.port}"


def announce(log: logging.Logger, what: str, paths: str, timeout_s: float = 120.0,
             base_url: str | None = None, app: str | None = None,
             poll_s: float = 0.5) -> threading.Thread:
    """Log ``{what} ready at {url}{prefix} ({paths})`` once the proxy routes this replica's
    application (a warning after ``timeout_s`` if it never does); returns the thread."""
    def run(get_base: Callable[[], str]) -> None:
        nonlocal app
        try:
            if app is None:
                from ray import serve

                app = serve.get_replica_context().app_name
            base = get_base()
        except Exception as e:  # noqa: BLE001 - said, not raised: the service still runs
            log.warning("%s: cannot tell when it is ready (%s: %s)", what, type(e).__name__, e)
            return
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            prefix = routed_prefix(base, app)
            if prefix is not None:
                log.info("%s ready at %s%s (%s)", what, base, prefix.rstrip("/"), paths)
                return
            time.sleep(poll_s)
        log.warning("%s: the proxy at %s did not route application %r within %.0f s", what,
                    base, app, timeout_s)

    t = threading.Thread(target=run, args=((lambda: base_url) if base_url else _proxy_url,),
                         name="announce-ready", daemon=True)
    t.start()
    return t
