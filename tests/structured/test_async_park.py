"""The async step loop's grammar gate with parked sampling (core/async_gate.py ``GatedGrammarStep.park``),
without a model: the runner's rest-of-step runs exactly once, on the thread that opens the gate when it was
parked first, on the runner's thread when the gate was already open; errors reach the waiter; a gate that is
not ``parkable`` blocks the runner as before. End to end (tokens of the parked / early-launch loop equal the
synchronous engine's, and a drain by ``collective_rpc`` mid-generation): tests/structured/test_pipelined_fill.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from octavo.core import async_gate
from octavo.core.async_gate import GatedGrammarStep
from octavo.core.async_runner import PendingOutput, resolve
from octavo.core.grammar_step import GrammarStep


class _Backend:
    """Fills row j with the word j (so a row's content says which matcher filled it)."""

    def fill_bitmasks(self, matchers, bitmask):
        for j, m in enumerate(matchers):
            bitmask[j].fill_(m)


def _gate(n: int = 3, finished: tuple[int, ...] = ()) -> GatedGrammarStep:
    bitmask = torch.full((8, 4), -1, dtype=torch.int32)
    inner = GrammarStep(_Backend(), list(range(n)), [f"r{j}" for j in range(n)], [10 + j for j in range(n)],
                        bitmask, ThreadPoolExecutor(1))
    sched = SimpleNamespace(scheduled=[SimpleNamespace(req=SimpleNamespace(is_finished=j in finished))
                                       for j in range(n)])
    return GatedGrammarStep(inner, sched)


def test_parked_before_release_runs_on_the_releasing_thread():
    gate = _gate(3, finished=(1,))
    seen = []

    def finish():
        rids, positions, rows = gate.wait()  # the runner's mask_logits does this first
        seen.append((threading.current_thread().name, rids, positions, rows[:, 0].tolist()))
        return "sampled"

    out = gate.park(finish)
    assert isinstance(out, PendingOutput)
    assert not seen  # nothing ran yet: the gate is closed
    t = threading.Thread(target=gate.release, name="core")
    t.start()
    t.join(10)
    assert out.get() == "sampled"
    # ran once, on the thread that opened the gate; the request finished at the previous step is not filled
    assert seen == [("core", ["r0", "r2"], [0, 2], [10, 12])]
    gate.release()  # idempotent: nothing runs again
    assert len(seen) == 1


def test_fill_started_early_on_the_bitmask_thread(monkeypatch):
    few = _gate(3)
    few.start_fill()  # fewer rows than EARLY_FILL_MIN_ROWS: left to release(), which fills them inline
    assert few.inner._future is None and not few._fill_started
    monkeypatch.setattr(async_gate, "EARLY_FILL_MIN_ROWS", 2)
    gate = _gate(3, finished=(0,))
    fill_threads = []
    backend = gate.inner.backend
    real = backend.fill_bitmasks
    backend.fill_bitmasks = lambda ms, bm: fill_threads.append(threading.current_thread()) or real(ms, bm)
    gate.start_fill()  # EARLY_FILL: before the previous step's update; the gate stays closed
    assert not gate.is_released()
    out = gate.park(lambda: gate.wait())
    gate.release()
    rids, positions, rows = out.get()
    assert (rids, positions, rows[:, 0].tolist()) == (["r1", "r2"], [1, 2], [11, 12])
    assert fill_threads and fill_threads[0] is not threading.current_thread()  # filled on the pool's thread


def test_released_before_park_runs_on_the_runner_thread():
    gate = _gate(2)
    gate.release()
    out = gate.park(lambda: (threading.current_thread().name, gate.wait()[0]))
    assert out == (threading.current_thread().name, ["r0", "r1"])  # run in place, not parked


def test_not_parkable_blocks_until_released():
    gate = _gate(2)
    gate.parkable = False
    done = []
    with ThreadPoolExecutor(1, thread_name_prefix="runner") as pool:
        fut = pool.submit(gate.park, lambda: gate.wait() and done.append(threading.current_thread().name) or "x")
        time.sleep(0.05)
        assert not fut.done()  # blocked in the gate's wait()
        gate.release()
        assert fut.result(10) == "x"
    assert done and done[0].startswith("runner")


def test_error_of_parked_sampling_reaches_the_waiter():
    gate = _gate(1)

    def finish():
        gate.wait()
        raise RuntimeError("sampler broke")

    out = gate.park(finish)
    gate.release()  # the error is kept, not raised on the releasing thread
    with pytest.raises(RuntimeError, match="sampler broke"):
        resolve(out)


def test_resolve_unwraps_a_pending_plain_output():
    out = PendingOutput()
    plain = SimpleNamespace(sampled={"a": [1]})
    t = threading.Timer(0.05, out.run, args=(lambda: plain,))
    t.start()
    assert resolve(out) is plain  # waits for the parked sampling, then returns the runner's answer


def test_switch_interval_short_only_while_a_structured_step_is_in_flight():
    """core/async_engine.py ``GRAMMAR_SWITCH_INTERVAL_S`` (off by default; the benchmark sets it): on an accelerator
    the loop shortens Python's GIL switch interval while a structured step is in flight and puts the process's own
    value back after (and at close); steps without a grammar leave it alone; on a CPU it is never on."""
    import sys

    from octavo.core import async_engine
    from octavo.core.async_engine import AsyncStepLoop, _InFlight

    cpu = AsyncStepLoop(SimpleNamespace(platform=SimpleNamespace(device_type="cpu")))
    gpu = AsyncStepLoop(SimpleNamespace(platform=SimpleNamespace(device_type="cuda")))
    assert cpu.grammar_switch_s == 0.0 and gpu.grammar_switch_s == async_engine.GRAMMAR_SWITCH_INTERVAL_S
    gpu.grammar_switch_s = 0.0002  # (what the benchmark's json_async_sw200us mode does)
    own = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        gpu.inflight.append(_InFlight("free", None, None))
        gpu._switch_interval()
        assert sys.getswitchinterval() == 0.004  # no grammar in flight: untouched
        gpu.inflight.append(_InFlight("json", None, object()))
        gpu._switch_interval()
        assert abs(sys.getswitchinterval() - gpu.grammar_switch_s) < 1e-9
        gpu.inflight.popleft()
        gpu._switch_interval()
        assert abs(sys.getswitchinterval() - gpu.grammar_switch_s) < 1e-9  # the structured one is still in flight
        gpu.inflight.popleft()
        gpu._switch_interval()
        assert sys.getswitchinterval() == 0.004
        gpu.inflight.append(_InFlight("json", None, object()))
        gpu._switch_interval()
        saved = gpu._saved_switch
        gpu.inflight.clear()
        gpu.close()  # (nothing in flight to wait for) the saved interval is back
        assert saved == 0.004 and sys.getswitchinterval() == 0.004 and gpu._saved_switch is None
    finally:
        sys.setswitchinterval(own)
