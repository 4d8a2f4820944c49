"""The server core's torch thread count on a CPU, chosen online between ``cpus - 1`` and all CPUs.

Why: ``octavo serve`` keeps one CPU for the front end by default (``_reserve_frontend_core`` in
sdk/async_llm.py): when other processes run, a core whose OpenMP threads claim every CPU gets one of them
preempted and the other spins at every barrier (batch-32 decode steps 5-6x slower with 2 threads than with 1 on
the 2-vCPU VM while other engineers' jobs ran). On a quiet machine the front end is mostly idle and the reserved
CPU is wasted: the same steps ran 1.3-1.5x faster with 2 threads (docs/performance.md, "Threads of the server's
core process"). Which case holds changes while a server runs, so the core measures it instead of guessing:
from time to time it runs a few steps at the other count, compares them with neighbouring steps that did the
same work (same prompt tokens and generated tokens in the step), and keeps the faster count. A probe that loses
clearly (2x) is cut after one pair of steps and the next probe waits twice as long (up to ``MAX_INTERVAL_S``), so a
loaded machine pays about one slow step a minute; a step at the larger count that suddenly takes twice as long as
the last one with the same work starts a probe at once.

Session 8 (the C=1 TPOT goal of issue 18): the choice is kept per batch-size class (``work_class``: at C=1 the
front end idles between tokens, at C=32 its 32 streams keep it busy, so one count need not fit both, and a probe
lost at one size no longer delays another's); the first step a class runs at a count is a warm-up, not compared
(the first 2-thread step built the OpenMP team and read 4.4x: session 7's C=1 level never left 1 thread); a new
class starts at the latest probe's verdict; and a mild loss of the larger count (the front end busy for a moment,
e.g. importing its grammar backends right after ready) is retried as soon as such probes cost <= 1% of the time.

The thread count never changes a result: the default CPU paths gave bitwise-identical tokens and logprobs with
1 and 2 threads (tests/unit/test_cpu_threads.py), so a request's output does not depend on when it ran.
Session 11 (the C=1 TPOT goal held in 2 of 3 quiet runs): a step at more threads than the step before is a
transition and is not compared either: the added thread wakes from its sleep to cold caches. At C=1 on the Zen 4 VM
the 2-thread step after a 1-thread one read 6.1-10.6 ms against 5.2-5.9 steady, so a probe whose pairs were (other,
current) back to back lost a clear win by chance, or, probing down from 2 threads, paid the wake-up on the current
side and switched to the slower count (21 % of a C=1 run's steps ran at 1 thread). A pair is now a steady step at
the current count and the next steady step at the other, a transition between them left out; a probe ends as soon
as a majority of its pairs agree.

``OCTAVO_CPU_ADAPTIVE_THREADS=0`` keeps the fixed ``cpus - 1``; an explicit ``--num-threads`` is never changed.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("octavo.engine_core")

ENV = "OCTAVO_CPU_ADAPTIVE_THREADS"
FIRST_PROBE_S = 0.0  # the first probe runs as soon as two steps in a row did the same work
BASE_INTERVAL_S = 2.0  # after a switch: check again soon (the other count may win back)
MAX_INTERVAL_S = 64.0  # a probe that keeps losing is retried at most this rarely
WIN_RATIO = 0.9  # switch when the other count's steps take <= 0.9x as long (median of the pairs)
LOSE_RATIO = 1.15  # cut a probe as soon as one pair says the other count is >= 15% slower
CLEAR_LOSS_RATIO = 2.0  # a probe losing by this much doubles the wait for the next one (a busy machine)
PROBE_COST_SHARE = 0.01  # a milder loss waits just long enough that such probes cost <= 1% of the time
CLEAR_WIN_RATIO = 0.5  # switch after one pair when the other count took half the time or less
PAIRS = 3  # pairs of (current, other) steady steps per probe; it ends once a majority agree
SPIKE_RATIO = 2.0  # at the larger count: a step this much slower than its last twin starts a probe


def adaptive_threads_enabled() -> bool:
    """``OCTAVO_CPU_ADAPTIVE_THREADS``: unset or 1 = on, 0 = off; anything else is refused by name."""
    raw = os.environ.get(ENV, "1").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV}={raw!r}: use 1 (choose the core's threads by measuring) or 0 (keep cpus - 1)")
    return raw != "0"


def work_class(key: Any) -> int:
    """Steps that may want different thread counts: by the number of sequences in the step (powers of two: 1,
    2-3, 4-7, ...; a step with prompt tokens counts the sequences it generates for, so a C=32 step that also
    prefills a newcomer is in the batch-32 class). Why: at C=1 the front end is idle between tokens and a batch-1
    step gains from all CPUs, while a batch-32 step's outputs keep the front end busy, so one count need not fit
    both (and a probe lost at one size must not delay the probe of another)."""
    return 1 << (max(int(key[1]), 1).bit_length() - 1)


class _ClassState:
    """The governor's choice and probe for one :func:`work_class`."""

    def __init__(self, cur: int, now: float):
        self.cur = cur
        self.interval_s = BASE_INTERVAL_S
        self.next_probe_at = now + FIRST_PROBE_S
        self.twin: dict[Any, float] = {}  # key -> seconds of the last step at the larger count
        self.probe: list[float] | None = None  # ratios other/current of this probe's pairs
        self.ref: tuple[Any, float] | None = None  # the probe's reference step at the current count (key, seconds)
        self.mismatches = 0  # pairs of this probe whose two steps did different work
        self.extra_s = 0.0  # what this probe's steps at the other count cost over their references, transitions too
        self.ran: set[int] = set()  # thread counts that ran a step of this class (a first one is a warm-up)


