"""Plugin on/off switches (``OCTAVO_MOE_TRITON``, ``OCTAVO_FP8_FUSE_INPUTS``, ``OCTAVO_CPU_QUANT_KERNEL``):
only 1 and 0, anything else refused by name instead of read as "on"."""

from __future__ import annotations

import pytest

from octavo.env_flags import env_switch


@pytest.mark.parametrize(("raw", "default", "expected"), [
    (None, True, True), (None, False, False), ("", True, True), ("1", False, True), ("0", True, False),
    (" 0 ", True, False)])
def test_values(monkeypatch, raw, default, expected):
    if raw is None:
        monkeypatch.delenv("OCTAVO_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_TEST_SWITCH", raw)
    assert env_switch("OCTAVO_TEST_SWITCH", default) is expected


@pytest.mark.parametrize("raw", ["false", "off", "yes", "2"])
def test_other_values_are_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("OCTAVO_TEST_SWITCH", raw)
    with pytest.raises(ValueError, match="OCTAVO_TEST_SWITCH"):
        env_switch("OCTAVO_TEST_SWITCH")


def test_cpu_quant_kernel_switch_refuses_a_typo(monkeypatch):
    from octavo.plugins.quant import cpu_kernel

    monkeypatch.setattr(cpu_kernel, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_QUANT_KERNEL", "off")
    with pytest.raises(ValueError, match="OCTAVO_CPU_QUANT_KERNEL='off'"):
        cpu_kernel.library()
    monkeypatch.setenv("OCTAVO_CPU_QUANT_KERNEL", "0")
    assert cpu_kernel.library() is None and "OCTAVO_CPU_QUANT_KERNEL=0" in cpu_kernel.unavailable_reason()
