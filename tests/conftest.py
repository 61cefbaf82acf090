"""Shared fixtures and helpers."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# The golden evaluations of learned policies (tests/test_golden_eval.py) meet near-ties whose
# outcome depends on OpenBLAS's matrix kernel, which OpenBLAS picks per processor: on an AMD EPYC
# with no OPENBLAS_CORETYPE set, 5 of 16 cases chose differently. The numbers were recorded with
# the AVX (Sandybridge) kernel; the suite uses it where nothing else is set (read when numpy
# loads, so before any import of it). An operator's setting is never changed.
if platform.machine() in ("x86_64", "AMD64") and "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_CORETYPE", "Sandybridge")

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Ray's token auth (default in 2.60) is irrelevant for local test clusters.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# A machine where Ray never ran: create <system temp>/ray (Ray's address file) and, when the suite
# runs under RAY_AUTH_MODE=token with no token, give this session's clusters a fresh one in
# RAY_AUTH_TOKEN (inherited by every Ray process the tests start) instead of ray.init writing
# ~/.ray/auth_token.
from scale_ray.live.raylocal import prepare_local_ray  # noqa: E402

prepare_local_ray()


@pytest.fixture
def repo() -> Path:
    return REPO


# The suite's result is pytest's exit status. Once pytest has printed its summary and unconfigured,
# the process leaves without Python's finalisation: on CI (2026-12-03) a suite of 1 failure and
# 1182 passes ended in "Segmentation fault" after the summary, in the teardown of native threads
# (gRPC, torch), which turned its status into a crash. Ray started in this process is shut down
# first, so nothing it launched outlives the suite.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not _EXIT_STATUS or os.environ.get("SCALE_TEST_FINALIZE") == "1":
        return
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])
