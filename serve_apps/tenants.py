"""Who asks the scheduler service: tenants, their tokens, workflow ids only their issuer can use,
and the audit log (serve_apps.scheduler).

* **Tokens** are given as their hashes, ``tenant=sha256:<64 hex>``, one a line (``#``
  comments) in the file ``SCALE_SCHEDULER_TOKENS_FILE`` names (``python -m serve_apps.tenants
  new TENANT`` makes a token and appends its line there), or in ``SCALE_SCHEDULER_TOKENS``
  (``tenant=sha256:...,tenant2=sha256:...``); never in the YAML. A plaintext ``tenant=token``
  entry is refused unless the operator opts in (``SchedulerArgs.plaintext_tokens``): every
  process of the user that started Ray (``serve run``, GCS, raylet, dashboard, Serve's proxy
  and controller, the replica) shows its environment in ``/proc/<pid>/environ``, and a file of
  tokens is read by any tool that can read files, while a hash gives no token back. The replica
  reads them once and keeps only SHA-256 digests. An HTTP request is the tenant whose token's
  digest its ``Authorization:
  Bearer <token>`` header's digest equals (compared in constant time, as bytes: any header value
  works); a missing or unknown token is a 401. Without configured tokens the service answers
  loopback clients only (tenant ``local``; anyone else gets a 403) and says so at start.
* **Handle calls** (``scale_ray.client``) are the calling Ray job's tenant (``job:<id>``) unless
  the client names one: a Ray job can run any code on the cluster already, so it is trusted to
  say who it is.
* **Ids** are ``<incarnation>-<random>-<mac>``: unguessable, and the MAC (keyed by a secret kept in
  the cluster's GCS for the cluster's life, so it survives replica restarts) binds the id to its
  tenant. A tenant sees only its own ids; any other id (another tenant's, malformed, never
  issued, any string at all: checked as bytes) is a 404. An id this service issued to this
  tenant from an earlier replica is a 410.
* **Audit**: one ``audit`` line per submit, cancel, refusal and token failure (tenant, id,
  reason; never a token; a failed token's tenant is ``?``) on the ``ray.serve.scale_audit``
  logger, a child of Serve's ``ray.serve`` logger: the lines land in the replica's log file
  (``/tmp/ray/session_latest/logs/serve/replica_*.log``) with Serve's own. Counted per action
  and reason (:func:`audit_counts`; the service exports them: serve_apps.metrics).
* **Metrics labels** (:func:`tenant_label`): ``t-`` and 8 hex digits of the tenant name's
  SHA-256, unless the operator opts into names (``metrics_tenant_names``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Mapping

log = logging.getLogger("ray.serve")
audit_log = logging.getLogger("ray.serve.scale_audit")  # propagates into Serve's handlers

TOKENS_VAR = "SCALE_SCHEDULER_TOKENS"
TOKENS_FILE_VAR = "SCALE_SCHEDULER_TOKENS_FILE"
LOCAL_TENANT = "local"
HASH_PREFIX = "sha256:"
MAX_ID_BYTES = 128  # an id this service issues has 8 + 16 + 16 characters and two dashes
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_KV_KEY = b"scale_scheduler_id_key"

__all__ = ["Tenants", "IdSigner", "audit", "audit_counts", "count_audit", "load_tokens", "new_token", "add_token",
           "tenant_label", "LOCAL_TENANT", "HASH_PREFIX"]


def _utf8(s: str | bytes) -> bytes:
    """Text as bytes: UTF-8, lone surrogates kept (no string fails)."""
    return bytes(s) if isinstance(s, (bytes, bytearray)) else str(s).encode("utf-8",
                                                                         "surrogatepass")


def _header_bytes(s: str | bytes) -> bytes:
    """A header value as the bytes that came over the wire (ASGI servers decode headers as
    latin-1); any other string as UTF-8."""
    if isinstance(s, (bytes, bytearray)):
        return bytes(s)
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return _utf8(s)


def _digest(value: str, where: str = "token") -> bytes:
    """The SHA-256 digest a token entry stands for: ``sha256:<64 hex>`` is one already, anything
    else is a token (hashed as UTF-8)."""
    if value.startswith(HASH_PREFIX):
        hexa = value[len(HASH_PREFIX):]
        if not _HEX64.fullmatch(hexa):
            raise ValueError(f"{where}: {HASH_PREFIX} must be followed by 64 hex digits")
        return bytes.fromhex(hexa)
    return hashlib.sha256(_utf8(value)).digest()


def _parse(text: str, where: str, plaintext: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, line in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tenant, sep, token = line.partition("=")
        tenant, token = tenant.strip(), token.strip()
        hashed = token.startswith(HASH_PREFIX)
        if not sep or not tenant or (len(token) < 16 and not hashed):
            raise ValueError(f"{where}: entry {i}: expected tenant=sha256:<64 hex> (or, with "
                             f"plaintext_tokens, tenant=token of at least 16 characters)")
        if not hashed and not plaintext:
            raise ValueError(
                f"{where}: entry {i} (tenant {tenant!r}) is a plaintext token: give its hash, "
                f"{tenant}=sha256:<64 hex> (python -m serve_apps.tenants new {tenant} makes a "
                f"token and its line), or set the app's args.plaintext_tokens: true. A plaintext "
                f"token in the environment is in /proc/<pid>/environ of every process of the "
                f"user that started Ray, and a file of tokens is read by any tool that reads "
                f"files")
        if tenant in out:
            raise ValueError(f"{where}: tenant {tenant!r} appears twice")
        out[tenant] = HASH_PREFIX + _digest(token, f"{where}: entry {i}").hex()
    return out


def load_tokens(environ: Mapping[str, str] | None = None,
                plaintext: bool = False) -> dict[str, str]:
    """tenant -> ``sha256:<hex>`` of its token, from the environment (module docstring); {}
    when none is configured. ``plaintext``: accept ``tenant=token`` entries too (the operator's
    opt-in); else they are a ``ValueError`` naming the entry. No plaintext token is returned."""
    env = os.environ if environ is None else environ
    tokens = _parse(env.get(TOKENS_VAR, ""), TOKENS_VAR, plaintext)
    path = env.get(TOKENS_FILE_VAR)
    if path:
        for tenant, token in _parse(_read(path), f"{TOKENS_FILE_VAR} ({path})",
                                    plaintext).items():
            if tenant in tokens:
                raise ValueError(f"tenant {tenant!r} is in both {TOKENS_VAR} and {TOKENS_FILE_VAR}")
            tokens[tenant] = token
    return tokens


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{TOKENS_FILE_VAR}: cannot read {path}: {e.strerror}") from None


def new_token(tenant: str) -> tuple[str, str]:
    """A fresh token for ``tenant`` and its entry (``tenant=sha256:...``)."""
    if not tenant or any(c in tenant for c in "=,#") or tenant != tenant.strip() \
            or not tenant.isprintable():
        raise ValueError(f"tenant {tenant!r}: a printable name without '=', ',', '#' or "
                         f"surrounding spaces")
    token = secrets.token_urlsafe(32)
    return token, f"{tenant}={HASH_PREFIX}{hashlib.sha256(token.encode()).hexdigest()}"


def add_token(path: str | Path, tenant: str) -> str:
    """Make a token for ``tenant``, append its ``sha256:`` line to the tokens file ``path``
    (created readable by its owner only, 0600) and return the token; a tenant the file has
    already is a ``ValueError`` (edit the file to rotate its token)."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    if tenant in _parse(text, str(path), True):
        raise ValueError(f"{path}: tenant {tenant!r} has a token already (remove its line to "
                         f"give it a new one)")
    token, line = new_token(tenant)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
    return token


