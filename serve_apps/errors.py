"""Error answers of the placement service: every one names the field or the limit.

* a body larger than ``max_body_bytes`` (:class:`BodyCap`, an ASGI middleware): **413** before the
  body is read when ``Content-Length`` says so, else as soon as the bytes read pass the cap
  (chunked uploads);
* a body whose next part does not arrive within ``read_timeout_s`` (a ``Content-Length`` larger
  than what is sent): **408** ``body_timeout`` (:class:`BodyCap`);
* a body that is not JSON (:func:`parse_body`): **422**: invalid UTF-8 with ``loc: ["body",
  <byte offset>]``, a syntax error with ``["body", <character offset>]``, nesting deeper than
  :data:`MAX_JSON_DEPTH` with ``["body"]`` (checked before parsing, so a journaled body parses
  again on any stack), a content type other than JSON with ``["body"]``;
* a field the schema rejects: **422** (FastAPI's ``detail[].loc``, minus the echoed input);
* input that passed the schema but makes no sense (:class:`serve_apps.decisions.RequestError`,
  or a ``ValueError`` from an internal check): **422** naming the field.

A redirect (Starlette's to the route without the trailing slash, ``/v1/workflows/``) carries
a relative ``Location``, the path alone (:class:`RelativeRedirects`): never a host the client's
``Host`` header named.

Every error body is ``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``; other HTTP
errors (404, 405) keep FastAPI's ``{"detail": "..."}``. An app may hear of each refusal
answered here that no route noted (``install(api, on_refusal)``: a 413 or 408 before any route
ran, a parameter the schema rejects, an error without ``audited``).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers

from .decisions import RequestError

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_READ_TIMEOUT_S = 10.0
#: how deep the request models nest (schedule body -> workflows -> workflow -> tasks -> task ->
#: inputs -> input)
SCHEMA_DEPTH = 6
#: the deepest JSON body :func:`parse_body` accepts, checked before parsing: the same limit at
#: submit and when a journaled body is parsed again (Python's parser stops near 1,000 levels
#: less the caller's stack, so its own limit differs between a worker thread and a replica's
#: start; a body it took at submit could be refused at resume). A scheduler task's ``args``
#: sit 4 levels down (body, tasks, task, args), so ``max_args_depth`` above 124 has no effect.
MAX_JSON_DEPTH = 128


class BodyLimits:
    """The body cap in force (``Tuning.max_body_bytes``; the service sets it on reconfigure)
    and how long a body's next part may take to arrive (``read_timeout_s``). One per process:
    a Serve replica is its own process."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s


LIMITS = BodyLimits()
#: told of a refusal answered here (an exception with ``status``, ``kind``, ``loc``, or a
#: ``RequestValidationError``) unless it carries ``audited`` (serve_apps.refusals)
OnRefusal = Callable[[Exception], Any]


def error(status: int, loc: list, msg: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"detail": [{"loc": loc, "msg": msg, "type": kind}]})


def _too_large(size: int, cap: int, known: bool) -> JSONResponse:
    what = f"{size} bytes" if known else f"more than {cap} bytes (read {size} so far)"
    return error(413, ["body"], f"request body of {what} is larger than max_body_bytes={cap}",
                 "body_too_large")


class _TooLarge(Exception):
    def __init__(self, size: int):
        self.size = size


class _ReadTimeout(Exception):
    def __init__(self, size: int):
        self.size = size


class BodyCap:
    """ASGI middleware: refuse a body larger than ``limits.max_body_bytes`` with a 413 naming
    the limit. ``Content-Length`` is checked before anything is read; a chunked body is counted
    while it is read. A body whose next part does not come within ``limits.read_timeout_s``
    (a client that announced more than it sends) is a 408 and the connection is closed."""

    def __init__(self, app: Any, limits: BodyLimits = LIMITS,
                 on_refusal: OnRefusal | None = None):
        self.app = app
        self.limits = limits
        self.on_refusal = on_refusal

    def _refuse(self, status: int, kind: str, loc: list, msg: str) -> None:
        if self.on_refusal is not None:
            self.on_refusal(RequestError(loc, msg, kind, status=status))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap = self.limits.max_body_bytes
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                self._refuse(400, "invalid_header", ["header", "content-length"], "not an integer")
                return await error(400, ["header", "content-length"],
                                   f"not an integer: {length!r}", "invalid_header")(scope, receive, send)
            if n > cap:
                self._refuse(413, "body_too_large", ["body"], f"{n} bytes")
                return await _too_large(n, cap, True)(scope, receive, send)
        state = {"size": 0, "started": False, "read": False}

        async def counted() -> dict:
            if state["read"]:  # the body is in: a wait for the disconnect is not timed
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), self.limits.read_timeout_s)
            except asyncio.TimeoutError:
                raise _ReadTimeout(state["size"]) from None
            state["read"] = msg["type"] != "http.request" or not msg.get("more_body", False)
            if msg["type"] == "http.request":
                body = msg.get("body", b"")
                state["size"] += len(body)
                if state["size"] > cap:
                    raise _TooLarge(state["size"])
            return msg

        async def tracked_send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                state["started"] = True
            await send(msg)

        try:
            await self.app(scope, counted, tracked_send)
        except _TooLarge as e:
            if state["started"]:
                raise
            self._refuse(413, "body_too_large", ["body"], f"more than {cap} bytes")
            await _too_large(e.size, cap, False)(scope, receive, send)
        except _ReadTimeout as e:
            if state["started"]:
                raise
            self._refuse(408, "body_timeout", ["body"], f"stalled after {e.size} bytes")
            out = error(408, ["body"], f"the request body stopped arriving: nothing more for "
                                       f"{self.limits.read_timeout_s:g} s after {e.size} bytes",
                        "body_timeout")
            out.headers["Connection"] = "close"
            await out(scope, receive, send)


