"""The plugin manager against real installed distributions: each test writes a plugin package and its
``.dist-info`` (entry point in group ``octavo``) into a directory on sys.path, exactly what ``pip install``
leaves behind, and loads a fresh PluginManager over it. OCTAVO_PLUGINS keeps other third-party plugins out."""

import subprocess
import sys

import pytest

from octavo.config import OctavoSettings
from octavo.core.plugin_manager import (
    PluginConflictError,
    PluginError,
    PluginManager,
    UnknownPluginError,
    get_plugin_manager,
)
from octavo.plugins.platforms.cpu import CpuPlatform
from tests.unit.plugin_dists import CPU_SUBCLASS, make_dist, only


def test_builtins_registered_with_distribution_octavo():
    pm = get_plugin_manager()
    assert "cpu" in pm.names("platforms")
    reg = pm.registration("platforms", "cpu")
    assert reg.distribution == "octavo" and reg.builtin
    assert pm.plugins["platforms"].hooks == ["octavo_register_platforms"]  # one entry point per kind
    assert issubclass(pm.resolve("platforms", "cpu"), CpuPlatform)


def test_unknown_name_lists_registered_names():
    with pytest.raises(UnknownPluginError) as e:
        get_plugin_manager().resolve("platforms", "cpux")
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "'cpux'" in msg and "Did you mean 'cpu'" in msg and "cpu" in msg and "octavo plugins" in msg


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="Unknown plugin kind"):
        get_plugin_manager().names("platform")


def test_third_party_shadows_builtin(site, monkeypatch):
    name, dist = make_dist(site, CPU_SUBCLASS.replace("PLATFORM", "cpu") + """
@hookimpl
def octavo_register_platforms(register):
    register("cpu", "MODULE:Plat")
""")
    only(monkeypatch, name)
    pm = PluginManager()
    winner = pm.registration("platforms", "cpu")
    assert (winner.plugin, winner.distribution) == (name, dist)
    builtin = next(r for r in pm.plugins["platforms"].registrations if r.name == "cpu")
    assert builtin.shadowed_by == f"{name} ({dist})"
    assert pm.resolve("platforms", "cpu").__name__ == "Plat"
    assert type(pm.select_platform(OctavoSettings())).__name__ == "Plat"


def test_two_third_party_plugins_on_one_name_is_an_error_naming_both(site, monkeypatch):
    body = CPU_SUBCLASS.replace("PLATFORM", "dup") + """
@hookimpl
def octavo_register_platforms(register):
    register("dup", "MODULE:Plat")
"""
    (a, dist_a), (b, dist_b) = make_dist(site, body), make_dist(site, body)
    only(monkeypatch, a, b)
    with pytest.raises(PluginConflictError) as e:
        PluginManager()
    assert dist_a in str(e.value) and dist_b in str(e.value) and "'dup'" in str(e.value)
    monkeypatch.setenv("OCTAVO_DISABLE_PLUGINS", dist_b)  # the fix the message suggests
    assert PluginManager().registration("platforms", "dup").distribution == dist_a


def test_misspelled_hook_fails_clearly(site, monkeypatch):
    name, _ = make_dist(site, """
from octavo import hookimpl

@hookimpl
def octavo_register_platfroms(register):
    pass
""")
    only(monkeypatch, name)
    with pytest.raises(PluginError) as e:
        PluginManager()
    msg = str(e.value)
    assert name in msg and "octavo_register_platfroms" in msg and "Did you mean 'octavo_register_platforms'" in msg


def test_hookimpl_with_unknown_argument_names_the_plugin(site, monkeypatch):
    name, dist = make_dist(site, """
from octavo import hookimpl

@hookimpl
def octavo_register_platforms(register, colour):
    pass
""")
    only(monkeypatch, name)
    with pytest.raises(PluginError, match=f"(?s){name}.*{dist}.*colour"):
        PluginManager()


def test_bad_register_target_is_reported_with_the_plugin(site, monkeypatch):
    name, dist = make_dist(site, """
from octavo import hookimpl

@hookimpl
def octavo_register_platforms(register):
    register("broken", "octavo_no_such_module:Thing")
""")
    only(monkeypatch, name)
    pm = PluginManager()  # loading stays lazy: nothing is imported yet
    with pytest.raises(PluginError) as e:
        pm.resolve("platforms", "broken")
    msg = str(e.value)
    assert name in msg and dist in msg and "octavo_no_such_module:Thing" in msg and "ModuleNotFoundError" in msg
    entry = next(p for p in pm.report() if p["name"] == name)["registrations"][0]
    assert entry["available"] is False and name in entry["reason"]


