"""``octavo plugins``: what is installed, what each plugin registers, what is shadowed, what runs here.

    octavo plugins            a readable table
    octavo plugins --json     one object per plugin: name, distribution, version, hooks, registrations
                              [kind, name, target, shadowed_by, and for platforms and attention backends
                              available + reason], error (set when the plugin failed to import)
    octavo plugins --hooks    every hook octavo offers, with its lifecycle group and summary
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("plugins", help="List installed plugins and what they register.",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="Print a JSON list, one object per plugin.")
    parser.add_argument("--hooks", action="store_true", help="List the hooks a plugin can implement.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from octavo.cli.plugins_report import build_report
    from octavo.registry import get_plugin_manager

    pm = get_plugin_manager()
    if args.hooks:
        print(_hooks_table())
        return 0
    report = build_report(pm)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(report, pm.disabled))
    print(_default_platform(pm))
    return 0


def _default_platform(pm) -> str:
    """Which platform an engine with default settings would pick here, and who picked it (never silent)."""
    from octavo.config import OctavoSettings
    from octavo.errors import PluginError

    try:
        answer, why = pm.first_answer("octavo_select_platform", settings=OctavoSettings())
    except PluginError as e:
        return f"\ndefault platform here: none ({e})"
    return f"\ndefault platform here: {answer} (chosen by the {why}; --device overrides)"


def _status(reg: dict) -> str:
    if reg["shadowed_by"]:
        return f"shadowed by {reg['shadowed_by']}"
    if "platforms" in reg:
        return "runs on: " + (", ".join(reg["platforms"]) or "no device type")
    if "available" not in reg:
        return "registered"
    return "available" if reg["available"] else f"unavailable: {reg['reason']}"


def format_table(report: list[dict], disabled: list[str] | None = None) -> str:
    """The readable table: one row per registration, one row for a plugin that failed or registers nothing."""
    rows = [("PLUGIN", "DISTRIBUTION", "KIND", "NAME", "STATUS")]
    for p in report:
        dist = f"{p['distribution']} {p['version']}"
        if p["error"]:
            rows.append((p["name"], dist, "-", "-", f"FAILED TO LOAD: {p['error']}"))
            continue
        if not p["registrations"]:
            rows.append((p["name"], dist, "-", "-", "hooks: " + (", ".join(p["hooks"]) or "none")))
        for reg in p["registrations"]:
            rows.append((p["name"], dist, reg["kind"], reg["name"], _status(reg)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    if disabled:
        lines.append(f"\nnot loaded (OCTAVO_DISABLE_PLUGINS / OCTAVO_PLUGINS): {', '.join(disabled)}")
    return "\n".join(line.rstrip() for line in lines)


def _hooks_table() -> str:
    from octavo.core import hookspecs

    lines = []
    for name, group in hookspecs.hook_groups().items():
        doc = (getattr(hookspecs, name).__doc__ or "").strip().splitlines()[0]
        lines.append(f"{group:<13} {name:<36} {doc}")
    return "\n".join(lines)
