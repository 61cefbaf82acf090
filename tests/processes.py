"""Test helper: the processes a test started itself, found by its own temp dir (never by name)."""

from __future__ import annotations

import os
from pathlib import Path


def pids_using(temp_dir: str) -> list[int]:
    """PIDs (not this one) whose command line names ``temp_dir``: the processes of a cluster the
    test started with that temp dir, and nothing else on the machine."""
    needle = temp_dir.encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def wait_for_port(port: int, procs: list, what: str, timeout: float = 90) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections; if it does not in ``timeout`` s or one
    of ``procs`` (``subprocess.Popen`` started with ``start_new_session``) exits first, stop them
    and raise with the tail of the first one's output."""
    import socket
    import time

    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                stop_own(procs, None)
                try:
                    out = procs[0].communicate(timeout=30)[0] if procs else b""
                except Exception:  # noqa: BLE001 - the output is only for the message
                    out = b""
                raise RuntimeError(f"{what} did not start:\n"
                                   f"{(out or b'').decode(errors='replace')[-3000:]}") from None
            time.sleep(1)


def stop_own(procs: list, temp_dir: str | None) -> None:
    """Stop the processes this test started (``procs``, last first, by process group) and then
    anything left whose command line names ``temp_dir``; remove ``temp_dir``."""
    import shutil
    import signal
    import subprocess

    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    if temp_dir is None:
        return
    for pid in pids_using(temp_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)
