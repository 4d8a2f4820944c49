"""On/off switches read from ``OCTAVO_*`` environment variables by plugins (kernel choices, fusions).

Only ``1`` and ``0`` are accepted: any other value (``false``, ``off``, a typo) is an error that names the
variable, never silently read as "on".
"""

from __future__ import annotations

import os


def env_switch(name: str, default: bool = True) -> bool:
    """``os.environ[name]`` as a switch: unset or empty -> ``default``, ``"1"`` -> True, ``"0"`` -> False."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise ValueError(f"{name}={raw!r}: use 1 (on) or 0 (off)")
    return raw == "1"
