"""Ray's label selectors (the ``label_selector`` task option) in the resource model of
``envs.nodes``: their syntax, as Ray checks it (``ray/_private/label_utils.py``), their matching
against a node's labels, and their form as demands (``label:key=expr``: 1; see ``envs.nodes``'s
docstring for the semantics). Stdlib only."""

from __future__ import annotations

import re
from typing import Mapping

__all__ = ["LABEL_PREFIX", "parse_selector", "selector_matches", "selector_demands"]

LABEL_PREFIX = "label:"
# Ray's syntax (ray/_private/label_utils.py): a label value, and a selector value
_VALUE = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_SELECTOR = re.compile(rf"!?(?:in\(({_VALUE}(?:, ?{_VALUE})*)\)|({_VALUE}))")
_KEY = re.compile(rf"(?:[a-z0-9](?:[a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_VALUE}")


def parse_selector(selector: Mapping[str, str] | None, where: str = "label_selector"
                   ) -> tuple[tuple[str, str], ...]:
    """Ray's ``label_selector`` option, checked with Ray's syntax: sorted ``(key, expr)`` pairs.
    Raises ValueError naming the key and what is allowed."""
    if selector is None:
        return ()
    if not isinstance(selector, Mapping):
        raise ValueError(f"{where}: must be a mapping of label key to selector, got "
                         f"{type(selector).__name__}")
    out = []
    for k, v in selector.items():
        if not isinstance(k, str) or not _KEY.fullmatch(k):
            raise ValueError(f"{where}: key {k!r} is not a Ray label key ([prefix/]name, up to "
                             "63 alphanumerics, '-', '_', '.')")
        if not isinstance(v, str) or not _SELECTOR.fullmatch(v):
            raise ValueError(f"{where}[{k!r}]: {v!r} is not a Ray label selector (one of: value, "
                             "!value, in(a,b), !in(a,b))")
        out.append((k, v))
    return tuple(sorted(out))


def selector_matches(key: str, expr: str, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` matches the selector term ``{key: expr}`` (Ray's
    semantics: module docstring)."""
    m = _SELECTOR.fullmatch(expr)
    values = [v.strip() for v in (m.group(1) or m.group(2)).split(",")] if m else []
    if expr.startswith("!"):
        return labels.get(key) not in values
    return key in labels and labels[key] in values


def selector_demands(selector: tuple[tuple[str, str], ...]) -> dict[str, float]:
    """A parsed selector as demand pairs (``label:key=expr``: 1)."""
    return {f"{LABEL_PREFIX}{k}={v}": 1.0 for k, v in selector}
