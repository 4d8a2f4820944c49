"""The grammar gate of a structured step under async scheduling (used by core/async_engine.py's step loop).

Step N+1's bitmask needs every grammar advanced by N's token, which the host learns only after N. The forward of
N+1 does not need the mask, only its sampler does. So N+1 carries a :class:`GatedGrammarStep`: the runner runs
N+1's forward and parks the rest of its step on the gate (in-process), or blocks in ``wait()`` (not parkable);
the core thread, once N's tokens are accepted, drops rows of requests that finished at N, fills the masks and
``release()``s the gate, launching a parked sampling right there. docs/async_scheduling.md "Structured outputs".
"""

from __future__ import annotations

import threading
from typing import Any

from octavo.core import grammar_chain, grammar_device_gate, grammar_step
from octavo.core.async_runner import PendingOutput
from octavo.core.grammar_step import GrammarStep

# The runner parks a structured step's sampling on its gate (GatedGrammarStep.park); False: its thread blocks in
# the gate's wait() as before session 6 (benchmarks/structured_outputs.py's *_old modes compare both).
PARK = True
# Start step N+1's fill on the bitmask thread right after N's tokens were accepted (GatedGrammarStep.start_fill),
# so it runs while this thread updates N and schedules N+2. False: the fill runs inline when the gate opens
# (release). GPU batch 1 of session 6 (H100, random 1.1B, launch wait on): batch 32 2.57 ms vs 3.10 inline, batch 1
# 1.90 vs 1.70 (a thread hand-off for one ~15 us row), so only steps of EARLY_FILL_MIN_ROWS or more rows fill early.
# benchmarks/structured_outputs.py json_async_earlyfill / _noearlyfill compare.
EARLY_FILL = True
EARLY_FILL_MIN_ROWS = 8
# After queuing that fill, the core thread may block up to this long until the bitmask thread is running it, so the
# fill thread does not wait for the GIL until the core thread next blocks. Under the Python gate (park) the core
# thread later blocks for the fill itself, so its start matters: 1 ms (sessions 6-12; session 13's CPU A/B without
# the wait: the fill's start lag 0.47 -> 1.25 ms, wall within noise).
FILL_START_WAIT_S = 0.001
# The same wait under the device gate (core/grammar_device_gate.py), where the device, not the core thread, waits for
# the fill. 0 (default since session 13): no wait; the ``time.sleep(0)`` after the release
# (structured_output.YIELD_AFTER_RELEASE) already lets the woken fill thread take the GIL, and the core thread skips a
# wake-up and a GIL hand-back on its way to update N and schedule N+2, the next step's critical path. Only a hint:
# the fill is queued either way, the device's wait opens when the fill ends and the next accept waits for the fill's
# future, so nothing depends on the wait (no wake-up to lose). Evidence (docs/performance.md "Host path, session 13"):
# ONE GPU run on a busy H100 lane (s12 batch 2, 135M shape, batch 32, 3 repeats, same greedy tokens): 1.76 / 1.62 /
# 1.63 ms per step without the wait vs 2.11 / 2.20 / 2.03 with it (free async 1.90 / 1.91 / 1.73); the core thread's
# release 0.245 -> 0.136 ms, the fill's start lag 0.071 -> 0.075 ms. CPU (2 loaded vCPUs, a host stand-in for the
# device's wait, session 13): wall within noise, release 0.81 -> 0.36 ms, start lag not later. A quiet-GPU
# confirmation is pending (benchmarks/structured_outputs.py json_async vs json_async_devgate_startwait).
DEVICE_GATE_FILL_START_WAIT_S = 0.0
# With grammar_device_gate.NATIVE_OPEN (the default since session 14) under the device gate: the fill runs right here at the accept, as a
# small step's does, not on the bitmask thread: one ctypes call that releases the GIL, fills the rows over the C
# shim's threads and opens the device's word (plugins/structured_output/xgrammar_native.py). No thread hop, and no
# Python thread besides the core and the runner. H100 (s14 final call, 135M shape, batch 32, a loaded host: free async
# 1.635 ms): 1.609 ms (-1.6 %) vs 1.993 as shipped (+21.9 %), 1.972 with the same fill on the bitmask thread; same
# tokens. False: on the bitmask thread (modes json_async_nativeopen / _p4).
NATIVE_OPEN_INLINE = True


