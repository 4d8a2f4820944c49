"""What the structured-output benchmarks share: the decode schema, the 50-property compile schema, the per-step host
keys of the structured-output manager, a per-thread CPU reader and the engine-core step timer.

Used by benchmarks/structured_outputs.py (modes in one engine), benchmarks/structured_ab.py (two engines, paired
steps) and benchmarks/structured_compile.py (compile and fill costs).
"""

from __future__ import annotations

import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "score": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["name", "tags", "score"]}


def schema_50() -> dict:
    kinds = [{"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "string", "maxLength": 20},
             {"type": "boolean"}, {"enum": ["a", "b", "c"]}, {"type": "array", "items": {"type": "number"}}]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": props, "required": list(props)[:25], "additionalProperties": False}


# the structured-output manager's per-step host seconds, then the engine core thread's own (StepTimers: its work
# per step, and under async scheduling the time it blocked waiting for a step's tokens: the slack)
HOST_KEYS = ("prepare_s", "fill_s", "wait_s", "apply_s", "accept_s", "accept_thread_s", "release_s", "start_lag_s",
             "resume_lag_s", "device_wait_s", "open_lag_s", "core_host_s", "core_wait_s")


def thread_cpu_s(field: int = 0) -> dict[str, float]:
    """CPU seconds each thread of this process has run so far, by name (Linux ``/proc/self/task/*/schedstat``, ns
    resolution; Python threads by their ``threading`` name with pool suffixes dropped, others by their OS name:
    torch's OpenMP workers, xgrammar's, CUDA's), summed per name. Empty where /proc has no schedstat. ``field`` 1:
    the seconds each was runnable but waiting for a CPU instead (the run queue: CPU contention)."""
    import os
    import re
    import threading

    names = {t.native_id: re.sub(r"_\d+$", "", t.name) for t in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[field])
            name = names.get(int(tid))
            if name is None:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "os:" + re.sub(r"\d+$", "", f.read().strip())
        except (OSError, ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def timed_steps(core, reqs, full: int, tokens: dict | None = None, sampler=None) -> list[float]:
    """Add ``reqs`` to the engine core, run it dry, return the times of steps where all ``full`` decode
    (and, if ``tokens`` is a dict, collect each request's output token ids into it). ``sampler``: a
    benchmarks/stack_sampler.py ``StackSampler`` that records during those steps only (not prefill or the tail)."""
    for r in reqs:
        core.add_request(r)
    times = []
    while core.has_unfinished_requests():
        running = sum(1 for r in core.scheduler.running if r.num_output_tokens >= 1)
        if sampler is not None:
            sampler.enabled = running == full
        t0 = time.perf_counter()
        out = core.step()
        dt = time.perf_counter() - t0
        if running == full:
            times.append(dt)
        if tokens is not None:
            for o in out.outputs:
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    if sampler is not None:
        sampler.enabled = False
    return times
