"""Free TCP ports for the servers we start ourselves (Serve's HTTP proxy, a test's Ray head).

A port from ``bind(("", 0))`` lies in the kernel's ephemeral range, which every process (Ray's
own raylet, object manager and gRPC servers included) draws from as well: between our closing the
probe socket and the server binding it, another process can take it ("Failed to bind to address
127.0.0.1:41655"). We therefore draw from the gap between Ray's worker ports (10002–19999 by
default) and the ephemeral range, where nothing binds without being told to.
"""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path

RAY_WORKER_PORTS = range(10002, 20000)
_LOW = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # the Linux default


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A port that is free now and lies outside Ray's worker ports and the ephemeral range
    (falls back to a kernel-chosen port outside Ray's worker ports if that gap is too small)."""
    high = _ephemeral_low()
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    if high - _LOW >= 1000:
        for _ in range(200):
            p = rng.randrange(_LOW, high)
            if p not in exclude and _bindable(p, host):
                return p
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            p = s.getsockname()[1]
        if p not in RAY_WORKER_PORTS and p not in exclude:
            return p
