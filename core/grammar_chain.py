"""The chained fill (session 16, ``OCTAVO_GRAMMAR_CHAIN``, on by default since session 17): a steady structured step
adds no Python on the way from step N's tokens to step N+1's mask; the GPU stream itself starts the grammar work.

Why (issue 11, GPU, batch 32): the unconstrained step is host-bound (~1.05 ms), so every microsecond a structured
step adds on the engine core's thread or the runner's shows: session 15 measured +16.0 % (135M shape) / +5.6 % (1.1B)
on its quietest host, with the cost in the two Python threads sharing the GIL around N's accept and N+1's fill, not
in the grammar work (docs/performance.md, sessions 14-15). Here, when the runner launches step N+1 it queues on a side
stream "wait for N's copy event" + ``cuLaunchHostFunc`` of a C function (the platform's ``host_fn_after``:
plugins/platforms/cuda_grammar_mask.py) that reads N's sampled ids from pinned host memory, accepts them row by row,
fills N+1's rows into the pinned buffer and opens the device gate's word (plugins/structured_output/xgrammar_chain.py,
the C in xgrammar_native_src.py). N+1's apply already waits on that word (core/grammar_device_gate.py). The core
thread then neither accepts N's tokens nor fills N+1; it reads the job's per-row results after the fact (:func:`settle`).

    prepare(N+1) (core):  the rows are N's (the same list: core/grammar_rows.py) -> a job slot (:func:`attach`)
    execute(N+1) (runner): :func:`launch`: side stream waits for N's copy event, then the host function
    driver thread:        N's ids -> accept -> fill N+1's rows -> words[0] = seq   (no GIL, no CUDA call)
    accept_sampled(N):    the runner has it: skip N's accept and N+1's fill (else: the Python path, as before)
    before N+1's tokens:  :func:`settle`: refused tokens warned, a terminated row / failed call finished in Python

Who does N's accept is decided once per step (:meth:`Chain.claim`), on the core thread when it makes N+1's gate
(core/async_gate.py): the runner where the step is device-gated (a race with the runner's launch would hand most steps
back to Python: the core thread reaches N's accept before the runner reaches N+1's launch), else the Python path. Only
where nothing changes: N+1's rows are the same
requests in the same order as N's, N is still in flight, no row terminated, every token of N+1's rows was sampled by N
(the runner checks against N's sampled ids). A row that terminates (its stop token), a refused token, or a failed call:
the C job leaves the word closed or reports it; :func:`settle` (before the host waits for N+1's tokens, so never a
hang) fills in Python and opens the word, and a failed call fails the step with an error naming the request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from octavo.core import grammar_device_gate
from octavo.core.grammar_accept import check_accepted
from octavo.env_flags import env_switch

logger = logging.getLogger("octavo.core.structured_output")

# On by default since session 17 (where it can act: a device-gated step on CUDA with the native fill; elsewhere the
# steps take the path they took before; =0 turns it off, =1 set explicitly is refused by name where it cannot act).
# Evidence (docs/performance.md "GPU host path, sessions 16-17"): every structured GPU test passed with it as the
# default (s17 call 1, one H200: 53 passed); rotated rounds, batch 32, same greedy tokens, chain vs the native fill at
# the accept: H200 24 rounds 135M -0.5 % (p25..p75 -5.3..+5.2), 1.1B +0.3 % (-3.9..+5.4), A/A -1.8 / +0.7 %; H100
# (s16, 12 rounds) 135M -0.2 %, 1.1B -5.4 %. Not slower, and the core thread's per-step grammar work drops from
# ~0.6 ms (accept 0.16, fill + release 0.42) to ~0.12 ms.
CHAIN = env_switch("OCTAVO_GRAMMAR_CHAIN", True)
CHAIN_EXPLICIT = CHAIN and bool(os.environ.get("OCTAVO_GRAMMAR_CHAIN", "").strip())  # set to 1: refused where it can't
if CHAIN_EXPLICIT and (not grammar_device_gate.NATIVE_OPEN or grammar_device_gate.NATIVE_START):
    raise ValueError("OCTAVO_GRAMMAR_CHAIN=1 runs the native fill itself: it cannot go with "
                     "OCTAVO_GRAMMAR_NATIVE_OPEN=0 or OCTAVO_GRAMMAR_NATIVE_START=1; unset one of them")
SETTLE_TIMEOUT_S = 60.0  # a queued job that never ran (a stuck stream): the step fails after this, the word opened
_FAILED: list[str] = []  # a launch failed in this process: no more chaining (the Python path, as before)
# jobs handed to the driver and not settled yet: kept alive here (their C memory, matchers and rows) even if the engine
# that made them is dropped first, e.g. shut down with steps in flight (the driver may still run them)
_LIVE: set = set()


class Chain:
    """Step N+1's chained job and who does N's accept + N+1's fill: ``owner`` None, "runner" or "core"."""

    __slots__ = ("job", "reqs", "owner", "lock", "settled", "launched", "lost")

    def __init__(self, job: Any, reqs: Any) -> None:
        self.job, self.reqs = job, reqs  # reqs: the rows' requests (the core's accept_tokens skips them)
        self.owner: str | None = None
        self.lock = threading.Lock()
        self.settled = self.launched = False
        self.lost = ""  # why the runner could not queue the job (the step then fails: settle)

    def claim(self, who: str) -> bool:
        with self.lock:
            if self.owner is None:
                self.owner = who
            return self.owner == who


