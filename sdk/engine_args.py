"""vLLM's engine-argument names for scripts written against vLLM: ``EngineArgs``, ``AsyncEngineArgs``,
``FlexibleArgumentParser``.

``EngineArgs`` is a dataclass with one field per ``OctavoSettings`` setting (all ``None``: not given), so the
usual vLLM idioms work unchanged::

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    engine_args = EngineArgs.from_cli_args(parser.parse_args())
    llm = LLM(**dataclasses.asdict(engine_args))      # or LLM.from_engine_args(engine_args)

A vLLM argument octavo does not have is refused naming it: ``EngineArgs(swap_space=4)`` is a ``TypeError``
and ``--swap-space 4`` an argparse error ("unrecognized arguments: --swap-space"), never dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from octavo.config import FIELD_SECTION, OctavoSettings


def _fields() -> list[tuple[str, Any, Any]]:
    return [(name, Any, dataclasses.field(default=None)) for name in FIELD_SECTION]


class _Methods:
    """What vLLM's ``EngineArgs`` offers on top of its fields."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one ``--flag`` per setting (the same flags as ``octavo serve``); returns the parser."""
        from octavo.cli.flags import add_settings_arguments

        add_settings_arguments(parser)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Any:
        """The engine arguments among parsed ``args`` (a script's own arguments are left alone)."""
        return cls(**{name: getattr(args, name) for name in FIELD_SECTION if getattr(args, name, None) is not None})

    def create_engine_config(self) -> OctavoSettings:
        """The ``OctavoSettings`` these arguments describe (refusing bad values, naming them)."""
        return OctavoSettings.from_kwargs(**self.given())

    def given(self) -> dict[str, Any]:
        """The arguments that were set (not ``None``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


EngineArgs = dataclasses.make_dataclass("EngineArgs", _fields(), bases=(_Methods,))
EngineArgs.__doc__ = "Engine arguments by their vLLM names (every OctavoSettings field); None means not given."
AsyncEngineArgs = dataclasses.make_dataclass("AsyncEngineArgs", [], bases=(EngineArgs,))
EngineArgs.__module__ = AsyncEngineArgs.__module__ = __name__
AsyncEngineArgs.__doc__ = "The same arguments, for ``AsyncLLM.from_engine_args``."


class FlexibleArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that also accepts ``--max_model_len`` for ``--max-model-len`` and
    ``--flag=value``, as vLLM's does. Anything unknown still fails, naming the argument."""

    def parse_args(self, args: list[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        args = list(sys.argv[1:] if args is None else args)
        fixed = []
        for arg in args:
            if arg.startswith("--") and arg != "--":
                key, eq, value = arg.partition("=")
                arg = key.replace("_", "-") + eq + value
            fixed.append(arg)
        return super().parse_args(fixed, namespace)


def settings_from_engine_args(engine_args: Any) -> OctavoSettings:
    """``OctavoSettings`` from an ``EngineArgs`` (or anything with ``create_engine_config``)."""
    if not hasattr(engine_args, "create_engine_config"):
        raise TypeError(f"from_engine_args needs an octavo EngineArgs, got {type(engine_args).__name__}")
    return engine_args.create_engine_config()


__all__ = ["AsyncEngineArgs", "EngineArgs", "FlexibleArgumentParser", "settings_from_engine_args"]