class GatedGrammarStep:
    """A :class:`GrammarStep` whose fill may start only after :meth:`release` (see the module docstring).
    The runner calls ``wait()`` and sets ``apply_s`` exactly as on a plain ``GrammarStep``.

    In-process (the ``uni`` executor) the runner does not block on the gate: after queuing the forward and the
    logits it parks (:meth:`park`) the rest of its step (mask, sampler, host copies) here and returns a
    :class:`~octavo.core.async_runner.PendingOutput`; :meth:`release` runs it on the thread that opened the
    gate, right after the fill. So the sampler is launched with no thread hand-off (session 5 measured ~0.8 ms
    of GIL hand-off per step there on an H100 host), and the runner's thread is free for the next step."""

    def __init__(self, inner: GrammarStep, sched_out: Any) -> None:
        self.inner = inner
        self.sched_out = sched_out
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self._parked: tuple[Any, Any, PendingOutput] | None = None
        # two steps in flight: the loop hands the runner's thread the next step only after this gate opened (so
        # the parked sampling, which writes the ids that step reads, ran first); deeper loops block instead
        self.parkable = True
        self._fill_started = False
        # the device gate (core/grammar_device_gate.py): this step's number; the runner then queues its sampling
        # behind a device wait instead of parking, and the fill opens that wait (rows stay where they are)
        if _device_gate_on(inner):
            inner.seq = inner.device_gate.next_seq()
        if inner.chain is not None and not (inner.seq and inner.chain.claim("runner")):  # (grammar_chain.py)
            grammar_chain.core_takes(inner)  # not device-gated: the Python path

    @property
    def seq(self) -> int:
        return self.inner.seq

    def _drop_finished(self) -> GrammarStep:
        # a request that finished at the previous step samples a token here that is never emitted: its
        # (terminated) grammar is not asked for a mask
        g = self.inner
        if g.seq:  # the device's apply was queued for every row: a finished one is filled (never emitted)
            return g
        keep = [j for j, pos in enumerate(g.positions) if not self.sched_out.scheduled[pos].req.is_finished]
        if len(keep) < len(g.positions):
            self.inner = g = g.subset(keep)
        return g

    def start_fill(self, before: Any = None) -> None:
        """:data:`EARLY_FILL`: called right after the previous step's tokens were accepted, before its update:
        the fill starts on the bitmask thread (one library call, GIL released) while this thread updates and
        schedules; :meth:`release` then waits for it. A request that finishes at the previous step is filled
        too (harmless: its token here is never emitted; a terminated matcher gives an open row)."""
        # (a grammar worker process fills: one message from this thread, no job, like a small step; so does the native
        # fill + open, NATIVE_OPEN_INLINE)
        few = (len(self.inner.matchers) < EARLY_FILL_MIN_ROWS or hasattr(self.inner.backend, "post_fill")
               or _native_inline(self.inner))
        if getattr(before, "rows_accept", False):  # N's accept, which the native fill at the accept may take over
            if few and _native_inline(self.inner) and not self._gate.is_set() and not self._fill_started:
                self.release(accept=before)  # (core/grammar_accept.py: accepted in C or here, always before the fill)
                return
            before()
            before = None
        if before is not None and (not self.inner.seq or self._gate.is_set() or self._fill_started or few):
            before()  # ``before`` (the previous step's accept) goes with the fill job only under the device gate
            before = None
        if self._gate.is_set() or self._fill_started:
            return
        if few:  # too few rows for a thread hand-off: fill inline
            if self.inner.seq:
                self.release()  # (device gate: releasing launches nothing, the device's wait opens now)
            return
        self._fill_started = True
        g = self._drop_finished()
        if g.matchers:
            wait = DEVICE_GATE_FILL_START_WAIT_S if g.seq else FILL_START_WAIT_S
            g.start_on_pool(0.0 if before is not None else wait, before=before)

    def release(self, before: Any = None, accept: Any = None) -> None:
        """Open the gate (fill now if not started). ``before``: the previous step's accept, run first; ``accept``: the
        same as a core/grammar_accept.py object, which this step's native fill may take over (else it runs first)."""
        if before is not None:  # (the previous step's accept, when this is the accept's hook: here, first)
            before()
        if self._gate.is_set():
            if accept is not None:
                accept()
            return
        if not self._fill_started:
            g = self._drop_finished()
            if g.matchers:
                g.start(gated=True, accept=accept)  # grammar_step.INLINE_AFTER_GATE: filled right here, core thread
                accept = None
        if accept is not None:
            accept()
        g = self.inner
        with self._lock:
            self._gate.set()
            parked, self._parked = self._parked, None
        if parked is not None:  # the runner parked its sampling: launch it here and now
            g.parked = True
            finish, device, pending = parked
            with _on_device(device):
                pending.run(finish)
        elif not g.seq:  # (device gate: the runner does not wait on the host)
            g.handoff()  # on an accelerator: let the runner's thread (not parked yet) take the GIL and sample now

    def park(self, finish: Any, device: Any = None) -> Any:
        """The runner's side (its step thread): ``finish()`` is the rest of its step, which needs the mask. Gate
        still closed: keep it for :meth:`release` and return a ``PendingOutput``; else (or not ``parkable``)
        run it here (it then blocks in :meth:`wait` until the gate opens)."""
        if self.inner.seq:  # the device waits for the mask (core/grammar_device_gate.py): queue it all now
            return finish()
        with self._lock:
            if self.parkable and not self._gate.is_set():
                pending = PendingOutput()
                self._parked = (finish, device, pending)
                return pending
        return finish()

    def is_released(self) -> bool:
        """Whether the fill may start (the mp executor sends a structured step only then: plugins/executors/mp.py)."""
        return self._gate.is_set()

    def wait(self):
        self._gate.wait()
        if not self.inner.matchers:
            return [], [], None
        return self.inner.wait()

    @property
    def apply_s(self) -> float:
        return self.inner.apply_s

    @apply_s.setter
    def apply_s(self, v: float) -> None:
        self.inner.apply_s = v


