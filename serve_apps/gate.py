"""Whether a learned policy may serve: its measurement against EFT (issue 73).

``scale-ray eval --gate`` runs each learned policy and EFT on the same validation episodes and
writes what it measured into the artifact, ``gate.json``, bound to the weights' checksum
(:func:`write_mark`). Both Serve apps read it whenever they load a policy, at deploy and on a
``user_config`` swap (:func:`admit`): a learned policy measured worse than EFT by more than
:attr:`PolicyGate.tolerance` (default 5 %), or never measured, is refused with the measured
number in the message, unless :attr:`PolicyGate.force`. A refused deploy fails; a refused swap
keeps the current policy (``last_swap_error``).

Not gated: heuristics and planners (EFT is the reference; the others are an operator's explicit
choice) and the shipped artifacts, whose gate runs in the test suite
(tests/test_first_hour.py::test_the_shipped_policies_pass_the_gate).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.config import rng
from policies import HEURISTICS, PLANNERS, SAMPLE_PREFIX, shipped_policies

GATE_FILE = "gate.json"
FORMAT = "scale-ray-gate/1"
REFERENCE = "eft"
DEFAULT_TOLERANCE = 0.05

__all__ = ["PolicyGate", "PolicyRefused", "admit", "learned_artifact", "read_mark", "write_mark",
           "GATE_FILE", "REFERENCE", "DEFAULT_TOLERANCE"]


@dataclass(frozen=True)
class PolicyGate:
    """What a learned policy must have shown against EFT to serve (``policy_gate`` of both
    apps' arguments)."""
    tolerance: float = field(default=DEFAULT_TOLERANCE, metadata=rng(
        ge=0, le=10, doc="the most a learned policy's measured mean workflow response may exceed "
                         "EFT's, as a fraction (0.05: 5 % worse); its gate.json says by how much "
                         "(scale-ray eval --gate)"))
    force: bool = field(default=False, metadata=rng(
        doc="serve a learned policy that was measured worse than the tolerance allows, or never "
            "measured (logged at WARNING, reported in the policy's 'gate')"))


class PolicyRefused(ValueError):
    """A learned policy the gate does not let serve; the message says what was measured and
    how to serve it anyway."""


def learned_artifact(spec: str) -> Path | None:
    """The artifact directory ``spec`` names when it is a learned policy the gate applies to
    (a path, ``sample:`` prefix allowed); None for heuristics, planners and shipped names."""
    base = spec[len(SAMPLE_PREFIX):] if spec.startswith(SAMPLE_PREFIX) else spec
    if base in HEURISTICS or base.split(":", 1)[0] in PLANNERS or base in shipped_policies():
        return None
    path = Path(base)
    return path if (path / "policy.json").is_file() else None


def _checksum(artifact: Path) -> str | None:
    try:
        return json.loads((artifact / "policy.json").read_text()).get("checksum")
    except (OSError, ValueError):
        return None


def write_mark(artifact: Path, measured: dict[str, Any]) -> Path:
    """Write ``measured`` (``rel_diff``: the policy's mean / EFT's - 1 at its worst size, with
    the run that measured it) as ``artifact``/gate.json, bound to its weights' checksum."""
    doc = {"format": FORMAT, "reference": REFERENCE, "policy_checksum": _checksum(artifact),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **measured}
    path = Path(artifact) / GATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def read_mark(artifact: Path) -> dict[str, Any] | None:
    """The artifact's gate.json, or None when it has none (or an unreadable one)."""
    try:
        doc = json.loads((Path(artifact) / GATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def describe(mark: dict[str, Any]) -> str:
    """What the mark measured, as ``scale-ray eval --gate`` worded it (``summary``: ``+35.1 %
    higher vs eft (mean workflow response, N=16, 8 episodes)``)."""
    return str(mark.get("summary") or f"rel_diff {mark.get('rel_diff')} vs "
                                       f"{mark.get('reference', REFERENCE)}")


def admit(spec: str, gate: PolicyGate, log: Any = None) -> dict[str, Any]:
    """The gate's verdict on ``spec`` before it serves (the module doc): a report for the app's
    policy view, or :class:`PolicyRefused`."""
    artifact = learned_artifact(spec)
    if artifact is None:
        return {"checked": False, "why": "not gated: a heuristic, planner or shipped policy"}
    mark = read_mark(artifact)
    force = " (policy_gate.force: true serves it anyway)"
    if mark is not None and mark.get("policy_checksum") != _checksum(artifact):
        why = (f"policy {spec}: its {GATE_FILE} was measured on other weights (checksum "
               f"{mark.get('policy_checksum')}, the artifact's {_checksum(artifact)}); "
               f"measure it again: scale-ray eval --gate --policy {spec}")
    elif mark is None:
        why = (f"policy {spec} was never compared with {REFERENCE}: run scale-ray eval --gate "
               f"--policy {spec} (it writes {artifact / GATE_FILE})")
    else:
        rel = float(mark.get("rel_diff", math.nan))
        report = {"checked": True, "rel_diff": rel, "tolerance": gate.tolerance,
                  "measured": describe(mark), "file": str(artifact / GATE_FILE)}
        if rel <= gate.tolerance:
            return report | {"passed": True}
        why = (f"policy {spec}: {describe(mark)}, worse than the "
               f"tolerance of {100 * gate.tolerance:g} % (policy_gate.tolerance; "
               f"{artifact / GATE_FILE})")
        if gate.force:
            if log is not None:
                log.warning("%s; serving it anyway (policy_gate.force)", why)
            return report | {"passed": False, "forced": True}
        raise PolicyRefused(why + force)
    if gate.force:
        if log is not None:
            log.warning("%s; serving it anyway (policy_gate.force)", why)
        return {"checked": False, "forced": True, "why": why}
    raise PolicyRefused(why + force)
