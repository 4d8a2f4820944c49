"""--host-gate of benchmarks/structured_outputs.py and structured_knob_ab.py: the device gate's structure on a CPU
engine, with a host stand-in for the device's wait (moved out of structured_modes.py, session 15, to keep it short)."""

from __future__ import annotations

from typing import Any


class _HostGateApply:
    """--host-gate (CPU): the runner's platform apply with a host stand-in for the device's wait: the step thread
    spins (GIL released in short sleeps) until the word opens, where a GPU stream would wait; bounded like the
    device's (30 s, then the step is marked given up and the host's check fails it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def wait_host_flag(self, words: Any, seq: int) -> None:
        import time

        deadline = time.monotonic() + 30
        while int(words[0]) < seq:
            if time.monotonic() > deadline:
                words[1] = seq
                return
            time.sleep(0.00005)

    def __call__(self, logits: Any, packed: Any, index: Any, volatile: bool = False) -> Any:
        from octavo.core.grammar_step import apply_packed

        rows = list(range(len(packed))) if index is None else index.tolist()
        return apply_packed(logits, rows, packed, kernel=self.inner)


def install_host_gate(core: Any) -> None:
    """The device gate's structure on a CPU engine (see :class:`_HostGateApply`)."""
    runner = core.executor.driver.runner
    runner.grammar_apply = _HostGateApply(runner.grammar_apply)
    core.structured._cpu_hint["device_wait"] = True  # (set by a GPU runner's first apply)
