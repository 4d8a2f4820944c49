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


def test_every_env_variable_the_code_names_is_documented():
    """Every ``OCTAVO_*`` name in core/, sdk/ and plugins/ (an environment variable read where it acts, or a setting's
    ``OCTAVO_<FIELD>`` variable) is named in docs/configuration.md: a switch the code reads but the docs do not list
    is one a user cannot find."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = {m for d in ("core", "sdk", "plugins") for f in (root / d).rglob("*.py")
             for m in re.findall(r"OCTAVO_[A-Z0-9_]*[A-Z0-9]", f.read_text())}
    documented = set(re.findall(r"OCTAVO_[A-Z0-9_]*[A-Z0-9]", (root / "docs" / "configuration.md").read_text()))
    assert len(names) > 50  # the scan found the code's names
    missing = sorted(names - documented)
    assert not missing, f"docs/configuration.md does not name {missing}"


def test_progress_and_triton_gemv_switches_refuse_other_values(monkeypatch):
    """Both were read loosely before session 12 ("true" = off for the progress bar, anything but 0 = on for the GEMV)."""
    from types import SimpleNamespace

    from octavo.core.loader.weights import iter_weights

    monkeypatch.setenv("OCTAVO_DISABLE_PROGRESS", "true")
    with pytest.raises(ValueError, match="OCTAVO_DISABLE_PROGRESS='true'"):
        next(iter_weights(SimpleNamespace(format="safetensors", path="/nonexistent")))
    pytest.importorskip("triton")
    import torch

    from octavo.plugins.platforms.cuda_fusions import fuse_model

    monkeypatch.setenv("OCTAVO_TRITON_GEMV", "off")
    with pytest.raises(ValueError, match="OCTAVO_TRITON_GEMV='off'"):
        fuse_model(torch.nn.Module(), torch.bfloat16, torch.device("cpu"))
