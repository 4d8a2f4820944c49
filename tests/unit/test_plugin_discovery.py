"""Plugin discovery reads the installed distributions' entry points once per process, and again exactly when
what they are read from changes: a distribution installed, removed or edited, sys.path changed. Counted at
``importlib.metadata.entry_points``, the one call that reads every distribution's metadata."""

import importlib.metadata
import shutil
import time

import pytest

from octavo.core import plugin_discovery
from octavo.core.plugin_manager import PluginManager, reset_plugin_manager
from tests.unit.plugin_dists import age, make_dist


@pytest.fixture
def reads(monkeypatch):
    """The number of metadata reads so far (``reads()``), once the installed metadata is cacheable: a package
    installed in the last two seconds (another test's ``pip install``) is not trusted yet, by design."""
    deadline = time.monotonic() + 10
    while plugin_discovery._metadata_state() is None and time.monotonic() < deadline:
        time.sleep(0.25)
    calls = []
    real = importlib.metadata.entry_points

    def counted(*args, **kwargs):
        calls.append(kwargs.get("group"))
        return real(*args, **kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    return lambda: len(calls)


def test_entry_points_read_once_while_nothing_changes(reads, monkeypatch):
    for var in ("OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    first = PluginManager()
    before = reads()
    again = [PluginManager() for _ in range(3)]
    assert reads() == before  # no metadata read: the same installed distributions
    for pm in again:  # and the same plugins, in the same order, as the first manager found
        assert list(pm.plugins) == list(first.plugins)
        assert pm.names("platforms") == first.names("platforms")


def test_install_edit_and_remove_are_seen(site, reads):
    name, dist = make_dist(site, "")
    age(site)
    assert name in PluginManager().plugins
    n = reads()
    PluginManager()
    assert reads() == n  # cached: nothing changed since

    other, _ = make_dist(site, "")  # pip install: a new dist-info folder
    age(site, 30)
    assert {name, other} <= set(PluginManager().plugins)
    assert reads() == n + 1

    info = site / f"{name.replace('fake', 'octavo_fake_')}-0.1.0.dist-info"
    text = (info / "entry_points.txt").read_text()
    (info / "entry_points.txt").write_text(text.replace(f"{name} =", f"renamed{name} ="))  # edited in place
    age(info, 20)
    plugins = PluginManager().plugins
    assert f"renamed{name}" in plugins and name not in plugins and other in plugins

    shutil.rmtree(info)  # pip uninstall
    plugins = PluginManager().plugins
    assert f"renamed{name}" not in plugins and other in plugins
    assert reads() == n + 3


def test_sys_path_change_is_seen(site, reads, tmp_path_factory, monkeypatch):
    PluginManager()
    n = reads()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    name, _ = make_dist(elsewhere, "")
    age(elsewhere)
    monkeypatch.syspath_prepend(str(elsewhere))
    assert name in PluginManager().plugins
    assert reads() == n + 1


def test_just_written_metadata_is_read_every_time(site, reads):
    """A file written in the last two seconds may be rewritten within the same file-time tick, unseen by its
    stat: such a state is never cached."""
    make_dist(site, "")
    n = reads()
    for _ in range(2):
        age(site, 0)  # written just now, however long the previous load took on a busy machine
        PluginManager()
    assert reads() == n + 2


def test_reload_with_rescan_reads_again(reads):
    from octavo.registry import get_plugin_manager, reload_plugins

    reload_plugins()
    get_plugin_manager()  # an earlier test's manager may have been loaded under another sys.path: load here
    n = reads()
    reload_plugins()
    get_plugin_manager()
    assert reads() == n  # a reload for changed OCTAVO_* variables reuses the read
    reload_plugins(rescan=True)
    get_plugin_manager()
    assert reads() == n + 1
    reset_plugin_manager()
