"""The one sign convention of every comparison the project prints or writes: a relative
difference is ``value / reference - 1`` of a response time (or of anything where lower is
better), printed signed with its direction: ``-21.1 % lower``, ``+3.0 % higher`` (README.md,
"What we measured"); JSON keys holding one are named ``*rel_diff*``.
"""

from __future__ import annotations

import math

__all__ = ["rel"]


def rel(diff: float | None, digits: int = 1) -> str:
    """``diff = value / reference - 1`` as ``"-21.1 % lower"`` / ``"+3.0 % higher"`` (``"+0.0 %"``
    when it rounds to zero; ``"n/a"`` for None or NaN)."""
    if diff is None or math.isnan(diff):
        return "n/a"
    x = round(100 * diff, digits)
    if x == 0:
        return f"{0:+.{digits}f} %"
    return f"{x:+.{digits}f} % {'lower' if x < 0 else 'higher'}"