def on() -> bool:
    gdg = grammar_device_gate
    return CHAIN and not _FAILED and gdg.NATIVE_OPEN and not gdg.NATIVE_START


def check_backend(backend: Any, name: str) -> None:
    """:data:`CHAIN` set to 1: refuse, by name, a structured-output backend without a chained fill (by default the
    chain just stays off there: those steps take the path they took before)."""
    if not CHAIN_EXPLICIT:
        return
    if CHAIN and getattr(backend, "opens_gate", False):
        raise ValueError("OCTAVO_GRAMMAR_CHAIN=1 cannot go with OCTAVO_GRAMMAR_WORKER=1 (the matchers live in the "
                         "grammar worker process); unset one of them")
    if CHAIN and getattr(backend, "chain_job", None) is None:
        raise ValueError(f"OCTAVO_GRAMMAR_CHAIN=1: the structured-output backend {name!r} has no chained fill; unset "
                         "it or use 'xgrammar'")


def attach(step: Any, prev: Any, reqs: list) -> None:
    """``prepare``'s side: give ``step`` (N+1) a job when its rows are ``prev``'s (N, still in flight) exactly."""
    if prev is None or prev.matchers is not step.matchers or prev.device_gate is None or not on():
        return
    make = getattr(step.backend, "chain_job", None)
    job = make(step.matchers, step.bitmask) if make is not None else None
    if job is None:
        return
    last = prev.chain
    step.chain = Chain(job, last.reqs if last is not None else frozenset(reqs))
    prev.chain_next = step


def core_takes(step: Any) -> bool:
    """The core thread's side: True when it does N's accept and ``step``'s fill in Python (it claimed the step, or
    had); False when the runner queued the job. The job's slot is given back when the core takes it."""
    chain = step.chain
    if chain is None:
        return True
    if chain.claim("core"):
        step.chain = None
        chain.job.release()  # (never queued)
        return True
    return False


