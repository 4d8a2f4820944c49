"""The structured-output manager's per-step host statistics (core/structured_output.py ``stats``), summed over steps
with grammar rows and read by benchmarks/structured_outputs.py and structured_knob_ab.py (moved out of the manager,
session 16, to keep it short).

Keys (seconds unless said): wait_s: fill time the forward did not hide; fill_s: the whole fill; accept_s: all of
accept_tokens (accept_thread_s: the matchers moving); open_lag_s: NATIVE_OPEN's word opened from C -> the fill's
thread had the GIL back; release_s: N+1's gate opened (with an inline fill, the hand-off wait); start_lag_s: start()
-> the fill began (0 inline); resume_lag_s: the fill ended -> the runner's thread had the rows (a thread wake-up + the
GIL); device_wait_s: the device's idle time in its wait (the benchmark's probe); counts: steps, rows, parked (sampling
ran on the gate's thread), device_gated (sampling waited on the device), chained (N's accept + N+1's fill run by the
runner's chained job, core/grammar_chain.py).
"""

from __future__ import annotations

from typing import Any

KEYS = ("steps", "rows", "prepare_s", "fill_s", "wait_s", "apply_s", "accept_s", "accept_thread_s", "start_lag_s",
        "resume_lag_s", "release_s", "parked", "device_gated", "device_wait_s", "open_lag_s", "chained")


def new() -> dict:
    return dict.fromkeys(KEYS, 0)


def add(st: dict, step: Any) -> None:
    """Sum one closed step (a core/grammar_step.py ``GrammarStep`` whose fill is over) into ``st``."""
    if step.seq and step.wait_events is not None:  # (the benchmark's probe: the device's idle time in that wait)
        st["device_wait_s"] += step.wait_events[0].elapsed_time(step.wait_events[1]) / 1e3
    st["steps"] += 1
    st["rows"] += len(step.matchers)
    st["fill_s"] += step.fill_s
    st["open_lag_s"] += step.open_lag_s
    st["wait_s"] += step.wait_s
    st["apply_s"] += step.apply_s
    if step.t_start and step.t_fill0:
        st["start_lag_s"] += step.t_fill0 - step.t_start
    if step.t_fill1 and step.t_resume:
        st["resume_lag_s"] += max(0.0, step.t_resume - step.t_fill1)
    st["parked"] += step.parked  # its sampling ran on the gate's thread (core/async_gate.py)
    st["device_gated"] += bool(step.seq)  # its sampling waited on the device (core/grammar_device_gate.py)
