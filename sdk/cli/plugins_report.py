"""The data behind ``octavo plugins``: one dict per loaded plugin, with what it registers, what shadows it,
and for the kinds that run on hardware (platforms, attention backends) whether each can run here and why not.

Kept beside the CLI command that prints it; ``PluginManager.report()`` delegates here.
"""

from __future__ import annotations

from typing import Any

#: kinds whose classes answer ``is_available()``; the report says for each whether it runs here.
HARDWARE_KINDS = ("platforms", "attention_backends")


def build_report(pm: Any) -> list[dict[str, Any]]:
    """One dict per plugin (failed ones included), as ``octavo plugins --json`` prints it."""
    out = []
    for info in pm.plugins.values():
        regs = []
        for r in info.registrations:
            entry = {"kind": r.kind, "name": r.name, "target": r.target, "shadowed_by": r.shadowed_by}
            if r.kind in HARDWARE_KINDS:
                if r.shadowed_by is None:
                    entry["available"], entry["reason"] = pm.availability(r.kind, r.name)
                else:
                    entry["available"], entry["reason"] = False, f"shadowed by {r.shadowed_by}"
            elif r.kind == "quantizers" and r.shadowed_by is None:
                entry["platforms"] = _quantizer_platforms(pm, r.name)
            regs.append(entry)
        out.append({"name": info.name, "distribution": info.distribution, "version": info.version,
                    "module": info.module, "builtin": info.builtin, "hooks": info.hooks,
                    "registrations": regs, "error": info.error})
    return out


def _quantizer_platforms(pm: Any, name: str) -> list[str]:
    """The device types a quantizer has kernels for (``Quantizer.device_types``); imports its module."""
    try:
        return list(getattr(pm.resolve("quantizers", name), "device_types", ()))
    except Exception as e:  # noqa: BLE001 - reported, not raised: this feeds `octavo plugins`
        return [f"failed to import: {type(e).__name__}: {e}"]
