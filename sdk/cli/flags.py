"""CLI flags generated from the :class:`~octavo.config.OctavoSettings` fields: one source of truth.

Every field becomes ``--kebab-case-name`` in an argument group named after its section; its ``--help``
line is the field's description plus its default. Booleans get ``--x/--no-x``, ``Literal`` fields get
``choices``, dict fields take JSON. A flag overrides the environment and the config file only when given:
defaults are ``None`` here, so the settings' own defaults stay the single source.

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)                  # or sections=["model", "device"]
    settings = settings_from_args(parser.parse_args())
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any, Literal, Union

from octavo.config import FIELD_SECTION, SECTIONS, OctavoSettings

_NONE = type(None)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not _NONE]
        if len(args) == 1:
            return args[0]
    return annotation


def _human_int(text: str) -> int:
    """``--max-model-len 32k`` (vLLM's sizes: k/m/g powers of 1000, K/M/G powers of 1024) -> an int, so
    ``EngineArgs.from_cli_args`` holds the same value a script passing ``max_model_len=`` would."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    try:
        return int(float(text[:-1]) * scale) if scale != 1 else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer with an optional k/m/g/K/M/G suffix "
                                         "(e.g. 32k = 32000, 32K = 32768)") from None


def _json_dict(raw: str) -> dict:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}); pass an object like '{{\"key\": 1}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object like '{\"key\": 1}'")
    return value


def _help(info: Any) -> str:
    text = (info.description or "").replace("%", "%%")
    default = info.get_default(call_default_factory=True)
    return f"{text} (default: {default})"


def _add_field(group: argparse._ArgumentGroup, name: str, info: Any) -> None:
    flag = "--" + name.replace("_", "-")
    kind = _unwrap_optional(info.annotation)
    kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _help(info)}
    if kind is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        return
    if typing.get_origin(kind) is Literal:
        choices = list(typing.get_args(kind))
        kwargs.update(choices=choices, metavar="{" + ",".join(map(str, choices)) + "}")
    elif (info.json_schema_extra or {}).get("human_int"):  # --max-model-len 32k (vLLM): parsed by the setting
        kwargs.update(type=_human_int, metavar="INT")
    elif kind in (int, float):
        kwargs.update(type=kind, metavar=kind.__name__.upper())
    elif kind is dict or typing.get_origin(kind) is dict:
        kwargs.update(type=_json_dict, metavar="JSON")
    elif typing.get_origin(kind) is list:  # --lora-modules a=/p b=/q
        kwargs.update(nargs="+", metavar=name.upper())
    else:
        kwargs.update(metavar=name.upper())
    group.add_argument(flag, **kwargs)


def add_settings_arguments(parser: argparse.ArgumentParser, sections: list[str] | None = None) -> None:
    """Add one flag per settings field (of the given sections, default all) and ``--config FILE``.

    Args:
        parser: the parser (or subparser) to extend.
        sections: section names from :data:`octavo.config.SECTIONS`; ``None`` means every section.
    """
    unknown = set(sections or ()) - set(SECTIONS)
    if unknown:
        raise ValueError(f"Unknown settings sections {sorted(unknown)}; known: {list(SECTIONS)}")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML or JSON file of settings (flat names as below). Flags and OCTAVO_* "
                             "environment variables override it.")
    for section, cls in SECTIONS.items():
        if sections is not None and section not in sections:
            continue
        group = parser.add_argument_group(f"{section} settings")
        for name, info in cls.model_fields.items():
            _add_field(group, name, info)


def settings_from_args(args: argparse.Namespace) -> OctavoSettings:
    """Build the settings from parsed flags: given flags > environment > config file > defaults."""
    given = {name: getattr(args, name) for name in FIELD_SECTION if getattr(args, name, None) is not None}
    return OctavoSettings.from_kwargs(config_file=getattr(args, "config", None), **given)