def _native_inline(step: GrammarStep) -> bool:
    """Whether a device-gated step fills at the accept, on this thread, through the backend's native fill + open."""
    return bool(step.seq and NATIVE_OPEN_INLINE and grammar_device_gate.NATIVE_OPEN
                and getattr(step.backend, "fill_open", None) is not None)


def _device_gate_on(step: GrammarStep) -> bool:
    """Whether a step the manager gave a ``device_gate`` (its runner's apply can wait on the device) uses it:
    ``grammar_device_gate.DEVICE_GATE``, and the direct read of pinned rows and the device wait on and not failed
    in this process."""
    t = grammar_step._TABLES
    return (grammar_device_gate.DEVICE_GATE and step.device_gate is not None and grammar_step.HOST_READ_APPLY
            and not (t.get("host_read_failed") or t.get("kernel_failed") or grammar_device_gate._FAILED))


def _on_device(device: Any):
    """The runner's device made current on this thread while a parked sampling runs here (kernels such as the
    Triton mask launch on the current device); a no-op for a CPU or an unknown device."""
    import contextlib

    if device is None or getattr(device, "type", "cpu") == "cpu" or getattr(device, "index", None) is None:
        return contextlib.nullcontext()
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "device_index"):
        return acc.device_index(device.index)
    return contextlib.nullcontext()
