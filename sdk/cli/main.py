"""The ``octavo`` console script: builds the argparse parser from the built-in command modules and the
``octavo_add_cli_commands`` hook, then runs the chosen subcommand.

Each module in :data:`BUILTIN_COMMANDS` defines ``add_parser(subparsers)``, which adds its subparser and sets
``func=callable(args) -> int``. A module that does not exist (yet) is skipped silently, so commands land one
at a time. Plugin and configuration errors print one clear line, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BUILTIN_COMMANDS = [
    "octavo.cli.plugins_cmd",
    "octavo.cli.generate",
    "octavo.cli.chat",
    "octavo.cli.serve",
    "octavo.cli.bench",
]


def build_parser() -> argparse.ArgumentParser:
    """The full parser: built-in subcommands, then the ones plugins add."""
    from octavo.version import __version__  # not at the top: `octavo serve` spawns its core before this

    parser = argparse.ArgumentParser(
        prog="octavo",
        description="octavo: an LLM inference and serving engine whose chips, models and kernels are plugins.",
    )
    parser.add_argument("--version", action="version", version=f"octavo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in BUILTIN_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:  # not written yet: skip silently
                continue
            raise
        module.add_parser(subparsers)

    from octavo.core.plugin_manager import get_plugin_manager

    get_plugin_manager().hook.octavo_add_cli_commands(subparsers=subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``octavo``; returns the exit status (the console script exits with it)."""
    if argv is None:  # `octavo serve`: spawn the engine core before anything else (core/engine_prestart.py)
        from octavo.core import engine_prestart

        try:
            if engine_prestart.wanted(sys.argv[1:]):
                from octavo.core.start_gc import pause_gc

                pause_gc()  # until each process's start-up imports are done (core/start_gc.py)
                engine_prestart.prestart(sys.argv[1:])
        except ValueError as e:  # OCTAVO_PRESTART_CORE=<not 0/1>
            print(f"octavo: error: {e}", file=sys.stderr)
            return 2
    from octavo.config import ConfigError
    from octavo.errors import PluginError

    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 0 if args.command is None else 2
        return int(func(args) or 0)
    except (ConfigError, PluginError) as e:
        print(f"octavo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `octavo plugins | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if argv is None:
            from octavo.core import engine_prestart

            engine_prestart.discard()  # not taken (an error, an in-process core): let it exit


if __name__ == "__main__":  # python -m octavo.cli.main
    sys.exit(main())
