"""The policy a Serve app decides with, and its hot swap (both apps: placement and scheduler).

:class:`PolicyHolder` loads and tries a policy (``load(spec)``: raises for a bad one; the
first load has no fallback, so a bad ``policy`` argument fails the deploy), swaps to a new one
from ``user_config`` loaded and tried off the event loop (one swap at a time; requests keep
being served meanwhile), keeps the current one when a swap fails (``last_swap_error``, logged
at WARNING: never raises, or Serve would stop the replica) and reports ``swaps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)


class PolicyHolder:
    """Holds ``current`` (what ``load(spec)`` returned for ``spec``); see the module doc."""

    def __init__(self, load: Callable[[str], Any], spec: str, app: str,
                 name: Callable[[Any], str], logger: logging.Logger | None = None):
        # ``logger``: the app module's (Serve's replica log records the deployment module's)
        self._load, self.app, self._name, self._log = load, app, name, logger or log
        self.current = load(spec)
        self.spec = spec
        self.loaded_at = time.time()
        self.swaps = 0
        self.last_swap_error: dict | None = None
        self.lock = asyncio.Lock()  # one reconfigure at a time (the app holds it)

    async def swap(self, spec: str | None,
                   install: Callable[[Any], Awaitable[None] | None] | None = None) -> bool:
        """Load and try ``spec`` off the event loop and make it current (``install(new)`` first,
        e.g. hand it to a scheduler thread); None or the current spec: nothing to swap. False
        when it failed (``last_swap_error`` says why); the current policy stays."""
        if spec is None or spec == self.spec:
            self.last_swap_error = None
            return False
        try:
            new = await asyncio.to_thread(self._load, spec)
        except Exception as e:  # noqa: BLE001 - whatever failed, keep serving
            self.failed(f"{type(e).__name__}: {e}", spec)
            return False
        if install is not None:
            done = install(new)
            if done is not None:
                await done
        self.current, self.spec, self.last_swap_error = new, spec, None
        self.swaps += 1
        self._log.info("%s: now deciding with %s", self.app, self._name(new))
        return True

    def failed(self, message: str, spec: Any) -> None:
        """A ``user_config`` change that was not applied (a bad policy or a bad config)."""
        self.last_swap_error = {"message": message, "time": time.time(),
                                "spec": None if spec is None else str(spec)}
        self._log.warning("%s: user_config change not applied (policy %r): %s; still deciding "
                          "with %s", self.app, spec, message, self._name(self.current))

    def report(self) -> dict[str, Any]:
        return {"swaps": self.swaps, "last_swap_error": self.last_swap_error}
