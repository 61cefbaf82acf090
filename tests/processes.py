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