class ThreadGovernor:
    """Chooses ``low`` or ``high`` torch threads for each step from measured step times, per :func:`work_class`.

    The loop calls :meth:`before_step` (which sets the count for the coming step, that of the class the last step
    had) and :meth:`after_step` with the step's wall seconds and a key of the work it did (``None`` when unknown:
    such a step is not compared). The first step a class runs at a count is not compared: the OpenMP team, the
    kernels' per-thread buffers and primitives are built then (a probe that counted it read 4.4x and lost).
    """

    def __init__(self, low: int, high: int, set_threads: Callable[[int], None],
                 clock: Callable[[], float] = time.monotonic):
        if not 1 <= low < high:
            raise ValueError(f"ThreadGovernor needs 1 <= low < high, got {low}, {high}")
        self.low, self.high = low, high
        self._set, self._clock = set_threads, clock
        self._applied: int | None = None
        self._classes: dict[Any, _ClassState] = {}
        self._cls = _ClassState(low, clock())  # the class of the last step (steps without a key: this one)
        self._last: tuple[Any, int, float] | None = None  # (key, threads, seconds) of the previous step
        self._prev_ran: int | None = None  # the count the previous step ran at (with or without a key)
        self._verdict = low  # the count the last finished probe found faster: where a new class starts
        self.switches: list[tuple[float, int]] = []  # (clock, new count): what the log says too
        self._apply(low)

    # the state of the class the coming step is expected to have (the last step's)
    @property
    def cur(self) -> int:
        return self._cls.cur

    @property
    def interval_s(self) -> float:
        return self._cls.interval_s

    def other_of(self, c: _ClassState) -> int:
        return self.high if c.cur == self.low else self.low

    @property
    def other(self) -> int:
        return self.other_of(self._cls)

    def _apply(self, n: int) -> None:
        if n != self._applied:
            self._set(n)
            self._applied = n

    def threads_for_next_step(self) -> int:
        """The count the next step runs at: the other count at the first step of each probe pair."""
        c = self._cls
        if c.probe is not None and c.ref is not None:  # a reference step at the current count: now the other's
            return self.other_of(c)
        return c.cur

    def before_step(self) -> None:
        self._apply(self.threads_for_next_step())

    def after_step(self, seconds: float, key: Any) -> None:
        ran = self._applied
        # A step at more threads than the one before is a transition: the added OpenMP threads wake from their sleep
        # and find cold caches (on the Zen 4 VM at C=1 such a 2-thread step read 6.1-10.6 ms against 5.2-5.9 steady,
        # while a 1-thread step after 2-thread ones read as its steady 6.9-7.5). Like a warm-up, it is not compared.
        transition, self._prev_ran = self._prev_ran is not None and ran > self._prev_ran, ran
        if key is None:
            self._last = None
            return
        wc = work_class(key)
        c = self._classes.get(wc)
        if c is None:  # a new class starts where the machine's latest verdict was, and probes soon
            c = self._classes[wc] = _ClassState(self._verdict, self._clock())
            if len(self._classes) > 64:
                self._classes = {wc: c}
        warm = ran not in c.ran
        c.ran.add(ran)
        if c.probe is not None:
            if self._cls is c:  # else this step ran at the count another class chose: not part of the probe
                self._probe_step(c, ran, seconds, key, warm, transition)
        elif transition or warm or ran != c.cur:
            pass
        elif ran == self.high and key in c.twin and seconds > SPIKE_RATIO * c.twin[key]:
            self._start_probe(c, key, seconds)  # the larger count suddenly got slow: the machine got busy
        elif (self._clock() >= c.next_probe_at and self._last is not None and self._last[0] == key
              and self._last[1] == c.cur == ran):
            self._start_probe(c, key, seconds)
        if ran == self.high and not (transition or warm):
            c.twin[key] = seconds
            if len(c.twin) > 256:
                c.twin.clear()
        self._cls = c
        self._last = (key, ran, seconds)

    def _start_probe(self, c: _ClassState, key: Any, seconds: float) -> None:
        """A probe of pairs: (a step at the current count, the next steady step at the other), each pair's current
        step taken right before its other step, so a pair is two neighbouring steps with the transition between them
        left out: ref, [transition], other, [transition back], ref, [transition], other, ..."""
        c.probe, c.ref, c.mismatches, c.extra_s = [], (key, seconds), 0, 0.0

    def _probe_step(self, c: _ClassState, ran: int, seconds: float, key: Any, warm: bool, transition: bool) -> None:
        """One step of a probe. A warm-up or transition step is not compared: the probe stays where it is, so the
        next step runs at the same count, steady."""
        if ran == c.cur:
            if not (warm or transition):
                c.ref = (key, seconds)  # this pair's reference: the next step runs at the other count
            return
        if c.ref is None:
            return
        ref_key, ref_s = c.ref
        if key == ref_key:
            c.extra_s += seconds - ref_s
        if warm or transition:
            if transition and not warm and key == ref_key and seconds >= CLEAR_LOSS_RATIO * max(ref_s, 1e-9):
                # twice as slow is more than threads waking up (~1-2 ms on the VM): a busy machine, cut at once
                c.probe.append(seconds / max(ref_s, 1e-9))
                self._end_probe(c, switch=False, lost_s=c.extra_s)
            return
        c.ref = None  # the next pair starts with a reference step at the current count
        if ref_key != key:  # the work changed between the two steps: no comparison
            c.mismatches += 1
            if c.mismatches >= PAIRS:
                self._end_probe(c, switch=False, retry_soon=True)
            return
        ratio = seconds / max(ref_s, 1e-9)
        c.probe.append(ratio)
        if ratio >= LOSE_RATIO:
            self._end_probe(c, switch=False, lost_s=c.extra_s)
        elif ratio <= CLEAR_WIN_RATIO:
            self._end_probe(c, switch=True)
        else:  # the median of PAIRS pairs, decided as soon as a majority of them agree (same verdict, fewer steps)
            wins = sum(r <= WIN_RATIO for r in c.probe)
            if wins > PAIRS // 2 or len(c.probe) - wins > PAIRS // 2:
                self._end_probe(c, switch=wins > PAIRS // 2)

    def _end_probe(self, c: _ClassState, switch: bool, retry_soon: bool = False, lost_s: float | None = None) -> None:
        ratios, c.probe, c.ref = c.probe or [], None, None
        now = self._clock()
        logger.debug("engine core: probe of %d threads (at %d): ratios %s, %s", self.other_of(c), c.cur,
                     [round(r, 2) for r in ratios], "switch" if switch else "keep")
        if ratios:
            self._verdict = self.other_of(c) if switch else c.cur
        if switch:
            old, c.cur = c.cur, self.other_of(c)
            c.interval_s = BASE_INTERVAL_S
            self.switches.append((now, c.cur))
            logger.info("engine core: %d torch threads instead of %d for %s steps (took %.2fx as long, median of "
                        "%d pairs; %s)", c.cur, old, _class_name(c, self._classes), statistics.median(ratios),
                        len(ratios), ENV)
        elif lost_s is not None and ratios[-1] < CLEAR_LOSS_RATIO and c.cur == self.low:
            # A mild loss of the larger count (a front end busy for a moment, e.g. its start-up warm-ups) is
            # retried soon, as long as such probes cost at most PROBE_COST_SHARE of the time; a clear loss (a busy
            # machine) backs off. (At the larger count a machine getting busy shows as a spike: no early retry.)
            c.interval_s = min(MAX_INTERVAL_S, max(BASE_INTERVAL_S, round(lost_s / PROBE_COST_SHARE, 3)))
        elif not retry_soon:
            c.interval_s = min(MAX_INTERVAL_S, c.interval_s * 2)
        c.next_probe_at = now + (BASE_INTERVAL_S if retry_soon else c.interval_s)


def _class_name(c: _ClassState, classes: dict[Any, _ClassState]) -> str:
    wc = next((k for k, v in classes.items() if v is c), 1)
    return f"batch {wc}-{2 * wc - 1}" if wc > 1 else "batch-1"


def _one_engine(settings: Any) -> bool:
    """No tensor, pipeline or data parallelism and the in-process executor: the model runs in this process."""
    par = settings.parallel
    sizes = (par.tensor_parallel_size, par.pipeline_parallel_size, getattr(par, "data_parallel_size", 1))
    return sizes == (1, 1, 1) and par.distributed_executor_backend in (None, "uni")


def make_governor(core: Any, settings: Any) -> ThreadGovernor | None:
    """A governor for this core when it may choose: CPU platform, model run in this process, one engine
    (no tensor/pipeline/data parallelism), ``num_threads`` = the server's reserved ``cpus - 1`` default, more
    than one CPU, and ``OCTAVO_CPU_ADAPTIVE_THREADS`` not 0. None otherwise (the fixed count stays)."""
    if not adaptive_threads_enabled():
        return None
    driver = getattr(getattr(core, "executor", None), "driver", None)
    platform = getattr(driver, "platform", None)
    if platform is None or getattr(platform, "device_type", None) != "cpu" or not _one_engine(settings):
        return None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    low = settings.device.num_threads or cpus
    if low >= cpus or cpus < 2:
        return None
    import torch

    logger.info("engine core: torch threads chosen by measuring, %d or %d (starts at %d; %s=0 keeps %d)",
                low, cpus, low, ENV, low)
    return ThreadGovernor(low, cpus, torch.set_num_threads)
