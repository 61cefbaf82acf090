"""A task's Ray options as demands: converted once, with Ray's own rules, for the simulator's
workload files, the live runtime and the services' HTTP bodies.

A *demand* is a sorted tuple of ``(resource, amount)`` pairs with zero amounts left out:
``CPU``, ``GPU``, ``memory`` (GB here, bytes in Ray), custom resources, the accelerator marker
Ray adds for ``accelerator_type`` (``accelerator_type:A100``: 0.001, as Ray asks for it), a
``label:key=expr`` pair (amount 1) per ``label_selector`` term, and ``slot`` (1) for a task on
a node of slots (the paper's servers, an emulated scale server: one task at a time).

:func:`parse_options` checks Ray's options as Ray checks them (``ray/_common/ray_option_utils.py``
and ``ray/_private/label_utils.py`` of Ray 2.60, restated here because the simulator imports no
Ray; tests/test_demands.py compares the two on generated options): amounts are finite numbers
>= 0 whose fraction Ray can hold (a nonzero amount below 0.0001 is refused), a GPU amount above
1 is whole, ``CPU``/``GPU``/``memory`` are set by their own options, custom resource names are
non-empty printable strings (Ray takes any string; the prefixes Ray and this scheduler set are
refused), and label keys, values and selectors follow Ray's syntax. Each error names the
option and what is allowed.

:class:`Request` is the parsed request; :meth:`Request.on_nodes` is what the task holds on a
node in Ray's resource model (``num_cpus`` defaults to 1, as in Ray), :meth:`Request.on_slot`
what it holds on a server of one slot (the slot, its memory, and only the demands its options
name). Label selectors match as Ray's label scheduling does: ``in`` needs the key with one of
the values, ``!`` (not in) fails only where the key has one of them.

Stdlib only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Request", "parse_options", "check_amount", "check_resources", "parse_selector",
           "selector_matches", "LABEL_PREFIX", "ACCEL_PREFIX", "SLOT", "CPU", "GPU", "MEMORY",
           "RAY_DEMAND_OPTIONS", "GRANULARITY", "DemandError"]

CPU, GPU, MEMORY, SLOT = "CPU", "GPU", "memory", "slot"
ACCEL_PREFIX = "accelerator_type:"
LABEL_PREFIX = "label:"
ACCEL_AMOUNT = 0.001  # what Ray asks of the accelerator marker
GRANULARITY = 1e-4  # Ray's MIN_RESOURCE_GRANULARITY: a nonzero amount below it is refused
RESOURCE_UNIT_SCALING = 10_000  # ray._raylet.RESOURCE_UNIT_SCALING (1 / GRANULARITY)
MAX_NAME = 200  # characters of a custom resource name
#: the options that are demands (a task's ``runtime_env`` travels with it but demands nothing)
RAY_DEMAND_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type",
                      "label_selector")

# Ray's label syntax (ray/_private/label_utils.py)
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_PREFIX_RE = re.compile(rf"(?:{_LABEL})?(?:\.(?:{_LABEL})?)*")
_SELECTOR_RE = re.compile(rf"!?(?:in)?\(({_LABEL}(?:, ?{_LABEL})*)\)|!?({_LABEL})")


class DemandError(ValueError):
    """A task's Ray options break Ray's rules; the message names the option."""


def check_amount(where: str, value: Any, gpu: bool = False) -> float:
    """A resource amount as Ray takes it: a finite number >= 0 whose nonzero fraction is at
    least 0.0001 (Ray's granularity); a GPU amount above 1 must be whole."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise DemandError(f"{where}: must be a finite number >= 0, got {value!r}")
    v = float(value)
    if isinstance(value, float) and v and int(v * RESOURCE_UNIT_SCALING) == 0:  # Ray's test
        raise DemandError(f"{where}: {value!r} is finer than Ray's granularity of {GRANULARITY:g} "
                          f"(0, or at least {GRANULARITY:g})")
    if gpu and v > 1 and not v.is_integer():  # as the raylet: 1.999999999999993 is not 2
        raise DemandError(f"{where}: a GPU amount above 1 must be a whole number (Ray's rule), "
                          f"got {value!r}")
    return v


def check_resources(resources: Mapping[str, Any], where: str = "resources"
                    ) -> dict[str, float]:
    """Ray's ``resources`` option: custom resource names to amounts (CPU, GPU and memory have
    their own options)."""
    if not isinstance(resources, Mapping):
        raise DemandError(f"{where}: must be a mapping of resource name to amount, got "
                          f"{type(resources).__name__}")
    out: dict[str, float] = {}
    for k, v in resources.items():
        if k in (CPU, GPU, MEMORY):
            raise DemandError(f"{where}[{k!r}]: use num_cpus, num_gpus or memory (each is set "
                              f"by its own option; Ray refuses CPU and GPU here)")
        if not isinstance(k, str) or not 0 < len(k) <= MAX_NAME or not k.isprintable() \
                or k.startswith((LABEL_PREFIX, ACCEL_PREFIX, "node:")) or k == SLOT:
            shown = k if not isinstance(k, str) or len(k) <= 40 else k[:40] + "..."
            raise DemandError(f"{where}: {shown!r} is not a custom resource name (1-{MAX_NAME} "
                              f"printable characters; not node:*, accelerator_type:*, label:* "
                              f"or slot, which Ray and this scheduler set themselves)")
        out[k] = check_amount(f"{where}[{k!r}]", v)
    return out


def _check_label_key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise DemandError(f"{where}: label key {key!r} is not a string")
    prefix, sep, name = key.rpartition("/")
    if sep and (len(prefix) > 253 or not _PREFIX_RE.fullmatch(prefix)):
        raise DemandError(f"{where}: label key prefix {prefix[:60]!r} is not a series of DNS "
                          f"labels separated by dots, at most 253 characters (Ray's rule)")
    if not _LABEL_RE.fullmatch(name):
        raise DemandError(f"{where}: label key name {name[:80]!r} must be 63 characters or "
                          f"less, alphanumerics at both ends, '-', '_', '.' between (Ray's rule)")
    return key


def parse_selector(selector: Mapping[str, str] | None, where: str = "label_selector"
                   ) -> tuple[tuple[str, str], ...]:
    """Ray's ``label_selector`` option, checked with Ray's syntax: sorted ``(key, expr)`` pairs,
    ``expr`` one of ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``."""
    if selector is None:
        return ()
    if not isinstance(selector, Mapping):
        raise DemandError(f"{where}: must be a mapping of label key to selector, got "
                          f"{type(selector).__name__}")
    out = []
    for k, v in selector.items():
        _check_label_key(k, where)
        if not isinstance(v, str) or not _SELECTOR_RE.fullmatch(v):
            raise DemandError(f"{where}[{k!r}]: {str(v)[:80]!r} is not a Ray label selector "
                              f"(value, !value, in(a,b) or !in(a,b); values of at most 63 "
                              f"alphanumerics, '-', '_', '.')")
        out.append((k, v))
    return tuple(sorted(out))


def selector_matches(key: str, expr: str, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` matches the selector term ``{key: expr}`` (module
    docstring)."""
    m = _SELECTOR_RE.fullmatch(expr)
    values = [v.strip() for v in (m.group(1) or m.group(2)).split(",")] if m else []
    if expr.startswith("!"):
        return labels.get(key) not in values
    return key in labels and labels[key] in values


@dataclass(frozen=True)
class Request:
    """A task's Ray resource request (module docstring): ``num_cpus`` as given (None: Ray's
    default 1), ``named`` the demands its options name (GPU, custom resources, the accelerator
    marker, label terms; CPU when given, 0 included), ``memory_gb`` its memory."""
    num_cpus: float | None = None
    named: tuple[tuple[str, float], ...] = ()
    memory_gb: float = 0.0

    def on_nodes(self) -> tuple[tuple[str, float], ...]:
        """What it holds on a node in Ray's resource model: CPU (default 1), memory, the rest."""
        d = dict(self.named) | {CPU: 1.0 if self.num_cpus is None else self.num_cpus,
                                MEMORY: self.memory_gb}
        return tuple(sorted((k, v) for k, v in d.items() if v > 0))

    def on_slot(self) -> tuple[tuple[str, float], ...]:
        """What it holds on a server of one slot: the slot, its memory, what its options name."""
        d = dict(self.named) | {SLOT: 1.0, MEMORY: self.memory_gb}
        return tuple(sorted((k, v) for k, v in d.items() if v > 0))

    @property
    def gpu(self) -> float:
        return dict(self.named).get(GPU, 0.0)


def parse_options(options: Mapping[str, Any] | None, memory_gb: float = 0.0,
                  where: str = "options") -> Request:
    """The :class:`Request` of Ray task ``options`` (only :data:`RAY_DEMAND_OPTIONS` are read;
    ``memory`` in bytes, as Ray takes it) for a task whose own memory hint is ``memory_gb``
    (the larger of the two counts). Raises :class:`DemandError` naming the option."""
    named: dict[str, float] = {}
    num_cpus = None
    mem = float(memory_gb)
    opts = options or {}
    for key in RAY_DEMAND_OPTIONS:
        value = opts.get(key)
        if value is None:
            continue
        at = f"{where}.{key}"
        if key == "num_cpus":  # kept when 0 too: it overrides Ray's default of 1
            num_cpus = named[CPU] = check_amount(at, value)
        elif key == "num_gpus":
            g = check_amount(at, value, gpu=True)
            if g:
                named[GPU] = g
        elif key == "memory":
            mem = max(mem, check_amount(at, value) / 1e9)
        elif key == "resources":
            named.update({k: v for k, v in check_resources(value, at).items() if v})
        elif key == "accelerator_type":
            if not isinstance(value, str) or not _LABEL_RE.fullmatch(value):
                raise DemandError(f"{at}: must be an accelerator type name (e.g. A100), got "
                                  f"{str(value)[:80]!r}")
            named[ACCEL_PREFIX + value] = ACCEL_AMOUNT
        else:  # label_selector
            for k, expr in parse_selector(value, at):
                named[f"{LABEL_PREFIX}{k}={expr}"] = 1.0
    return Request(num_cpus, tuple(sorted(named.items())), mem)
