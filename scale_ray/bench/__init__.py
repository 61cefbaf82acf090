"""The benchmarks of ``scale-ray bench`` (scale_ray/cli.py names them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_report(path: str | None, out: dict[str, Any], default: Callable = str) -> None:
    """Write a bench's JSON ``out`` to ``path`` (its folder made) and say so; None: nothing."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1, default=default))
        print(f"wrote {path}")
