"""The one place that reads YAML configuration files (PyYAML + stdlib; the rest of ``envs``
never imports yaml).

Every file is validated into typed, frozen dataclasses (:func:`envs.config.build`): unknown keys
and out-of-range values raise :class:`~envs.config.ConfigError` naming the dotted key.
Command-line overrides use ``--set dotted.key=value`` (the value is parsed as YAML) and are
validated the same way. The driver (``scale_ray.config``), Serve (``serve_apps``) and the tools
all load env configs through :func:`load_env`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from .config import ConfigError, EnvConfig, load_env_config, merge

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_ENV_CONFIG = CONFIG_DIR / "env" / "paper.yaml"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``; a clear error for a missing file or bad syntax."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """``["workload.horizon_s=50", "mdp.mask_infeasible=true"]`` -> nested mapping."""
    out: dict[str, Any] = {}
    for item in items or ():
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw else None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def resolve_config_path(path: str | Path) -> Path:
    """A config path as given, or relative to the repository (``configs/...`` from anywhere)."""
    p = Path(path)
    if p.is_file() or p.is_absolute():
        return p
    alt = REPO_ROOT / p
    return alt if alt.is_file() else p


def env_mapping(source: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    """The env section as a plain mapping: a file path, a mapping, or None (paper defaults)."""
    if source is None:
        source = DEFAULT_ENV_CONFIG
    data = dict(source) if isinstance(source, Mapping) else read_yaml(resolve_config_path(source))
    if "file" in data:  # {file: configs/env/x.yaml, <overrides>}: inherit, then override
        base = env_mapping(str(data.pop("file")))
        data = merge(base, data)
    return data


def load_env(source: str | Path | Mapping[str, Any] | None = None,
             overrides: Sequence[str] | Mapping[str, Any] | None = None,
             servers: int | None = None) -> EnvConfig:
    """Validated :class:`EnvConfig` from a file/mapping plus overrides and a cluster size."""
    data = env_mapping(source)
    if overrides:
        ov = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
        data = merge(data, ov)
    cfg = load_env_config(data)
    return cfg.with_servers(servers) if servers is not None else cfg


__all__ = ["read_yaml", "parse_overrides", "load_env", "env_mapping", "resolve_config_path",
           "CONFIG_DIR", "REPO_ROOT", "DEFAULT_ENV_CONFIG"]
