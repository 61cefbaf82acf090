"""The services' "ready at URL" line (serve_apps.ready), against a stand-in for Serve's proxy."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from serve_apps.ready import announce, routed_prefix


class _Proxy(BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps(self.routes).encode() if self.path == "/-/routes" else b"{}"
        self.send_response(200 if self.path == "/-/routes" else 404)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_ready_is_logged_once_the_proxy_routes_the_app(caplog):
    server = HTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _Proxy.routes = {}
        assert routed_prefix(base, "scheduler") is None
        log = logging.getLogger("test_ready")
        with caplog.at_level(logging.INFO, logger="test_ready"):
            t = announce(log, "svc", "POST /x", base_url=base, app="scheduler", poll_s=0.05)
            t.join(0.3)
            assert t.is_alive() and not caplog.records  # not routed yet: nothing said
            _Proxy.routes = {"/sched": "scheduler", "/": "other"}
            t.join(5)
        assert not t.is_alive()
        assert [r.getMessage() for r in caplog.records] == [f"svc ready at {base}/sched (POST /x)"]
    finally:
        server.shutdown()


def test_a_proxy_that_never_routes_the_app_is_a_warning(caplog):
    with caplog.at_level(logging.INFO, logger="test_ready"):
        t = announce(logging.getLogger("test_ready"), "svc", "", timeout_s=0.2,
                     base_url="http://127.0.0.1:9", app="scheduler", poll_s=0.05)
        t.join(10)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "did not route" in caplog.records[0].getMessage()


def test_no_proxy_found_is_a_warning_not_silence(caplog, monkeypatch):
    import serve_apps.ready as ready

    def no_controller() -> str:
        raise RuntimeError("no Serve controller")

    monkeypatch.setattr(ready, "_proxy_url", no_controller)
    with caplog.at_level(logging.INFO, logger="test_ready"):
        ready.announce(logging.getLogger("test_ready"), "svc", "", app="scheduler").join(10)
    assert [r.getMessage() for r in caplog.records] == [
        "svc: cannot tell when it is ready (RuntimeError: no Serve controller)"]
