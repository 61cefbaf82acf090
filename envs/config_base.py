"""The typed-config machinery every config section of the project uses (stdlib only):
:func:`build` a frozen dataclass from a mapping, rejecting unknown keys, wrong types and
out-of-range values with a :class:`ConfigError` naming the dotted key and the allowed range; field
metadata from :func:`rng`; :func:`to_dict`, :func:`merge`, :func:`replace`. ``envs.config``
re-exports all of it next to the simulator's own tree."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


def rng(ge: float | None = None, le: float | None = None, gt: float | None = None,
        lt: float | None = None, doc: str = "") -> dict:
    """Field metadata: the allowed numeric range and a one-line description."""
    return {"ge": ge, "le": le, "gt": gt, "lt": lt, "doc": doc}


def range_text(meta: Mapping[str, Any]) -> str:
    lo = f"> {meta['gt']}" if meta.get("gt") is not None else (
        f">= {meta['ge']}" if meta.get("ge") is not None else "")
    hi = f"< {meta['lt']}" if meta.get("lt") is not None else (
        f"<= {meta['le']}" if meta.get("le") is not None else "")
    return " and ".join(p for p in (lo, hi) if p) or "any finite value"


def check_range(path: str, value: float, meta: Mapping[str, Any]) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be finite, got {value!r}")
    bad = ((meta.get("ge") is not None and value < meta["ge"])
           or (meta.get("le") is not None and value > meta["le"])
           or (meta.get("gt") is not None and value <= meta["gt"])
           or (meta.get("lt") is not None and value >= meta["lt"]))
    if bad:
        raise ConfigError(f"{path}: {value!r} is out of range; allowed: {range_text(meta)}")


def _literal(path: str, choices: tuple, value: Any) -> Any:
    """``value`` if it is one of ``choices``; YAML 1.1 reads off/on/no/yes as booleans, so a
    boolean is the string choice it spells, if there is one."""
    if isinstance(value, bool) and value not in choices:
        spelled = [a for a in choices if isinstance(a, str)
                   and a.lower() in (("on", "yes", "true") if value else ("off", "no", "false"))]
        if spelled:
            return spelled[0]
    if value not in choices:
        raise ConfigError(f"{path}: {value!r} is not allowed; choose one of {list(choices)}")
    return value


def coerce(path: str, tp: Any, value: Any, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        errors = []
        for a in non_none:
            try:
                return coerce(path, a, value, meta)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of "
                          f"{[getattr(a, '__name__', str(a)) for a in non_none]}")
    if origin is Literal:
        return _literal(path, args, value)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        item_tp = args[0] if args else Any
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis or origin is list:
            return tuple(coerce(f"{path}[{i}]", item_tp, v, meta) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(coerce(f"{path}[{i}]", a, v, meta) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        check_range(path, value, meta)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        value = float(value)
        check_range(path, value, meta)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug in a config class


def build(cls: type, data: Mapping[str, Any] | None, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad values raise ConfigError."""
    if data is None:
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    removed = getattr(cls, "REMOVED_KEYS", {})  # {key: why it went and what replaces it}
    for name in sorted(set(data) & set(removed)):
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{name} was removed: {removed[name]}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"unknown key {where}{unknown[0]}; allowed keys: {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{path}.{name}" if path else name
        if name in data:
            kwargs[name] = coerce(key, hints[name], data[name], f.metadata)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path + ': ' if path else ''}{e}") from None


def to_dict(cfg: Any) -> Any:
    """Plain-data form of a config (tuples become lists), suitable for YAML/JSON."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict:
    """Recursive dict merge: mappings merge, everything else in ``override`` replaces."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def replace(cfg: Any, **changes: Any) -> Any:
    """A validated copy of ``cfg`` with nested changes (``replace(c, workload={"horizon_s": 50})``)."""
    return build(type(cfg), merge(to_dict(cfg), changes))
