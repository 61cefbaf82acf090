"""The one sign convention of every printed comparison: a relative difference is
``value / reference - 1`` of a response time (or of anything where lower is better), printed
signed with its direction: ``-21.1 % lower``, ``+3.0 % higher`` (README.md, "What we
measured").

JSON keys keep their documented meaning (docs/results.md): ``*_rel_diff`` hold
``value / reference - 1``; ``improvement_*`` and ``*_gain_*`` hold ``1 - value / reference``
(the same difference with the other sign): print them with :func:`from_gain`.
"""

from __future__ import annotations

import math

__all__ = ["rel", "from_gain"]


def rel(diff: float, digits: int = 1) -> str:
    """``diff = value / reference - 1`` as ``"-21.1 % lower"`` / ``"+3.0 % higher"`` (``"+0.0 %"``
    when it rounds to zero; ``"n/a"`` for NaN)."""
    if diff is None or math.isnan(diff):
        return "n/a"
    x = round(100 * diff, digits)
    if x == 0:
        return f"{0:+.{digits}f} %"
    return f"{x:+.{digits}f} % {'lower' if x < 0 else 'higher'}"


def from_gain(gain: float, digits: int = 1) -> str:
    """A gain ``1 - value / reference`` (JSON ``improvement_*``, ``*_gain_*``) printed as
    :func:`rel` prints the difference."""
    return rel(math.nan if gain is None else -gain, digits)
