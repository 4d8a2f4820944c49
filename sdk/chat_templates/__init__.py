"""Chat templates shipped with octavo (``--chat-template``); ``path(name)`` gives a template's file."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> str:
    """The file of a shipped template, e.g. ``path("smollm2_tool_use")``."""
    file = HERE / f"{name}.jinja"
    if not file.is_file():
        known = sorted(p.stem for p in HERE.glob("*.jinja"))
        raise ValueError(f"no shipped chat template {name!r}; shipped: {known}")
    return str(file)
