"""Pipeline parallelism on the engine core's side: several micro-batches in flight, so stages do not idle.

With one batch at a time, stage s waits while the other stages run it: each device is busy ~1/P of the time.
Here the engine core keeps up to P = ``pipeline_parallel_size`` steps in flight (vLLM's batch queue), each a
*disjoint* set of sampling requests:

    step():  schedule micro-batch k+1 from requests whose token is known ─▶ executor.execute_async(k+1)
             ─▶ while fewer than P are in flight: return (the next step() schedules another)
             ─▶ else wait for the OLDEST in flight only ─▶ update ─▶ outputs

    stage 0:  [k][k+1][k+2] ...        each stage runs the micro-batches in the order they were sent,
    stage 1:     [k][k+1][k+2] ...     so stage 0 computes k+1 while stage 1 computes k

Why the requests must be disjoint: a decoding request's next input is the token its previous step samples,
which only the LAST stage has; stage 0 needs it to embed. So a request whose sample is in flight is not
scheduled again until that step's output came back (``PipelineScheduler._num_to_compute`` returns 0). A
request in chunked prefill has no such dependency: its next chunk may ride in the next micro-batch, because
every stage runs micro-batches in order, so chunk k's K/V is written on each stage before chunk k+1 reads it.

Counts move at schedule time, exactly as under async scheduling (``AsyncScheduler``: a request that samples
owes one placeholder until its update), and the step loop is async scheduling's ``AsyncStepLoop`` with a depth
of P; but no placeholder token ever reaches a runner (``StepBatch`` tokens are always known), so the workers
run ordinary synchronous steps. Needs an executor with ``execute_async`` (``mp``); others keep one batch in flight.

What forms the micro-batches: each takes every request not in flight (vLLM's rule), so requests admitted in
different micro-batches stay in different ones, and new prompts' prefill runs on one stage while running
requests decode on another. Running decodes are NOT split further by default (``split``): a memory-bound decode
step costs about the same for half the batch, so P half-batches take P weight passes per stage for the tokens
one full batch gives in one pass; measured on this CPU (2 loaded cores, SmolLM2 PP=2, 16 x 32/32) the forced
split ran at 0.57x of one batch in flight. ``split=True`` (benchmarks) caps each micro-batch at
ceil(running / P) requests, which pays only where a step's cost grows with its batch (compute-bound steps).
"""

from __future__ import annotations

import logging
from typing import Any

from octavo.core.async_scheduler import AsyncScheduler
from octavo.core.request import Request
from octavo.core.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


class PipelineScheduler(AsyncScheduler):
    """:class:`AsyncScheduler` whose micro-batches are disjoint in sampling requests (see the module docstring).
    ``depth``: micro-batches in flight; ``split``: spread running requests evenly over them."""

    depth = 2
    split = False

    def schedule(self) -> SchedulerOutput:
        # ceil: one micro-batch's share of the running requests (split), else no cap
        self._cap = -(-len(self.running) // self.depth) if self.split else len(self.running)
        self._taken = 0
        return super().schedule()

    def _num_to_compute(self, req: Request) -> int:
        if req.num_output_placeholders:
            return 0  # its sampled token is still in flight: only the last stage has it
        if self._taken >= self._cap:
            return 0  # this micro-batch has its share; the next one takes the rest
        n = super()._num_to_compute(req)
        if n > 0:
            self._taken += 1
        return n


def pipeline_depth(core: Any) -> int:
    """Micro-batches to keep in flight by default: P with several stages, an executor that runs steps
    asynchronously and a device platform (each stage its own device); 1 otherwise, with one log line. On a CPU
    the stages share the cores and the memory bandwidth: measured there (SmolLM2 PP=2, 2 loaded cores,
    benchmarks/pp_microbatch.py) P micro-batches ran at 0.64x of one batch in flight, so a CPU keeps one."""
    p = core.settings.parallel.pipeline_parallel_size
    if p <= 1:
        return 1
    why = None
    if not getattr(core.executor, "supports_async_scheduling", False):
        why = f"the {getattr(core.executor, 'name', '?')!r} executor has no execute_async (use 'mp')"
    elif getattr(core.platform, "device_type", "cpu") == "cpu":
        why = "on a CPU the stages share cores and memory bandwidth (measured slower, docs/distributed.md)"
    if why is not None:
        logger.info("pipeline_parallel_size=%d: one batch in flight: %s", p, why)
        return 1
    return p


def set_pipeline_depth(core: Any, depth: int, split: bool = False) -> Any:
    """Switch an idle engine core between one batch in flight (``depth=1``) and ``depth`` micro-batches (``split``:
    running requests spread evenly over them, see the module docstring); returns the step loop installed as
    ``core.async_loop`` (``None`` for one batch). Called at start with :func:`pipeline_depth`, and by
    benchmarks/tests to compare the modes on one loaded engine."""
    from octavo.core.async_engine import AsyncStepLoop
    from octavo.core.scheduler import Scheduler

    if core.has_unfinished_requests():
        raise RuntimeError("set_pipeline_depth: the engine still has requests; switch when it is idle.")
    if depth > 1 and not getattr(core.executor, "supports_async_scheduling", False):
        raise ValueError(f"{depth} micro-batches in flight need an executor with execute_async; "
                         f"{getattr(core.executor, 'name', '?')!r} has none (use distributed_executor_backend='mp').")
    if core.async_loop is not None:
        core.async_loop.close()
    core.scheduler.__class__ = PipelineScheduler if depth > 1 else Scheduler  # same state; schedule/update differ
    core.scheduler.depth, core.scheduler.split = depth, split
    loop = None
    if depth > 1:
        loop = AsyncStepLoop(core)
        loop.depth = depth
        logger.info("pipeline parallelism: up to %d micro-batches in flight", depth)
    core.async_loop = loop
    return loop
