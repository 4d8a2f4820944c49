"""Where the batch-1 decode step's time goes outside the captured forward (``moe_e2e.py --host-diag``, issue 17 MoE
key, session 11): the H200 run of session 10 had 2.604 ms per token against a 2.300 ms graph replay.

Three views of the same engine, each over one greedy generation of ``tokens`` decode steps:

- ``step_timers_ms_per_step``: the engine core's own account (core/async_engine.StepTimers): host work of the core
  thread per step, the time it sat blocked on a step's tokens, and the part of its work that overlapped a step;
- ``trace``: a CUPTI trace (torch.profiler, CPU + CUDA). Per decode step (between graph launches): the GPU's busy
  time (union of kernel intervals), its idle time, the idle gaps of more than 2 us grouped by the kernels on
  either side (so a gap after the sampler and before the next forward's first kernel means the host was late),
  the kernels outside the graph, the CUDA runtime calls per step (synchronisations, copies, launches) with
  the host time they took, and how long after its ``cudaGraphLaunch`` call returned each forward graph's first
  kernel started (a few us: the GPU waited for the host; about a step: the host was a step ahead).
- ``cprofile``: the host's Python functions (both threads) by own time, per step, over the whole generation (its
  512-token prefill amortised over the steps; cProfile's overhead included: read it as shares, not absolute times).
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections import Counter, defaultdict

SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
              "cudaMemcpy", "cudaMemcpyAsync", "cudaGraphLaunch", "cudaLaunchKernel", "cudaLaunchKernelExC",
              "cuLaunchKernel", "cuLaunchKernelEx", "cudaEventRecord", "cudaEventQuery", "cudaStreamIsCapturing")


def _trace(run, steps: int) -> dict:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    evs = prof.events()
    launches = sorted(e.time_range.start for e in evs if e.name == "cudaGraphLaunch")
    if len(launches) < 4:
        return {"error": f"{len(launches)} graph launches in the trace"}
    t0, t1 = launches[1], launches[-1]  # whole decode steps only: from the 2nd graph launch to the last
    n = len(launches) - 2
    kern = sorted(((e.time_range.start, e.time_range.end, e.name) for e in evs
                   if e.device_type == DeviceType.CUDA and t0 <= e.time_range.start < t1), key=lambda k: k[0])
    if not kern:
        return {"error": "no kernels between the graph launches"}
    busy, gaps, end, prev = 0.0, defaultdict(float), kern[0][0], kern[0][2]
    for s, e, name in kern:
        if s > end:
            if s - end > 2.0:
                gaps[f"{prev[:50]} -> {name[:50]}"] += s - end
            busy += e - s
        elif e > end:
            busy += e - end
        if e > end:
            end, prev = e, name
    span = end - kern[0][0]
    calls, call_us = Counter(), defaultdict(float)
    for e in evs:
        if e.device_type == DeviceType.CPU and e.name in SYNC_CALLS and t0 <= e.time_range.start < t1:
            calls[e.name] += 1
            call_us[e.name] += e.time_range.end - e.time_range.start
    # host lead: how long after its cudaGraphLaunch call returned the graph's first kernel started (~ a launch
    # latency: the GPU waited for the host; ~ a step: the host was a step ahead)
    firsts = sorted(k[0] for k in kern if "indexSelect" in k[2])  # the embedding: the forward graph's first kernel
    ends = sorted(e.time_range.end for e in evs if e.name == "cudaGraphLaunch" and e.time_range.end >= t0)
    lead = []
    for end_t in ends:
        nxt = next((f for f in firsts if f >= end_t), None)
        if nxt is not None:
            lead.append(nxt - end_t)
    lead.sort()
    names = Counter(k[2] for k in kern)
    per_step = {nm: c / n for nm, c in names.items()}
    outside = {nm[:80]: round(c, 2) for nm, c in per_step.items() if abs(c - round(c)) < 0.05 and round(c) == 1}
    return {"decode_steps": n, "step_us": round(span / n, 1), "gpu_busy_us_per_step": round(busy / n, 1),
            "gpu_idle_us_per_step": round((span - busy) / n, 1), "kernels_per_step": round(len(kern) / n, 1),
            "idle_gaps_us_per_step": {k: round(v / n, 2) for k, v in sorted(gaps.items(), key=lambda kv: -kv[1])[:12]},
            "once_per_step_kernels": dict(list(outside.items())[:20]),
            "graph_start_after_launch_call_us": ({"min": round(lead[0], 1), "median": round(lead[len(lead) // 2], 1),
                                                  "max": round(lead[-1], 1), "n": len(lead)} if lead else None),
            "runtime_calls_per_step": {k: round(v / n, 2) for k, v in calls.items()},
            "runtime_call_us_per_step": {k: round(v / n, 1) for k, v in call_us.items()}}


def _cprofile(run, steps: int, top: int = 25) -> dict:
    pr = cProfile.Profile()
    pr.enable()
    run()
    pr.disable()
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = sorted(((v[2], v[3], v[1], f"{k[0].rsplit('/', 2)[-1]}:{k[1]}:{k[2]}") for k, v in st.stats.items()),
                  reverse=True)[:top]
    return {"total_ms_per_step": round(sum(v[2] for v in st.stats.values()) / steps * 1e3, 3),
            "top_own_time": [{"fn": r[3], "own_us_per_step": round(r[0] / steps * 1e6, 1),
                              "cum_us_per_step": round(r[1] / steps * 1e6, 1), "calls_per_step": round(r[2] / steps, 2)}
                             for r in rows]}


def host_diag(llm, prompt, tokens: int = 64) -> dict:
    """Both views over a ``tokens + 1``-token greedy generation of ``prompt`` (the engine as it is)."""
    from octavo import SamplingParams

    params = SamplingParams(max_tokens=tokens + 1, ignore_eos=True, temperature=0)

    def run():
        llm.generate([prompt], params, use_tqdm=False)

    run()  # warm
    out = {}
    core = llm.llm_engine.core
    timers = getattr(core, "step_timers", None)
    if timers is not None:  # the core thread's own per-step account (async: host work, time blocked on tokens)
        core.step_timers = type(timers)()
        run()
        d = core.step_timers.as_dict()
        core.step_timers = timers
        steps = max(1, d.pop("steps"))
        out["step_timers_ms_per_step"] = {k.replace("_s", ""): round(v / steps * 1e3, 4) for k, v in d.items()}
        out["step_timers_ms_per_step"]["steps"] = steps
    for name, fn in (("trace", _trace), ("cprofile", _cprofile)):
        try:
            out[name] = fn(run, tokens)
        except Exception as e:  # noqa: BLE001 - a diagnostic: the measurement stands without it
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def host_ab(ms_per_token, rounds: int = 2) -> dict:
    """ms per token with the host knobs of the step loop switched in this process, alternating (``--host-ab``):
    Python's GIL switch interval (5 ms by default: a thread woken while the other runs Python may wait that long;
    the engine core's thread and the step thread hand the GIL back and forth every step) and the engine core's
    wait on a blocking-sync event (core/async_runner.EVENT_BLOCKING, OCTAVO_ASYNC_EVENT_BLOCKING). Restores both."""
    import sys

    from octavo.core import async_runner

    has_ev = hasattr(async_runner, "EVENT_BLOCKING")  # the knob may be gone from the tree: that mode is left out
    saved_si, saved_ev = sys.getswitchinterval(), getattr(async_runner, "EVENT_BLOCKING", None)
    modes = {"default": (saved_si, saved_ev), "switch_0.2ms": (0.0002, saved_ev)}
    if has_ev:
        modes["event_blocking"] = (saved_si, True)
    out = {name: [] for name in modes}
    try:
        for _ in range(rounds):
            for name, (si, ev) in modes.items():
                sys.setswitchinterval(si)
                if has_ev:
                    async_runner.EVENT_BLOCKING = ev
                out[name].append(round(ms_per_token(), 4))
    finally:
        sys.setswitchinterval(saved_si)
        if has_ev:
            async_runner.EVENT_BLOCKING = saved_ev
    return out


def graph_gap_diag(gr, iters: int = 20, rounds: int = 2) -> dict:
    """What the batch-1 forward graph costs when its replay follows another kind of stream work (``--graph-gap-diag``,
    session 12): session 12's batch-1 trace had ~41 us of GPU idle between the step's last copy and the graph's first
    kernel, while back-to-back replays show no such gap. Per case, ms per iteration of ``iters`` x (the case's op,
    replay) with the host ahead (nothing waits in the loop), alternating ``rounds`` times; ``extra_us`` = the
    iteration minus a plain replay's: the op's own time plus the transition into the graph."""
    import time

    import torch

    g = gr.graphs[1]
    dev = gr.input_ids.device
    a, b = torch.zeros(64, dtype=torch.int64, device=dev), torch.zeros(64, dtype=torch.int64, device=dev)
    h = torch.zeros(64, dtype=torch.int64).pin_memory()
    as_ = [torch.zeros(64, dtype=torch.int64, device=dev) for _ in range(6)]
    bs = [torch.zeros(64, dtype=torch.int64, device=dev) for _ in range(6)]
    cases = {
        "replay_only": lambda: None,
        "dtod_copy": lambda: b.copy_(a, non_blocking=True),
        "htod_pinned_copy": lambda: b.copy_(h, non_blocking=True),
        "kernel": lambda: b.add_(1),
        "dtod_copy_then_kernel": lambda: (b.copy_(a, non_blocking=True), b.add_(1)),
        "six_dtod_copies": lambda: [b.copy_(a, non_blocking=True) for _ in range(6)],
        # torch's multi-tensor copy: one kernel for the list, if it takes its fast path (else memcpys)
        "foreach_copy_of_six": lambda: torch._foreach_copy_(bs, as_),
    }
    out = {name: [] for name in cases}
    for _ in range(rounds):
        for name, pre in cases.items():
            for timed in (False, True):
                torch.cuda.synchronize(dev)
                t = time.perf_counter()
                for _ in range(iters):
                    pre()
                    g.replay()
                torch.cuda.synchronize(dev)
                if timed:
                    out[name].append(round((time.perf_counter() - t) / iters * 1e3, 4))
    base = min(out["replay_only"])
    out["extra_us"] = {k: round((min(v) - base) * 1e3, 1) for k, v in out.items() if k != "replay_only"}
    return out
