"""Every file of the web UI (sdk/server/static/) is matched by the package-data globs in pyproject.toml, so
a wheel ships it (an editable install serves the source tree and would hide a miss)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

REPO = Path(__file__).resolve().parents[2]


def test_static_files_are_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["octavo.server"]
    files = [p.relative_to(REPO / "sdk" / "server").as_posix() for p in (REPO / "sdk/server/static").rglob("*")
             if p.is_file()]
    assert {"static/chat.html", "static/dashboard.html", "static/ui.css"} <= set(files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"add these to [tool.setuptools.package-data] in pyproject.toml: {missing}"
