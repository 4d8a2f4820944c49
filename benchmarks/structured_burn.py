"""Diagnostic knobs of benchmarks/structured_rotate.py (session 17): GIL-held Python added to a step on purpose.

Why: a structured 135M step on the H200 costs ~0.27 ms over a free one, more than the manager's per-step keys show,
and the runner's step thread is busy in ~100 % of the stack samples. If the two threads' GIL-held Python is what sets
a host-bound step, a microsecond of Python on either thread costs a microsecond of step time; a mode
``free_burn_core=free,burn.CORE_US=50`` (the same free requests, 50 us of spinning Python on the engine core's thread
each step) and ``burn.RUNNER_US`` (on the runner's step thread, at each step's launch) say how much it costs here.

    install(core): wraps the core's ``step`` and the executor driver's ``execute`` once; 0 (default): no spin.
"""

from __future__ import annotations

import time
from typing import Any

CORE_US = 0.0
RUNNER_US = 0.0


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def install(core: Any) -> None:
    step = core.step
    driver = core.executor.driver
    execute = driver.execute

    def core_step(*a: Any, **k: Any) -> Any:
        if CORE_US:
            _spin(CORE_US)
        return step(*a, **k)

    def runner_execute(*a: Any, **k: Any) -> Any:
        if RUNNER_US:
            _spin(RUNNER_US)
        return execute(*a, **k)

    core.step = core_step
    driver.execute = runner_execute
