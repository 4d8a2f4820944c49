"""The engine core's step loop under ``async_scheduling``: up to two steps in flight.

    step():  wait for N's tokens only ─▶ grammars accept them ─▶ N+1's fill, its (parked) sampler launched
             ─▶ update(N) ─▶ schedule N+2 (N+1's tokens still unknown: placeholders) ─▶ executor.execute_async(N+2)
             ─▶ N's outputs

So the host's scheduling, input preparation and output building for one step run while the worker runs the
others (vLLM's ``step_with_batch_queue``, reordered in session 6 so that N's outputs are built after N+2 is
launched). The first step of a burst returns without waiting. Counts and placeholders: core/async_scheduler.py;
the device side: core/async_runner.py; the grammar gate: core/async_gate.py; the design and what is refused:
docs/async_scheduling.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any

from octavo.core import async_gate
from octavo.core.async_gate import GatedGrammarStep  # noqa: F401 - public here too (tests, the mp executor's docs)
from octavo.core.async_runner import resolve
from octavo.core.messages import EngineCoreOutputs

logger = logging.getLogger(__name__)


def unsupported_reason(settings: Any, pm: Any) -> str | None:
    """Why async scheduling cannot run with these settings (the message names both settings), or ``None``."""
    from octavo.core.executor import executor_name

    sched, par = settings.scheduler, settings.parallel
    if sched.speculative_config:
        return ("async_scheduling=True cannot run with speculative_config (speculative decoding): a draft needs "
                "the previous step's tokens on the host. Turn one of them off.")
    if par.pipeline_parallel_size > 1:
        return "async_scheduling=True cannot run with pipeline_parallel_size > 1; turn one of them off."
    name = executor_name(settings)
    if name in pm.names("executors") and not getattr(pm.resolve("executors", name), "supports_async_scheduling",
                                                     False):
        return (f"async_scheduling=True needs an executor that runs steps asynchronously, but "
                f"distributed_executor_backend={name!r} (tensor_parallel_size={par.tensor_parallel_size}) does "
                "not; use the in-process executor 'uni' (one device) or turn async_scheduling off.")
    return None


def check_async_scheduling(settings: Any, pm: Any) -> None:
    """Refuse, before anything loads, what async scheduling cannot run (each error names both settings)."""
    reason = unsupported_reason(settings, pm)
    if reason is not None:
        raise ValueError(reason)


def resolve_async_scheduling(settings: Any, pm: Any, platform: Any) -> bool:
    """Settle ``scheduler.async_scheduling`` before anything loads and write the bool back (the worker reads it).

    ``True`` is refused (ValueError) where unsupported, ``False`` is off. ``None`` (the default, as vLLM's)
    turns it on where it is supported and worth it, and off with one log line naming the reason elsewhere:
    a CPU platform (measured: no gain there, docs/async_scheduling.md "Default"), or any combination
    ``True`` would be refused with. Pooling models are switched back off after load (:func:`pooling_off`).
    """
    sched = settings.scheduler
    if sched.async_scheduling is not None:
        if sched.async_scheduling:
            check_async_scheduling(settings, pm)
        return sched.async_scheduling
    from octavo.core.executor import executor_name

    reason = unsupported_reason(settings, pm)
    if reason is None and getattr(platform, "device_type", "cpu") == "cpu":
        reason = ("the platform is a CPU, where the forward is the step and async scheduling measured no gain "
                  "(docs/async_scheduling.md)")
    if reason is None and executor_name(settings) not in ("uni", "mp"):  # mp: checked on 2x H100 (docs/distributed.md)
        reason = (f"the default turns it on with the 'uni' and 'mp' executors only, not distributed_executor_backend="
                  f"{executor_name(settings)!r}; async_scheduling=True opts in where that executor supports it")
    sched.async_scheduling = reason is None
    if reason is None:
        logger.info("async scheduling on (the default on %s; async_scheduling=False turns it off)", platform.name)
    else:
        logger.info("async scheduling off by default: %s", reason.replace("async_scheduling=True cannot run",
                                                                           "it cannot run"))
    return sched.async_scheduling


def pooling_off(core: Any, auto: bool) -> None:
    """After load: a pooling model (one forward per request, nothing sampled) gets no gain from async
    scheduling, so the default turns it back off there (vLLM does the same); an explicit True stays."""
    settings = core.settings
    if auto and settings.scheduler.async_scheduling and core.executor.worker_info.is_pooling:
        core.executor.collective_rpc("octavo.core.async_engine:_set_runner_async", args=[False])
        settings.scheduler.async_scheduling = False
        logger.info("async scheduling off by default: the model is a pooling model (nothing is sampled)")


class StepTimers:
    """Host seconds per engine step, summed (both modes). ``host_s``: the core thread's own work (schedule,
    build, update, outputs); ``exec_s`` (sync): the executor call; ``wait_s`` (async): blocked on a step's
    tokens; ``overlapped_s`` (async): the part of ``host_s`` done while a step was running on the worker."""

    def __init__(self) -> None:
        self.steps = 0
        self.host_s = self.exec_s = self.wait_s = self.overlapped_s = 0.0

    def record(self, host_s: float = 0.0, exec_s: float = 0.0, wait_s: float = 0.0, overlapped_s: float = 0.0):
        self.steps += 1
        self.host_s += host_s
        self.exec_s += exec_s
        self.wait_s += wait_s
        self.overlapped_s += overlapped_s

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("steps", "host_s", "exec_s", "wait_s", "overlapped_s")}


# On an accelerator, after the next step was handed to the executor's thread, the core thread may block up to this
# long until that thread has queued it, before it builds the finished step's outputs. 0 (default): GPU batch 1 of
# session 6 (H100, random 1.1B, batch 32) measured 5 ms slower: free steps 1.49 vs 1.33 ms (the wait serialized the
# step thread's whole execute, ~1.2 ms, with the core thread's chain); kept for the benchmark (*_wait modes).
LAUNCH_WAIT_S = 0.0
# On an accelerator, while a structured step is in flight, Python's GIL switch interval can be set to this many
# seconds instead of the process's own (5 ms by default), put back once none is; 0 (default): untouched. Why it
# exists: a structured step's host chain (accept -> fill on the bitmask thread -> the parked sampler launched) hops
# between three threads, and a thread woken while another runs Python waits for the GIL up to the switch interval.
# Session 6 (H100, random 1.1B, batch 32, a process-wide 0.2 ms: the benchmark's _si modes): JSON step 2.27 vs
# 2.82 ms (batch 2), 2.79 vs 3.10 (batch 1). But session 7 batch 1 (this per-step form at 0.2 ms, same engine,
# interleaved): 2.08 vs 1.71 ms without it, i.e. worse, so it stays off; the benchmark's json_async_sw*us modes
# set it (docs/performance.md).
GRAMMAR_SWITCH_INTERVAL_S = 0.0


@dataclass
class _InFlight:
    sched_out: Any
    future: Any
    grammar: GatedGrammarStep | None


class AsyncStepLoop:
    """``EngineCore.step`` under async scheduling (the core's scheduler is an ``AsyncScheduler``).

    Order of one steady ``step()`` (steps N and N+1 in flight on entry, N+1 and N+2 on exit):

        wait for N's tokens ─▶ grammars accept them ─▶ N+1's gate: fill, its sampler launched (parked runner)
        ─▶ update(N) ─▶ schedule N+2, hand it to the executor (its forward queued behind N+1's sampler)
        ─▶ N's outputs ─▶ return

    so N's outputs and whatever the caller does with them run while the device works on N+1 and N+2, not
    between N's tokens and N+2's forward (``early_launch``; pipeline parallelism keeps the older order:
    schedule at the top of ``step()``). The first call of a burst only launches.
    """

    depth = 2  # steps in flight; pipeline parallelism sets P (core/pp_schedule.py)

    def __init__(self, core: Any) -> None:
        self.core = core
        self.inflight: deque[_InFlight] = deque()
        self.stash: deque[Any] = deque()  # outputs (or an error) of steps drained by wait_idle, returned first
        on_accelerator = getattr(getattr(core, "platform", None), "device_type", "cpu") != "cpu"
        self.launch_wait_s = LAUNCH_WAIT_S if on_accelerator else 0.0
        self.grammar_switch_s = GRAMMAR_SWITCH_INTERVAL_S if on_accelerator else 0.0
        self._saved_switch: float | None = None  # the interval to put back (set while a structured step is in flight)
        # OCTAVO_ASYNC_LOOP=old: session 5's order (schedule at the top of step(), the runner blocks on the grammar
        # gate, fill inline), for A/B runs of the whole engine; "new" (default) is the order above
        mode = os.environ.get("OCTAVO_ASYNC_LOOP", "new")
        if mode not in ("new", "old"):
            raise ValueError(f"OCTAVO_ASYNC_LOOP={mode!r}: must be 'new' or 'old'")
        self.new_loop = mode == "new"
        self.early_launch = self.new_loop

    @property
    def busy(self) -> bool:
        return bool(self.inflight) or bool(self.stash)

    def _early(self) -> bool:
        return self.early_launch and self.depth == 2 and self.core.settings.parallel.pipeline_parallel_size == 1

    def step(self) -> EngineCoreOutputs:
        if self.stash:
            out = self.stash.popleft()
            if isinstance(out, BaseException):
                raise out
            return out
        core = self.core
        t0 = time.perf_counter()
        was_running = bool(self.inflight)
        early: list = []
        launched = False
        if len(self.inflight) < self.depth:
            launched, early = self._launch()
        t1 = time.perf_counter()
        sched_s = t1 - t0
        if not self.inflight or (launched and len(self.inflight) < self.depth):
            # nothing to wait for, or the first step of a burst: return now, schedule the next one meanwhile
            core.step_timers.record(host_s=sched_s, overlapped_s=sched_s if launched else 0.0)
            return EngineCoreOutputs(early, core.get_stats(), time.monotonic())
        return self._complete_oldest(early, sched_s, was_running, t1, self._early())

    def _launch(self) -> tuple[bool, list]:
        """Schedule one step and hand it to the executor; ``(launched, early outputs of the schedule)``."""
        core = self.core
        sched_out, early = core._schedule()
        if sched_out.is_empty:
            return False, early
        batch = core.steps.build(sched_out)
        for s in batch.scheduled:  # the KV manager edits its live lists while this step runs
            s.block_ids = list(s.block_ids)
        g = core.structured.prepare(sched_out)
        gate = GatedGrammarStep(g, sched_out) if g is not None else None
        if gate is not None:
            gate.parkable = async_gate.PARK and self.new_loop and self.depth == 2
        core.scheduler.mark_scheduled(sched_out)
        try:
            future = core.executor.execute_async(batch, gate)
        except BaseException:
            self._release_all()
            raise
        self.inflight.append(_InFlight(sched_out, future, gate))
        if gate is not None:
            self._switch_interval()
        if len(self.inflight) == 1 and gate is not None:
            gate.release()  # nothing earlier in flight: the grammars are current
        return True, early

    def _launch_between(self) -> list:
        """Called by ``EngineCore._complete`` between ``update(N)`` and N's outputs: launch N+2 now."""
        nxt = self.inflight[0].grammar
        if nxt is not None:
            nxt.release()  # (normally done at the accept) N+1's sampler is queued before N+2 reads its ids
        launched, early = self._launch()
        if launched and self.launch_wait_s > 0:
            fut = self.inflight[-1].future
            if isinstance(fut, Future):  # in-process: wait (GIL released) until its thread queued the step
                futures_wait([fut], timeout=self.launch_wait_s)
        return early

    def _complete_oldest(self, early: list, sched_s: float, was_running: bool, t1: float,
                         launch_next: bool) -> EngineCoreOutputs:
        core = self.core
        rec = self.inflight.popleft()
        try:
            if rec.grammar is not None:  # its native fill, if started in C, over first (it may need the host to open)
                rec.grammar.inner.settle()
            result = resolve(rec.future.result())
        except BaseException:
            self._release_all()
            raise
        finally:
            if self._saved_switch is not None:
                self._switch_interval()
        t2 = time.perf_counter()
        g = rec.grammar
        core.structured._inflight = g.inner if g is not None and g.inner.matchers else None  # fill stats
        nxt = self.inflight[0].grammar if self.inflight else None  # N+1's fill starts right after N's accept:
        hook = None if nxt is None else (nxt.start_fill if async_gate.EARLY_FILL and self.new_loop else nxt.release)
        core.structured.after_accept = hook  # N+1's fill right after N's accept, not after all N's outputs
        core.structured.accept_sampled(rec.sched_out, result)  # N's tokens -> grammars -> N+1's fill, before update
        between = self._launch_between if launch_next and self.inflight and len(self.inflight) < self.depth else None
        out = core._complete(rec.sched_out, result, early, between)
        if self.inflight and self.inflight[0].grammar is not None:
            self.inflight[0].grammar.release()  # N's tokens are in the grammars: fill N+1's masks now
        t3 = time.perf_counter()
        core.step_timers.record(host_s=sched_s + (t3 - t2), wait_s=t2 - t1,
                                overlapped_s=(sched_s if was_running else 0.0) + ((t3 - t2) if self.inflight else 0.0))
        return out

    def _switch_interval(self) -> None:
        """:data:`GRAMMAR_SWITCH_INTERVAL_S` while a structured step is in flight, the saved interval otherwise."""
        want = self.grammar_switch_s > 0 and any(rec.grammar is not None for rec in self.inflight)
        if want and self._saved_switch is None:
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.grammar_switch_s)
        elif not want and self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None

    def _release_all(self) -> None:
        for rec in self.inflight:
            if rec.grammar is not None:
                rec.grammar.release()

    def wait_idle(self) -> None:
        """Make the worker idle before the core calls into it (collective_rpc, sleep): the steps in flight are
        completed in order, as ``step()`` would (a gated step needs its predecessor's tokens first), and their
        outputs (or the error) are kept for the next ``step()`` calls; nothing new is scheduled."""
        t = time.perf_counter()
        while self.inflight:
            try:
                self.stash.append(self._complete_oldest([], 0.0, True, t, False))
            except BaseException as e:  # noqa: BLE001 - step() raises it
                self.stash.append(e)
                self._wait_futures()
                self.inflight.clear()
                return

    def _wait_futures(self) -> None:
        for rec in list(self.inflight):
            try:
                rec.future.result()
            except BaseException:
                pass  # step() raises it

    def close(self) -> None:
        self._release_all()
        self._wait_futures()
        if self._saved_switch is not None:  # the process's own switch interval back
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None


def set_async_scheduling(core: Any, on: bool) -> None:
    """Switch an idle engine core between async and synchronous scheduling, so a benchmark or a test compares
    both modes on one loaded model (the start-up cost of a second engine is what it saves). The engine must
    have no request left; ``async_scheduling`` in the settings keeps the value the engine started with."""
    from octavo.core.async_scheduler import AsyncScheduler
    from octavo.core.scheduler import Scheduler

    if core.has_unfinished_requests():
        raise RuntimeError("set_async_scheduling: the engine still has requests; switch modes when it is idle.")
    if on:
        check_async_scheduling(core.settings, core.pm)
    if core.async_loop is not None:
        core.async_loop.close()
    core.scheduler.__class__ = AsyncScheduler if on else Scheduler  # same state; only update() differs
    core.executor.collective_rpc("octavo.core.async_engine:_set_runner_async", args=[on])  # a name: mp workers too
    core.async_loop = AsyncStepLoop(core) if on else None


def _set_runner_async(worker: Any, on: bool) -> None:
    from octavo.core.tp_comm import make_async_steps

    worker.runner.async_steps = make_async_steps(worker) if on else None
