"""Who asks the scheduler service: tenants, their tokens, workflow ids only their issuer can use,
and the audit log (serve_apps.scheduler).

* **Tokens** come from the environment, never from the YAML: ``SCALE_SCHEDULER_TOKENS``
  (``tenant=token,tenant2=token2``) or the file ``SCALE_SCHEDULER_TOKENS_FILE`` names (one
  ``tenant=token`` per line, ``#`` comments). An HTTP request is the tenant whose token its
  ``Authorization: Bearer <token>`` header carries (compared in constant time); a missing or
  unknown token is a 401. Without configured tokens the service answers loopback clients only
  (tenant ``local``; anyone else gets a 403) and says so at start.
* **Handle calls** (``scale_ray.client``) are the calling Ray job's tenant (``job:<id>``) unless
  the client names one: a Ray job can run any code on the cluster already, so it is trusted to
  say who it is.
* **Ids** are ``<incarnation>-<random>-<mac>``: unguessable, and the MAC (keyed by a secret kept in
  the cluster's GCS for the cluster's life, so it survives replica restarts) binds the id to its
  tenant. A tenant sees only its own ids; any other id (another tenant's, malformed, never
  issued) is a 404. An id this service issued to this tenant from an earlier replica is a 410.
* **Audit**: one ``audit`` log line per submit, cancel and refusal, with tenant, id and reason.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
from pathlib import Path
from typing import Mapping

log = logging.getLogger("ray.serve")
audit_log = logging.getLogger("scale.audit")

TOKENS_VAR = "SCALE_SCHEDULER_TOKENS"
TOKENS_FILE_VAR = "SCALE_SCHEDULER_TOKENS_FILE"
LOCAL_TENANT = "local"
_KV_KEY = b"scale_scheduler_id_key"

__all__ = ["Tenants", "IdSigner", "audit", "load_tokens", "LOCAL_TENANT"]


def _parse(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, line in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tenant, sep, token = line.partition("=")
        tenant, token = tenant.strip(), token.strip()
        if not sep or not tenant or len(token) < 16:
            raise ValueError(f"{where}: entry {i}: expected tenant=token with a token of at least "
                             f"16 characters")
        if tenant in out:
            raise ValueError(f"{where}: tenant {tenant!r} appears twice")
        out[tenant] = token
    return out


def load_tokens(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """tenant -> token from the environment (module docstring); {} when none is configured."""
    env = os.environ if environ is None else environ
    tokens = _parse(env.get(TOKENS_VAR, ""), TOKENS_VAR)
    path = env.get(TOKENS_FILE_VAR)
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"{TOKENS_FILE_VAR}: cannot read {path}: {e.strerror}") from None
        for tenant, token in _parse(text, f"{TOKENS_FILE_VAR} ({path})").items():
            if tenant in tokens:
                raise ValueError(f"tenant {tenant!r} is in both {TOKENS_VAR} and {TOKENS_FILE_VAR}")
            tokens[tenant] = token
    return tokens


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Tenants:
    """Authenticates HTTP requests (module docstring)."""

    def __init__(self, tokens: Mapping[str, str]):
        self._tokens = [(t, tok.encode()) for t, tok in tokens.items()]
        if not self._tokens:
            log.warning("scheduler service: no tenant tokens configured (%s / %s): answering "
                        "loopback clients only, as tenant %r", TOKENS_VAR, TOKENS_FILE_VAR,
                        LOCAL_TENANT)

    @property
    def open(self) -> bool:
        """No tokens: loopback clients only."""
        return not self._tokens

    def authenticate(self, authorization: str | None, client_host: str | None
                     ) -> tuple[str | None, int, str]:
        """(tenant, 0, "") or (None, HTTP status, why)."""
        if self.open:
            if is_loopback(client_host):
                return LOCAL_TENANT, 0, ""
            return None, 403, ("this service has no tenant tokens configured and answers "
                               "loopback clients only")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, 401, "missing bearer token (Authorization: Bearer <token>)"
        given = token.strip().encode()
        found = None
        for tenant, tok in self._tokens:  # every token compared: no early exit to time
            if hmac.compare_digest(given, tok):
                found = tenant
        if found is None:
            return None, 401, "unknown bearer token"
        return found, 0, ""


class IdSigner:
    """Workflow ids bound to their tenant (module docstring)."""

    def __init__(self, incarnation: str, key: bytes | None = None):
        self.incarnation = incarnation
        self.key = key if key is not None else _cluster_key()

    def _mac(self, inc: str, rand: str, tenant: str) -> str:
        msg = f"{inc}|{rand}|{tenant}".encode()
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()[:16]

    def new(self, tenant: str) -> str:
        rand = secrets.token_hex(8)
        return f"{self.incarnation}-{rand}-{self._mac(self.incarnation, rand, tenant)}"

    def check(self, wid: str, tenant: str) -> str:
        """``ours`` (this replica issued it to ``tenant``), ``gone`` (an earlier replica did) or
        ``unknown`` (anything else: another tenant's, malformed, never issued)."""
        parts = wid.split("-")
        if len(parts) != 3 or not all(parts):
            return "unknown"
        inc, rand, mac = parts
        if not hmac.compare_digest(mac, self._mac(inc, rand, tenant)):
            return "unknown"
        return "ours" if inc == self.incarnation else "gone"


def _cluster_key() -> bytes:
    """A 32-byte secret kept in the cluster's GCS (the same for every replica of the cluster's
    life); a random one when no Ray cluster is connected."""
    try:
        from ray.experimental.internal_kv import (_internal_kv_get, _internal_kv_initialized,
                                                  _internal_kv_put)
        if _internal_kv_initialized():
            key = _internal_kv_get(_KV_KEY)
            if not key:
                _internal_kv_put(_KV_KEY, secrets.token_bytes(32), overwrite=False)
                key = _internal_kv_get(_KV_KEY)
            if key:
                return bytes(key)
    except Exception as e:  # noqa: BLE001 - a missing GCS only costs the 410s after a restart
        log.warning("scheduler service: no cluster-wide id key (%s); ids of an earlier replica "
                    "will answer 404 instead of 410", type(e).__name__)
    return secrets.token_bytes(32)


def audit(action: str, tenant: str, wid: str | None = None, **fields: object) -> None:
    """One audit line: ``audit <action> tenant=<t> id=<id> key=value...``."""
    extra = " ".join(f"{k}={str(v)[:200]!r}" for k, v in fields.items())
    audit_log.info("audit %s tenant=%s id=%s %s", action, tenant, wid or "-", extra)
