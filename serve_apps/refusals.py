"""Every refusal of the scheduler service is audited once and counted (docs/serving.md,
"Audit"): one ``audit refuse`` line (tenant, reason, HTTP status, the field) on the audit logger
and one count in ``ray_scale_scheduler_audit_total{action="refuse",reason}``, plus
``ray_scale_scheduler_rejected_total{tenant,reason}`` once the tenant is known.

The reason is the refusal's kind: a :class:`~serve_apps.schemas.RequestError`'s ``kind``
(``quota``, ``too_large``, ``not_allowed``, ``bad_key``, ``program_closed``, ...), ``schema``
for a body or parameter the request schema rejects, ``not_found`` / ``workflow_lost`` for an id
that is not the tenant's (404) or was lost with an earlier replica (410); ``body_too_large``
(413) and ``body_timeout`` (408) are answered before anyone is authenticated (tenant ``?``).

A refusal is noted where it is raised when the tenant is known there, else where it is answered
(the service's routes, then the error handlers of :mod:`serve_apps.errors`); the exception
carries ``audited`` so that no refusal is counted twice.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError

from .tenants import audit

__all__ = ["refused", "describe", "SCHEMA"]

SCHEMA = "schema"  # the reason of a body or parameter the request schema rejects


def describe(err: BaseException) -> tuple[int, str, str]:
    """(HTTP status, kind, field as ``a.b.0``) of a refusal: a ``RequestValidationError``, or
    anything with ``status``, ``kind`` and ``loc`` (``RequestError``, ``UnknownWorkflow``)."""
    if isinstance(err, RequestValidationError):
        errs = err.errors()
        return 422, SCHEMA, ".".join(map(str, errs[0].get("loc", ()))) if errs else ""
    return (int(getattr(err, "status", 422)), str(getattr(err, "kind", "value_error")),
            ".".join(map(str, getattr(err, "loc", ()))))


def refused(metrics: Any, tenant: str, err: BaseException, **fields: Any) -> BaseException:
    """Audit and count refusal ``err`` of ``tenant`` unless that was done already; returns
    ``err`` (``raise refused(...)``). ``metrics``: the service's ``ServiceMetrics`` (its
    ``refused(tenant, kind)``), None for the audit line and its counter only."""
    if getattr(err, "audited", False):
        return err
    status, kind, field = describe(err)
    audit("refuse", tenant, reason=kind, status=status, **({"field": field} if field else {}),
          **fields)
    if metrics is not None:
        metrics.refused(tenant, kind)
    err.audited = True  # type: ignore[attr-defined]
    return err
