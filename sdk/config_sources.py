"""Where settings come from besides explicit arguments: ``OCTAVO_<FIELD>`` environment variables and a YAML/JSON
config file (``--config`` / ``OCTAVO_CONFIG``), both of flat vLLM-style names that ``nest`` groups into sections.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic_settings import PydanticBaseSettingsSource

from octavo.config_sections import FIELD_SECTION, SECTIONS
from octavo.errors import ConfigError

ENV_PREFIX = "OCTAVO_"


def nest(flat: dict[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """Group flat ``field: value`` pairs into sections; an unknown name is an error naming ``source``."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key in SECTIONS and isinstance(value, dict):
            nested.setdefault(key, {}).update(value)
            continue
        section = FIELD_SECTION.get(key)
        if section is None:
            import difflib

            close = difflib.get_close_matches(key, FIELD_SECTION, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else " Run `octavo serve --help` for the list."
            raise ConfigError(f"Unknown setting {key!r} (from {source}).{hint}")
        nested.setdefault(section, {})[key] = value
    return nested


class _FlatEnvSource(PydanticBaseSettingsSource):
    """``OCTAVO_MAX_NUM_SEQS=8`` -> scheduler.max_num_seqs (values parsed as JSON when they parse)."""

    def get_field_value(self, field, field_name):  # pragma: no cover - unused, required by the ABC
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        flat = {}
        for key, raw in os.environ.items():
            if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX):].lower() in FIELD_SECTION:
                flat[key[len(ENV_PREFIX):].lower()] = _parse_env_value(raw)
        return nest(flat, "environment")


class _ConfigFileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls, path: str | None):
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field, field_name):  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return nest(load_config_file(self.path), f"config file {self.path}") if self.path else {}


def _parse_env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def load_config_file(path: str) -> dict[str, Any]:
    """Read a YAML or JSON config file of flat (or sectioned) settings."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file {path!r} does not exist; pass an existing .yaml or .json file to --config.")
    text = p.read_text()
    if p.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path!r} must hold a mapping of setting names to values.")
    return {k.replace("-", "_"): v for k, v in data.items()}
