"""The server core's torch thread count on a CPU, chosen online between ``cpus - 1`` and all CPUs.

Why: ``octavo serve`` keeps one CPU for the front end by default (``_reserve_frontend_core`` in
sdk/async_llm.py): when other processes run, a core whose OpenMP threads claim every CPU gets one of them
preempted and the other spins at every barrier (batch-32 decode steps 5-6x slower with 2 threads than with 1 on
the 2-vCPU VM while other engineers' jobs ran). On a quiet machine the front end is mostly idle and the reserved
CPU is wasted: the same steps ran 1.3-1.5x faster with 2 threads (docs/performance.md, "Threads of the server's
core process"). Which case holds changes while a server runs, so the core measures it instead of guessing:
from time to time it runs a few steps at the other count, compares them with neighbouring steps that did the
same work (same prompt tokens and generated tokens in the step), and keeps the faster count. A probe that loses
is cut after one pair of steps and the next probe waits twice as long (up to ``MAX_INTERVAL_S``), so a loaded
machine pays about one slow step a minute; a step at the larger count that suddenly takes twice as long as the
last one with the same work starts a probe at once.

The thread count never changes a result: the default CPU paths gave bitwise-identical tokens and logprobs with
1 and 2 threads (tests/unit/test_cpu_threads.py), so a request's output does not depend on when it ran.
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
CLEAR_WIN_RATIO = 0.5  # switch after one pair when the other count took half the time or less
PAIRS = 3  # pairs of (other, current) steps per probe
SPIKE_RATIO = 2.0  # at the larger count: a step this much slower than its last twin starts a probe


def adaptive_threads_enabled() -> bool:
    """``OCTAVO_CPU_ADAPTIVE_THREADS``: unset or 1 = on, 0 = off; anything else is refused by name."""
    raw = os.environ.get(ENV, "1").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV}={raw!r}: use 1 (choose the core's threads by measuring) or 0 (keep cpus - 1)")
    return raw != "0"


class ThreadGovernor:
    """Chooses ``low`` or ``high`` torch threads for each step from measured step times.

    The loop calls :meth:`before_step` (which sets the count for the coming step) and :meth:`after_step` with the
    step's wall seconds and a key of the work it did (``None`` when unknown: such a step is not compared).
    """

    def __init__(self, low: int, high: int, set_threads: Callable[[int], None],
                 clock: Callable[[], float] = time.monotonic):
        if not 1 <= low < high:
            raise ValueError(f"ThreadGovernor needs 1 <= low < high, got {low}, {high}")
        self.low, self.high, self.cur = low, high, low
        self._set, self._clock = set_threads, clock
        self._applied: int | None = None
        self.interval_s = BASE_INTERVAL_S
        self.next_probe_at = clock() + FIRST_PROBE_S
        self._last: tuple[Any, int, float] | None = None  # (key, threads, seconds) of the previous step
        self._twin: dict[Any, float] = {}  # key -> seconds of the last step at the larger count
        self._probe: list[float] | None = None  # ratios other/current of this probe's pairs
        self._pending: tuple[Any, float] | None = None  # the probe's last step at the other count
        self._mismatches = 0  # pairs of this probe whose two steps did different work
        self.switches: list[tuple[float, int]] = []  # (clock, new count): what the log says too
        self._apply(low)

    @property
    def other(self) -> int:
        return self.high if self.cur == self.low else self.low

    def _apply(self, n: int) -> None:
        if n != self._applied:
            self._set(n)
            self._applied = n

    def threads_for_next_step(self) -> int:
        """The count the next step runs at: the other count at the first step of each probe pair."""
        if self._probe is not None and self._pending is None:
            return self.other
        return self.cur

    def before_step(self) -> None:
        self._apply(self.threads_for_next_step())

    def after_step(self, seconds: float, key: Any) -> None:
        ran = self._applied
        if key is None:
            self._last = None
            return
        if self._probe is not None:
            self._probe_step(ran, seconds, key)
        elif ran == self.high and key in self._twin and seconds > SPIKE_RATIO * self._twin[key]:
            self._start_probe()  # the larger count suddenly got slow: the machine got busy
        elif (self._clock() >= self.next_probe_at and self._last is not None and self._last[0] == key
              and self._last[1] == self.cur):
            self._start_probe()
        if ran == self.high:
            self._twin[key] = seconds
            if len(self._twin) > 256:
                self._twin.clear()
        self._last = (key, ran, seconds)

    def _start_probe(self) -> None:
        self._probe, self._pending, self._mismatches = [], None, 0

    def _probe_step(self, ran: int, seconds: float, key: Any) -> None:
        if ran == self.other:  # first step of a pair
            self._pending = (key, seconds)
            return
        other_key, other_s = self._pending or (None, 0.0)
        self._pending = None
        if other_key != key:  # the work changed between the two steps: no comparison
            self._mismatches += 1
            if self._mismatches >= PAIRS:
                self._end_probe(switch=False, retry_soon=True)
            return
        ratio = other_s / max(seconds, 1e-9)
        self._probe.append(ratio)
        if ratio >= LOSE_RATIO:
            self._end_probe(switch=False)
        elif ratio <= CLEAR_WIN_RATIO:
            self._end_probe(switch=True)
        elif len(self._probe) >= PAIRS:
            self._end_probe(switch=statistics.median(self._probe) <= WIN_RATIO)

    def _end_probe(self, switch: bool, retry_soon: bool = False) -> None:
        ratios, self._probe, self._pending = self._probe, None, None
        now = self._clock()
        if switch:
            old, self.cur = self.cur, self.other
            self.interval_s = BASE_INTERVAL_S
            self.switches.append((now, self.cur))
            logger.info("engine core: %d torch threads instead of %d (steps took %.2fx as long, median of %d "
                        "pairs; %s)", self.cur, old, statistics.median(ratios), len(ratios), ENV)
        elif not retry_soon:
            self.interval_s = min(MAX_INTERVAL_S, self.interval_s * 2)
        self.next_probe_at = now + (BASE_INTERVAL_S if retry_soon else self.interval_s)
        self._apply(self.cur)


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
