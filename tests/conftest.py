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
