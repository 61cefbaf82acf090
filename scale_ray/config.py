"""Configuration of the driver: env configs are read by :mod:`envs.config_files` (also what
Serve uses; imported here for the driver's modules and tools).

Every file is validated into typed, frozen dataclasses (``envs.config.build``): unknown keys and
out-of-range values raise :class:`ConfigError` naming the dotted key. Command-line overrides use
``--set dotted.key=value`` (the value is parsed as YAML) and are validated the same way.
"""

from __future__ import annotations

from envs.config import ConfigError
from envs.config_files import (CONFIG_DIR, DEFAULT_ENV_CONFIG, REPO_ROOT, env_mapping, load_env,
                               parse_overrides, read_yaml, resolve_config_path)

__all__ = ["ConfigError", "read_yaml", "parse_overrides", "load_env", "env_mapping",
           "resolve_config_path", "CONFIG_DIR", "REPO_ROOT", "DEFAULT_ENV_CONFIG"]