def tenant_label(tenant: str) -> str:
    """A tenant as a metrics label: ``t-`` + 8 hex of its name's SHA-256 (``?`` stays)."""
    if tenant == "?":
        return tenant
    return "t-" + hashlib.sha256(_utf8(tenant)).hexdigest()[:8]


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
    """Authenticates HTTP requests (module docstring); holds SHA-256 digests only."""

    def __init__(self, tokens: Mapping[str, str]):
        self._digests = [(t, _digest(tok, f"tenant {t!r}")) for t, tok in tokens.items()]
        if not self._digests:
            log.warning("scheduler service: no tenant tokens configured (%s / %s): answering "
                        "loopback clients only, as tenant %r", TOKENS_VAR, TOKENS_FILE_VAR,
                        LOCAL_TENANT)

    @property
    def open(self) -> bool:
        """No tokens: loopback clients only."""
        return not self._digests

    def authenticate(self, authorization: str | bytes | None, client_host: str | None
                     ) -> tuple[str | None, int, str]:
        """(tenant, 0, "") or (None, HTTP status, why); ``authorization`` any str or bytes."""
        if self.open:
            if is_loopback(client_host):
                return LOCAL_TENANT, 0, ""
            return None, 403, ("this service has no tenant tokens configured and answers "
                               "loopback clients only")
        scheme, _, token = _header_bytes(authorization or b"").partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return None, 401, "missing bearer token (Authorization: Bearer <token>)"
        given = hashlib.sha256(token).digest()
        found = None
        for tenant, digest in self._digests:  # every digest compared: no early exit to time
            if hmac.compare_digest(given, digest):
                found = tenant
        if found is None:
            return None, 401, "unknown bearer token"
        return found, 0, ""


