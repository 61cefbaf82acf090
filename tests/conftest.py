"""Shared fixtures and helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Ray's token auth (default in 2.60) is irrelevant for local test clusters.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def repo() -> Path:
    return REPO
