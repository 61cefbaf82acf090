"""scale_ray.ports: ports for our own servers avoid Ray's worker ports and the ephemeral range."""
from __future__ import annotations

import socket

from scale_ray import ports


def test_free_port_is_bindable_and_outside_contended_ranges():
    low = ports._ephemeral_low()
    seen = set()
    for _ in range(50):
        p = ports.free_port(exclude=seen)
        assert p not in seen and p not in ports.RAY_WORKER_PORTS
        if low - ports._LOW >= 1000:
            assert ports._LOW <= p < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # still free
        seen.add(p)


def test_free_port_skips_a_port_in_use(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        held.listen()
        assert not ports._bindable(busy, "127.0.0.1")
    # a narrow gap falls back to kernel-chosen ports, still outside Ray's worker ports
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._LOW + 10)
    p = ports.free_port()
    assert p not in ports.RAY_WORKER_PORTS
