"""Fixtures of the unit tests. ``site``: a fresh site directory on sys.path for the plugin tests, which write
installed distributions into it (``tests.unit.plugin_dists``)."""

import pytest


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory on sys.path, plus a clean plugin environment."""
    for var in ("OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGINS", "OCTAVO_TRACE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path
