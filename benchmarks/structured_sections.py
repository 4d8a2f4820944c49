"""Diagnostic of benchmarks/structured_rotate.py ``--sections`` (session 17): each thread's CPU by section of a step.

Why: on the H200 (session 17, call 2) a structured 135M step adds ~0.27 ms, the runner's step thread carries most
of it (+0.26-0.29 ms of CPU a step over free decoding), and GIL-held Python on either thread costs the step about
one to one; the manager's keys (its apply 0.04-0.08 ms, the chain's launch) do not account for it. Here the runner's
``execute`` and its parts, and the core thread's grammar calls, are wrapped once with ``time.thread_time`` (the
calling thread's CPU, ~1 us a call), summed per section: the rotation reports each mode's CPU ms a step per section,
so the section that grows from free to structured decoding is named.

    install(core); reset(); ... ; take() -> {section: CPU seconds since reset}
"""

from __future__ import annotations

import time
from typing import Any

_CPU: dict[str, float] = {}


def _wrap(name: str, fn: Any) -> Any:
    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _CPU[name] = _CPU.get(name, 0.0) + time.thread_time() - t0

    return timed


def install(core: Any) -> None:
    """Wrap (once) the runner's sections (instance attributes, module names model_runner looks up at call time) and
    the core thread's grammar calls. Nested sections count in each (``execute`` holds the others)."""
    from octavo.core import grammar_chain
    from octavo.core import model_runner as mr
    from octavo.core.sampler import Sampler

    runner = core.executor.driver.runner
    for name in ("execute", "forward", "_sample", "_finish"):
        setattr(runner, name, _wrap(f"run.{name}", getattr(runner, name)))
    steps = runner.async_steps
    if steps is not None:
        steps.prepare = _wrap("run.async_prepare", steps.prepare)
        steps.defer = _wrap("run.defer", steps.defer)
    mr.build_step_inputs = _wrap("run.build_step_inputs", mr.build_step_inputs)
    mr.build_sampling_batch = _wrap("run.build_sampling_batch", mr.build_sampling_batch)
    mr.mask_logits = _wrap("run.mask_logits", mr.mask_logits)
    grammar_chain.launch = _wrap("run.chain_launch", grammar_chain.launch)
    Sampler.__call__ = _wrap("run.sampler", Sampler.__call__)
    st = core.structured
    for name in ("prepare", "accept_sampled", "accept_tokens"):
        setattr(st, name, _wrap(f"core.{name}", getattr(st, name)))
    sched = core.scheduler
    for name in ("schedule", "update"):
        if hasattr(sched, name):
            setattr(sched, name, _wrap(f"core.sched_{name}", getattr(sched, name)))


def reset() -> None:
    _CPU.clear()


def take() -> dict[str, float]:
    return dict(_CPU)