class RelativeRedirects:
    """ASGI middleware: a redirect's ``Location`` as its path and query only. Starlette builds
    the trailing-slash redirect from the request's ``Host`` header, so a client (or a cache in
    between) could have the service point anywhere; a path stays on whatever host was asked.
    Leading slashes are folded into one (``//host/x`` would name another host)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def relative(msg: dict) -> None:
            if msg["type"] == "http.response.start" and 300 <= msg.get("status", 200) < 400:
                msg = {**msg, "headers": [(k, relative_location(v) if k.lower() == b"location"
                                           else v) for k, v in msg.get("headers", [])]}
            await send(msg)
        await self.app(scope, receive, relative)


def relative_location(location: bytes) -> bytes:
    """``location`` without its scheme and host: ``/path?query`` (one leading slash)."""
    parts = urlsplit(location.decode("latin-1"))
    path = "/" + parts.path.lstrip("/")
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


# ------------------------------------------------------------------------------- JSON depth
# a string, or an unterminated one up to the end: every match runs to a closing quote or the
# end, so the scan is linear on any input (a pattern that needs the closing quote rescans the rest
# of the body from every quote of an unterminated string: quadratic)
_STRING = re.compile(rb'"[^"\\]*(?:\\[\s\S][^"\\]*)*"?')
_NOT_BRACKET = bytes(i for i in range(256) if i not in b"[]{}")


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays/objects in ``body`` (brackets inside strings ignored;
    linear time on any bytes)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    a = np.frombuffer(brackets, np.uint8)
    step = ((a == 91) | (a == 123)).astype(np.int32) - ((a == 93) | (a == 125))
    return int(np.cumsum(step).max())


# ------------------------------------------------------------------------------- parsing
M = TypeVar("M", bound=BaseModel)


def _too_deep(depth: int) -> RequestError:
    return RequestError(("body",), f"JSON nested {depth} levels deep: deeper than this service "
                                   f"accepts ({MAX_JSON_DEPTH} levels; the request schemas nest "
                                   f"{SCHEMA_DEPTH})", "json_too_deep")


def check_depth(body: bytes) -> None:
    """A 422 ``json_too_deep`` for a body nested deeper than :data:`MAX_JSON_DEPTH` (the one
    depth check: :func:`parse_body` runs it at submit and at resume alike)."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:  # cannot be deeper: no scan
        return
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise _too_deep(depth)


def parse_body(body: bytes, model: type[M], content_type: str | None = None) -> M:
    """``body`` (JSON) validated as ``model``, or an error naming what is wrong: a
    :class:`RequestError` for a body that is not JSON, a ``RequestValidationError`` (FastAPI's
    422) for a field the schema rejects. The same ``json.loads`` + strict validation FastAPI
    applies, run by the service in a worker thread instead of on the event loop."""
    if content_type:
        kind = content_type.split(";")[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            raise RequestError(("body",), f"expected a JSON body (content-type application/json), "
                                          f"got content-type {kind!r}", "content_type")
    if not body.strip():
        raise RequestError(("body",), "Field required: the request has no body", "missing")
    check_depth(body)
    try:
        data = json.loads(body)
    except UnicodeDecodeError as e:
        raise RequestError(("body", e.start), f"the body is not valid UTF-8: {e.reason} at byte "
                                              f"{e.start}", "invalid_utf8") from None
    except RecursionError:  # (not within MAX_JSON_DEPTH unless the stack is nearly full)
        raise _too_deep(json_depth(body)) from None
    except json.JSONDecodeError as e:
        raise RequestError(("body", e.pos), f"JSON decode error: {e.msg} (line {e.lineno}, "
                                            f"column {e.colno})", "json_invalid") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_input=False)]) from None


# ------------------------------------------------------------------------------- handlers
async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
    out = error(exc.status, exc.loc, exc.msg, exc.kind)
    out.headers.update(exc.headers)
    if exc.status == 401:
        out.headers["WWW-Authenticate"] = "Bearer"
    return out


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own format, minus the echoed input (can be megabytes) and non-JSON ctx values.
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": detail})


async def _value_error(_: Request, exc: ValueError) -> JSONResponse:
    # An internal check rejected what the schema let through: still the client's input.
    return error(422, ["body"], str(exc), "value_error")


def _told(handler: Callable, on_refusal: OnRefusal | None) -> Callable:
    """``handler``, telling ``on_refusal`` first of an error no one noted yet."""
    if on_refusal is None:
        return handler

    async def told(request: Request, exc: Exception) -> JSONResponse:
        if not getattr(exc, "audited", False):
            on_refusal(exc if isinstance(exc, (RequestError, RequestValidationError))
                       else RequestError(("body",), str(exc), "value_error"))
        return await handler(request, exc)
    return told


def install(api: FastAPI, on_refusal: OnRefusal | None = None) -> None:
    """Add the body cap and the exception handlers to ``api`` (``on_refusal``: module
    docstring)."""
    api.add_middleware(BodyCap, on_refusal=on_refusal)
    api.add_middleware(RelativeRedirects)
    api.add_exception_handler(RequestError, _told(_request_error, on_refusal))
    api.add_exception_handler(RequestValidationError, _told(_validation_error, on_refusal))
    api.add_exception_handler(ValueError, _told(_value_error, on_refusal))


__all__ = ["BodyCap", "BodyLimits", "RelativeRedirects", "relative_location", "OnRefusal", "LIMITS",
           "DEFAULT_MAX_BODY_BYTES", "DEFAULT_READ_TIMEOUT_S", "MAX_JSON_DEPTH", "install",
           "json_depth", "check_depth", "error", "parse_body"]