def test_malformed_target_rejected_at_registration(site, monkeypatch):
    name, _ = make_dist(site, """
from octavo import hookimpl

@hookimpl
def octavo_register_models(register):
    register("FooForCausalLM", "no_colon_here")
""")
    only(monkeypatch, name)
    with pytest.raises(PluginError, match=f"{name}.*'package.module:ClassName'"):
        PluginManager()


def test_plugin_that_fails_to_import_is_recorded_unless_asked_for(site, monkeypatch):
    broken, _ = make_dist(site, "raise ImportError('needs the vendor SDK')\n")
    good, _ = make_dist(site, CPU_SUBCLASS.replace("PLATFORM", "good") + """
@hookimpl
def octavo_register_platforms(register):
    register("good", "MODULE:Plat")
""")
    pm = PluginManager()  # no allow-list: the failure is recorded and everything else loads
    assert "needs the vendor SDK" in pm.plugins[broken].error
    assert "good" in pm.names("platforms") and "cpu" in pm.names("platforms")
    only(monkeypatch, broken, good)
    with pytest.raises(PluginError, match=f"{broken}.*OCTAVO_PLUGINS.*needs the vendor SDK"):
        PluginManager()


def test_allow_and_disable_lists(site, monkeypatch):
    a, dist_a = make_dist(site, "")
    b, _ = make_dist(site, "")
    only(monkeypatch, dist_a)  # a distribution name works as well as a plugin name
    pm = PluginManager()
    assert a in pm.plugins and b not in pm.plugins and "platforms" in pm.plugins  # built-ins always load
    monkeypatch.setenv("OCTAVO_PLUGINS", "no-such-plugin")
    with pytest.raises(PluginError, match="no-such-plugin.*not installed"):
        PluginManager()
    monkeypatch.delenv("OCTAVO_PLUGINS")
    monkeypatch.setenv("OCTAVO_DISABLE_PLUGINS", f"{a}, platforms")
    pm = PluginManager()
    assert a not in pm.plugins and b in pm.plugins and "cpu" not in pm.names("platforms")
    assert set(pm.disabled) >= {a, "platforms"}

def test_stat_loggers_and_notifications_in_process():
    seen = []

    class Plugin:
        @staticmethod
        @__import__("octavo").hookimpl
        def octavo_register_stat_loggers(register, settings):
            register(type("Logger", (), {"record": lambda self, stats, outputs: seen.append(stats)})())

        @staticmethod
        @__import__("octavo").hookimpl
        def octavo_on_engine_start(settings):
            seen.append(("start", settings.scheduler.max_num_seqs))

    pm = PluginManager(plugins=(("inline", Plugin, "inline-dist"),))
    (logger,) = pm.stat_loggers(OctavoSettings())
    logger.record("stats", [])
    pm.hook.octavo_on_engine_start(settings=OctavoSettings.from_kwargs(max_num_seqs=3), platform="cpu",
                                   attention_backend="torch_sdpa", dtype="float32", quantization=None,
                                   num_kv_blocks=8, block_size=16)
    assert seen == ["stats", ("start", 3)]
    assert pm.plugins["inline"].hooks == ["octavo_on_engine_start", "octavo_register_stat_loggers"]


def test_trace_prints_every_hook_call():
    env = {"OCTAVO_TRACE_PLUGINS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", "from octavo.core.plugin_manager import get_plugin_manager as g; g()"],
                         capture_output=True, text=True, env=env, check=True)
    assert "[octavo-plugins]" in out.stderr and "octavo_register_platforms" in out.stderr
    assert "register platforms for plugin 'platforms'" in out.stderr


def test_kinds_come_from_the_hookspecs(monkeypatch):
    """A new ``octavo_register_<kind>(register)`` spec is a new registry, with no other edit in core."""
    from octavo import hookimpl
    from octavo.core import hookspecs
    from octavo.hooks import hookspec

    def octavo_register_widgets(register):
        """Register widgets."""

    monkeypatch.setattr(hookspecs, "octavo_register_widgets", hookspec(octavo_register_widgets), raising=False)
    assert hookspecs.registry_kinds()["widgets"] == "octavo_register_widgets"
    assert hookspecs.HOOK_GROUPS["octavo_register_widgets"] == "registration"
    assert hookspecs.HOOK_GROUPS["octavo_register_stat_loggers"] == "extension"  # takes settings too

    class Plugin:
        @staticmethod
        @hookimpl
        def octavo_register_widgets(register):
            register("gear", "collections:OrderedDict")

    pm = PluginManager(plugins=(("widgets", Plugin, "octavo-widgets"),))
    assert "widgets" in pm.kinds and pm.names("widgets") == ["gear"]
    assert pm.resolve("widgets", "gear").__name__ == "OrderedDict"
