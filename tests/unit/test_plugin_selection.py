"""Selection through the plugin manager: the select hooks (platform, attention backend), an explicit setting
winning over them, and the built-in defaults (trylast hookimpls) that rank platforms by ``Platform.priority``
and backends by ``platform_priority``. Plugins are real installed distributions (``tests.unit.plugin_dists``)."""

import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.plugin_manager import PluginError, PluginManager, UnknownPluginError
from octavo.plugins.platforms.cpu import CpuPlatform
from tests.unit.plugin_dists import CPU_SUBCLASS, make_dist, only


def test_select_platform_hook_and_explicit_setting(site, monkeypatch):
    name, _ = make_dist(site, CPU_SUBCLASS.replace("PLATFORM", "fakechip") + """
@hookimpl
def octavo_register_platforms(register):
    register("fakechip", "MODULE:Plat")

@hookimpl
def octavo_select_platform(settings):
    return "fakechip"
""")
    only(monkeypatch, name)
    pm = PluginManager()
    assert pm.select_platform(OctavoSettings()).name == "fakechip"
    assert type(pm.select_platform(OctavoSettings.from_kwargs(device="cpu"))) is CpuPlatform  # explicit wins
    with pytest.raises(UnknownPluginError, match="nochip"):
        pm.select_platform(OctavoSettings.from_kwargs(device="nochip"))


BACKENDS = """
from octavo import hookimpl
from octavo.attention import AttentionBackend
from octavo.platform import Availability


class Never(AttentionBackend):
    name = "never"

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, **kw):
        return Availability(False, "never supports anything")

    def forward(self, query, key, value, kv_cache, metadata):
        raise AssertionError("selection tests never run forward")


class Small(Never):
    name = "small"

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, **kw):
        return Availability(head_size <= 64, f"head_size {head_size} > 64")


@hookimpl
def octavo_register_attention_backends(register):
    register("never", "MODULE:Never")
    register("small", "MODULE:Small")
"""


class PrefersFake(CpuPlatform):
    def preferred_attention_backends(self):
        return ["never", "small", "missing"]


def test_select_attention_backend(site, monkeypatch):
    name, _ = make_dist(site, BACKENDS)
    only(monkeypatch, name)
    pm = PluginManager()
    platform, settings = PrefersFake(), OctavoSettings()
    assert pm.select_attention_backend(settings, platform, dtype=torch.float32, head_size=64).name == "small"
    with pytest.raises(PluginError, match="'never'.*never supports anything.*--attention-backend"):
        pm.select_attention_backend(OctavoSettings.from_kwargs(attention_backend="never"), platform,
                                    dtype=torch.float32, head_size=64)
    has_sdpa = "torch_sdpa" in pm.names("attention_backends")
    if not has_sdpa:  # the reference backend is the last resort; without it, every reason is listed
        with pytest.raises(PluginError) as e:
            pm.select_attention_backend(settings, platform, dtype=torch.float32, head_size=128)
        for reason in ("never supports anything", "head_size 128 > 64", "missing: not registered"):
            assert reason in str(e.value)
    else:
        chosen = pm.select_attention_backend(settings, platform, dtype=torch.float32, head_size=128).name
        assert chosen == _cpu_builtin(pm)


def test_select_attention_backend_hook(site, monkeypatch):
    name, _ = make_dist(site, BACKENDS + """
@hookimpl
def octavo_select_attention_backend(head_size):
    return "small" if head_size == 32 else "never"
""")
    only(monkeypatch, name)
    pm = PluginManager()
    assert pm.select_attention_backend(None, PrefersFake(), dtype=torch.float32, head_size=32).name == "small"
    with pytest.raises(PluginError, match="octavo_select_attention_backend hook"):
        pm.select_attention_backend(None, PrefersFake(), dtype=torch.float32, head_size=16)


PRIORITY_PLATFORM = CPU_SUBCLASS.replace("PLATFORM", "chip") + """
Plat.priority = PRIORITY

@hookimpl
def octavo_register_platforms(register):
    register("chip", "MODULE:Plat")
"""


@pytest.mark.parametrize(("priority", "winner"), [(50, "chip"), (-500, "cpu")])
def test_platform_declares_its_own_priority(site, monkeypatch, caplog, priority, winner):
    name, _ = make_dist(site, PRIORITY_PLATFORM.replace("PRIORITY", str(priority)))
    only(monkeypatch, name)
    pm = PluginManager()
    with caplog.at_level("INFO", logger="octavo.plugins"):
        assert pm.select_platform(OctavoSettings()).name == winner
    assert f"platform {winner} (chosen by the built-in default)" in caplog.text


def test_defaults_are_trylast_hookimpls_a_plugin_outranks(site, monkeypatch):
    name, _ = make_dist(site, PRIORITY_PLATFORM.replace("PRIORITY", "50") + """
@hookimpl
def octavo_select_platform(settings):
    return "cpu"
""")
    only(monkeypatch, name)
    pm = PluginManager()
    assert pm.select_platform(OctavoSettings()).name == "cpu"  # the plugin's hook beats the default's "chip"
    impls = pm.hook.octavo_select_platform.get_hookimpls()
    assert [i.plugin_name for i in impls if i.trylast] == ["octavo-defaults"]


def test_backend_declares_the_platforms_it_prefers(site, monkeypatch):
    name, _ = make_dist(site, BACKENDS + """
Small.platform_priority = {"cpu": 10}
Never.platform_priority = {"cpu": 20}
""")
    only(monkeypatch, name)
    pm = PluginManager()
    # no platform edit: "small" is auto-selected on cpu ("never" ranks higher but refuses the shape)
    chosen = pm.select_attention_backend(OctavoSettings(), CpuPlatform(), dtype=torch.float32, head_size=64)
    assert chosen.name == "small"
    chosen = pm.select_attention_backend(OctavoSettings(), CpuPlatform(), dtype=torch.float32, head_size=128)
    assert chosen.name == _cpu_builtin(pm)  # the CPU's built-in backend, else the reference as the last resort


def _cpu_builtin(pm) -> str:
    """``cpu_paged`` (the built-in CPU backend, low priority) where it is registered and available, else
    ``torch_sdpa``."""
    if "cpu_paged" in pm.names("attention_backends"):
        cls = pm.resolve("attention_backends", "cpu_paged")
        if cls.is_available() and cls.supports(device_type="cpu", dtype=torch.float32, head_size=128):
            return "cpu_paged"
    return "torch_sdpa"
