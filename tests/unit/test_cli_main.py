"""The ``octavo`` entry point: version, built-in and plugin subcommands, error reporting, ``octavo plugins``."""

import json
import subprocess
import sys

import pytest

import octavo
from octavo.cli import main as cli_main
from octavo.cli.plugins_cmd import format_table
from octavo.core import plugin_manager
from octavo.core.hookspecs import HOOK_GROUPS


def run(*argv):
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", *argv], capture_output=True, text=True,
                          timeout=120)


def test_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"octavo {octavo.__version__}"


def test_plugins_json_lists_builtins():
    proc = run("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    report = {p["name"]: p for p in json.loads(proc.stdout)}
    platforms = report["platforms"]  # one built-in entry point per kind
    assert platforms["distribution"] == "octavo" and platforms["builtin"] and platforms["version"] == octavo.__version__
    assert platforms["hooks"] == ["octavo_register_platforms"]
    cpu = next(r for r in platforms["registrations"] if r["name"] == "cpu")
    assert cpu == {"kind": "platforms", "name": "cpu", "shadowed_by": None,
                   "target": "octavo.plugins.platforms.cpu:CpuPlatform", "available": True, "reason": None}
    for plugin in report.values():
        assert set(plugin) >= {"name", "distribution", "version", "hooks", "registrations", "error"}


def test_plugins_table_and_hooks():
    report = [{"name": "a", "distribution": "octavo-a", "version": "1", "hooks": ["octavo_register_models"],
               "error": None, "registrations": [
                   {"kind": "models", "name": "X", "target": "m:X", "shadowed_by": None},
                   {"kind": "platforms", "name": "p", "target": "m:P", "shadowed_by": None, "available": False,
                    "reason": "no chip"}]},
              {"name": "b", "distribution": "octavo-b", "version": "2", "hooks": [], "error": "ImportError: x",
               "registrations": []}]
    lines = format_table(report, ["c"]).splitlines()
    assert lines[0].split() == ["PLUGIN", "DISTRIBUTION", "KIND", "NAME", "STATUS"]
    assert lines[1].split() == ["a", "octavo-a", "1", "models", "X", "registered"]
    assert lines[2].endswith("unavailable: no chip")
    assert lines[3].endswith("FAILED TO LOAD: ImportError: x")
    assert lines[-1].endswith(": c")
    proc = run("plugins", "--hooks")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == len(HOOK_GROUPS)


def test_no_command_prints_help(capsys):
    assert cli_main.main([]) == 0
    assert "plugins" in capsys.readouterr().out


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(["frobnicate"])
    assert e.value.code == 2 and "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_missing_builtin_command_module_is_skipped(monkeypatch):
    monkeypatch.setattr(cli_main, "BUILTIN_COMMANDS", ["octavo.cli.plugins_cmd", "octavo.cli.not_written_yet"])
    parser = cli_main.build_parser()
    assert parser.parse_args(["plugins"]).func is not None


def test_plugin_commands_and_errors_through_the_hook(monkeypatch, capsys):
    class Plugin:
        @staticmethod
        @octavo.hookimpl
        def octavo_add_cli_commands(subparsers):
            p = subparsers.add_parser("shout")
            p.add_argument("word")
            p.set_defaults(func=lambda args: print(args.word.upper()) or 3)
            p = subparsers.add_parser("fail")
            p.set_defaults(func=lambda args: plugin_manager.get_plugin_manager().resolve("platforms", "nope"))

    pm = plugin_manager.PluginManager(plugins=(("shouter", Plugin, "octavo-shouter"),))
    monkeypatch.setattr(plugin_manager, "_PM", pm)
    assert cli_main.main(["shout", "hi"]) == 3
    assert capsys.readouterr().out == "HI\n"
    assert cli_main.main(["fail"]) == 2  # plugin and config errors: one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("octavo: error: No platform named 'nope'") and "Traceback" not in err