def launch(grammar: Any, prev_copy: tuple | None, apply: Any) -> None:
    """The runner's side, at step N+1's launch: queue its job after N's copy event (``prev_copy``: N's host ids, the
    event, N's sample request ids, from core/async_runner.py). ``apply``: the platform's grammar apply; its
    ``host_fn_after(event, fn, arg)`` queues the host function (CUDA). A CPU engine (no event: N's ids are on the host
    already) runs the job right here, GIL released: the host gate's stand-in (benchmarks/structured_hostgate.py).
    The core thread gave the step to the runner when it made its gate (core/async_gate.py): whatever happens here,
    the job runs or the step is marked ``lost`` (:func:`settle` then fails it by name and lets the device go)."""
    step = getattr(grammar, "inner", None)
    chain = getattr(step, "chain", None)
    if chain is None or chain.owner != "runner" or chain.launched:
        return
    chain.launched = True
    sampled, event, prev_rids = prev_copy if prev_copy is not None else (None, None, None)
    host_fn = getattr(apply, "host_fn_after", None)
    rids = step.request_ids
    index = None
    if sampled is not None and rids != prev_rids:  # (a batch with unconstrained rows: each row's place in N's ids)
        pos = {r: i for i, r in enumerate(prev_rids)}
        index = [pos.get(r, -1) for r in rids]
    if sampled is None or (index is not None and -1 in index):  # (the core checked the rows: not expected)
        chain.lost = "the previous step's sampled ids of these rows were not found"
        return
    job = chain.job
    job.bind(sampled, index, step.device_gate.words, step.seq)
    _LIVE.add(job)
    if event is None:
        job.run_now()
        return
    try:
        if host_fn is None:
            raise RuntimeError("the platform's grammar apply cannot queue a host function")
        host_fn(event, job.fn, job.addr)
    except Exception as e:  # noqa: BLE001 - run it here once N's ids are in; the Python path from now on
        logger.warning("structured outputs: the chained grammar fill could not be queued (%s); running it on the "
                       "runner's thread, and the fill in Python from now on (OCTAVO_GRAMMAR_CHAIN=0 chooses that)", e)
        _FAILED.append(repr(e))
        event.synchronize()
        job.run_now()


def settle(step: Any) -> None:
    """Before the host waits for ``step``'s tokens (and before any matcher moves again): the runner's job is over;
    refused tokens are warned as the Python accept does; a job left to the host (a row terminated, an accept or a
    fill failed) is filled in Python here and the word opened (a failed call: rows all ones, the error kept for the
    step's ``wait()``). Never blocks past :data:`SETTLE_TIMEOUT_S`."""
    chain = step.chain
    if chain is None or chain.settled:
        return
    if chain.owner != "runner":  # (nobody launched it: the Python path fills, see core_takes)
        if core_takes(step):
            return
    chain.settled = True
    job = chain.job
    state = job.state() or (0 if chain.lost else job.state(SETTLE_TIMEOUT_S))
    err = None
    try:
        if chain.lost:
            raise RuntimeError(f"structured outputs: step {step.seq}'s chained grammar fill did not run: {chain.lost} "
                               "(OCTAVO_GRAMMAR_CHAIN=0 fills in Python)")
        if state == 0:
            raise RuntimeError(f"structured outputs: step {step.seq}'s chained grammar fill did not run within "
                               f"{SETTLE_TIMEOUT_S:.0f} s (OCTAVO_GRAMMAR_CHAIN=0 fills in Python)")
        ok, _ = job.results()
        check_accepted(ok, step.request_ids, job.tokens, "chained", "OCTAVO_GRAMMAR_CHAIN")
        if state == 2:
            step.backend.chain_refill(job, step.matchers, step.bitmask)
    except Exception as e:  # noqa: BLE001 - the step fails (wait() raises it), the device is let go on safe rows
        err = e
        step.bitmask[:len(step.matchers)] = -1
    if err is not None or state != 1:
        step.device_gate.open(step.seq)
    t_run, t_end = job.times()
    if t_run:
        step.t_fill0, step.t_fill1, step.fill_s = t_run, t_end or time.perf_counter(), (t_end or t_run) - t_run
    if state != 0 or chain.lost:  # (a job queued that never ran keeps its slot: it may still run)
        _LIVE.discard(job)
        job.release()
    if step._rows is None:  # noqa: SLF001 - (the rows are filled: a wait() before any start() must not fill again)
        step._rows = step.request_ids, step.positions, step.bitmask  # noqa: SLF001
    if err is not None:
        step._error = err  # noqa: SLF001