class IdSigner:
    """Workflow ids bound to their tenant (module docstring)."""

    def __init__(self, incarnation: str, key: bytes | None = None):
        self.incarnation = incarnation
        self.key = key if key is not None else _cluster_key()

    def _mac(self, inc: bytes, rand: bytes, tenant: str) -> bytes:
        msg = b"|".join((inc, rand, _utf8(tenant)))
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()[:16].encode()

    def new(self, tenant: str) -> str:
        rand = secrets.token_hex(8)
        mac = self._mac(self.incarnation.encode(), rand.encode(), tenant).decode()
        return f"{self.incarnation}-{rand}-{mac}"

    def check(self, wid: str | bytes, tenant: str) -> str:
        """``ours`` (this replica issued it to ``tenant``), ``gone`` (an earlier replica did) or
        ``unknown`` (anything else: another tenant's, malformed, never issued; any string or
        bytes, compared as bytes)."""
        if not isinstance(wid, (str, bytes, bytearray)):
            return "unknown"
        raw = _utf8(wid)
        if len(raw) > MAX_ID_BYTES:
            return "unknown"
        parts = raw.split(b"-")
        if len(parts) != 3 or not all(parts):
            return "unknown"
        inc, rand, mac = parts
        if not hmac.compare_digest(mac, self._mac(inc, rand, tenant)):
            return "unknown"
        return "ours" if inc == self.incarnation.encode() else "gone"


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


# ------------------------------------------------------------------------------- audit
_counts: dict[tuple[str, str], int] = defaultdict(int)
_counts_lock = threading.Lock()


def _shown(v: object, limit: int = 200) -> str:
    """A value as one log word: itself when plain printable ASCII, else its repr."""
    s = str(v)[:limit]
    return s if s and s.isascii() and s.isprintable() and " " not in s and "=" not in s \
        else repr(s)


def reason_kind(reason: object) -> str:
    """The counted reason of an audit line: its text before a colon (``quota: ...`` is
    ``quota``), at most 40 characters."""
    return str(reason).split(":", 1)[0].strip()[:40] if reason else ""


def audit(action: str, tenant: str, wid: str | None = None, **fields: object) -> None:
    """One audit line, ``audit <action> tenant=<t> id=<id> key=value...`` (every value a plain
    word or a repr: a field cannot forge a line), counted per action and reason."""
    count_audit(action, fields.get("reason"))
    extra = " ".join(f"{k}={str(v)[:200]!r}" for k, v in fields.items())
    audit_log.info("audit %s tenant=%s id=%s %s", action, _shown(tenant), _shown(wid or "-"),
                   extra)


def count_audit(action: str, reason: object, n: int = 1) -> None:
    """Count an audit line (one a scheduler door wrote in its own process, told to the
    scheduler actor, whose metrics export the counts)."""
    with _counts_lock:
        _counts[(action, reason_kind(reason))] += n


def audit_counts() -> dict[tuple[str, str], int]:
    """(action, reason) -> audit lines so far in this process."""
    with _counts_lock:
        return dict(_counts)


def _main(argv: list[str]) -> int:
    usage = (f"usage: python -m serve_apps.tenants new TENANT [--file PATH]  (PATH: default "
             f"${TOKENS_FILE_VAR}; without either, the line is printed)")
    if len(argv) not in (2, 4) or argv[0] != "new" or (len(argv) == 4 and argv[2] != "--file"):
        print(usage, file=sys.stderr)
        return 2
    path = argv[3] if len(argv) == 4 else os.environ.get(TOKENS_FILE_VAR)
    try:
        if path:
            token, line = add_token(path, argv[1]), None
        else:
            token, line = new_token(argv[1])
    except (ValueError, OSError) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"token (give it to the tenant; not stored anywhere): {token}")
    if line is None:
        print(f"its sha256 line was appended to {path} ({TOKENS_FILE_VAR})")
    else:
        print(f"entry for a {TOKENS_FILE_VAR} file (or {TOKENS_VAR}): {line}")
    print(f"metrics label: {tenant_label(argv[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
