"""How long this process has existed: the part of a start that happens before octavo's own timers (the
interpreter, imports). Used by ``octavo serve`` and the engine's start-phase log (docs/loading.md)."""

from __future__ import annotations

import os


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
