"""The probes of benchmarks/nano_host_gap.py (moved out of it, unchanged, to keep that file to its one job: the runs):
GC pauses per generation, host phase timers (wall and thread CPU time), a cProfile of the step thread's long
forwards or of the engine's stepping thread, the largest GPU idle gaps of a probed run, and the kernel/host profiles
of one 8k-token prefill step."""

from __future__ import annotations

import functools
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import gen_timed  # noqa: E402
from nano_run_profile import StepEvents  # noqa: E402


class GCPauses:
    """Count and seconds of the cyclic GC's collections per generation while installed."""

    def __init__(self) -> None:
        self.by_gen = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
        self.spans: list[tuple[float, float, int]] = []  # (start, end, generation), host clock
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            t = time.perf_counter()
            g = self.by_gen[info["generation"]]
            g[0] += 1
            g[1] += t - self._t
            self.spans.append((self._t, t, info["generation"]))

    def remove(self) -> dict:
        gc.callbacks.remove(self._cb)
        return {f"gen{g}": {"collections": n, "seconds": round(s, 4)} for g, (n, s) in self.by_gen.items()}


class PhaseTimers:
    """Wall and thread-CPU seconds of named host functions (wrapped on their classes/modules while installed)."""

    def __init__(self, targets: list[tuple[object, str, str]], phase=None) -> None:
        self.acc: dict[str, list] = {}
        self.phase = phase  # () -> bool: calls made while it holds are also summed as "prefill phase: <label>"
        self.saved = []
        for owner, attr, label in targets:
            real = getattr(owner, attr)
            self.saved.append((owner, attr, real))
            setattr(owner, attr, self._wrap(real, label))

    def _wrap(self, real, label):
        acc, phase = self.acc, self.phase

        @functools.wraps(real)
        def timed(*a, **k):
            in_phase = phase is not None and phase()
            w, c = time.perf_counter(), time.thread_time()
            try:
                return real(*a, **k)
            finally:
                w, c = time.perf_counter() - w, time.thread_time() - c
                for key in (label, "prefill phase: " + label) if in_phase else (label,):
                    d = acc.setdefault(key, [0, 0.0, 0.0])
                    d[0] += 1
                    d[1] += w
                    d[2] += c
        return timed

    def remove(self) -> dict:
        for owner, attr, real in self.saved:
            setattr(owner, attr, real)
        return {k: {"calls": n, "wall_s": round(w, 4), "cpu_s": round(c, 4), "blocked_s": round(w - c, 4)}
                for k, (n, w, c) in sorted(self.acc.items(), key=lambda kv: -kv[1][1])}


def phase_targets(llm) -> list[tuple[object, str, str]]:
    """The core thread's phases (schedule, update, outputs, the front end) and the step thread's (inputs, the
    graph replay with its input copies, logits, sampling batch, sampler, the deferred host copies)."""
    from octavo.core import async_engine, async_runner, model_runner, scheduler, step_builder
    from octavo.core.engine_core import EngineCore

    engine = llm.llm_engine
    return [
        (scheduler.Scheduler, "schedule", "core: scheduler.schedule"),
        (scheduler.Scheduler, "update", "core: scheduler.update"),
        (step_builder.StepBuilder, "build", "core: steps.build"),
        (EngineCore, "_complete", "core: _complete (update + launch next + outputs)"),
        (async_engine.AsyncStepLoop, "_launch", "core: _launch (schedule + build + hand-off)"),
        (async_runner.DeferredOutput, "result", "core: DeferredOutput.result (waits for the step's tokens)"),
        (type(engine.frontend), "process_outputs", "front end: process_outputs"),
        (model_runner.ModelRunner, "execute", "step: execute (whole, until the sampler is queued)"),
        (model_runner.ModelRunner, "update_states", "step: update_states"),
        (model_runner.ModelRunner, "forward", "step: forward call (eager, or graph inputs + replay)"),
        (model_runner, "build_step_inputs", "step: build_step_inputs"),
        (model_runner, "build_sampling_batch", "step: build_sampling_batch"),
        (async_runner.AsyncRunnerSteps, "prepare", "step: async prepare (placeholders)"),
        (async_runner.AsyncRunnerSteps, "defer", "step: defer (host copies queued)"),
    ]


ALLOC_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")


class ForwardProfile:
    """cProfile of the runner's forward calls of >= ``min_tokens`` tokens (enabled on the calling thread, the step
    thread), with each such call's wall time; the rest of the run is not profiled."""

    def __init__(self, runner, min_tokens: int) -> None:
        import cProfile

        self.runner, self.real = runner, runner.forward
        self.prof, self.walls = cProfile.Profile(), []

        def forward(inputs, *a, **k):
            if inputs.layout.num_tokens < min_tokens:
                return self.real(inputs, *a, **k)
            self.prof.enable()
            t = time.perf_counter()
            try:
                return self.real(inputs, *a, **k)
            finally:
                self.walls.append(time.perf_counter() - t)
                self.prof.disable()

        runner.forward = forward

    def remove(self, top: int = 40) -> dict:
        import io
        import pstats

        del self.runner.forward
        buf = io.StringIO()
        pstats.Stats(self.prof, stream=buf).sort_stats("tottime").print_stats(top)
        return {"calls": len(self.walls), "wall_ms": [round(w * 1e3, 2) for w in self.walls],
                "by_tottime": buf.getvalue().splitlines()[-(top + 2):]}


class CoreProfile:
    """cProfile of ``EngineCore.step`` calls entered while the scheduler still has waiting requests (the thread that
    steps the engine: in ``LLM.generate`` the caller's), with each such call's wall time; later steps unprofiled."""

    def __init__(self, core) -> None:
        import cProfile

        self.core, self.real = core, core.step
        self.prof, self.walls = cProfile.Profile(), []

        def step(*a, **k):
            if not core.scheduler.waiting:
                return self.real(*a, **k)
            self.prof.enable()
            t = time.perf_counter()
            try:
                return self.real(*a, **k)
            finally:
                self.walls.append(time.perf_counter() - t)
                self.prof.disable()

        core.step = step

    def remove(self, top: int = 45) -> dict:
        import io
        import pstats

        del self.core.step
        out = {"calls": len(self.walls), "wall_ms_sum": round(sum(self.walls) * 1e3, 2)}
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(self.prof, stream=buf).sort_stats(key).print_stats(top)
            out[f"by_{key}"] = buf.getvalue().splitlines()[-(top + 2):]
        return out


def gap_summary(rec: StepEvents, gcs: list[tuple[float, float, int]], top: int = 12) -> dict:
    """Per-step GPU idle before the next forward: total, split by size, the largest gaps (with any GC pause that
    overlapped the host interval between the two steps' forward calls)."""
    steps = rec.steps
    gaps = []
    for i in range(len(steps) - 1):
        s, n = steps[i], steps[i + 1]
        fwd = s["e0"].elapsed_time(s["e1"])
        smp = s["e1"].elapsed_time(s["e2"]) if "e2" in s else 0.0
        idle = max(0.0, s["e0"].elapsed_time(n["e0"]) - fwd - smp)
        gc_ms = sum(max(0.0, min(e, n["h0"]) - max(b, s["h0"])) for b, e, _ in gcs) * 1e3
        gaps.append({"step": i, "rows": s["rows"], "tokens": s["tokens"], "graph": s["graph"], "idle_ms": idle,
                     "gpu_ms": fwd + smp, "host_period_ms": (n["h0"] - s["h0"]) * 1e3, "gc_ms_between": gc_ms})
    buckets = {"<0.05ms": [0, 0.0], "0.05-0.5ms": [0, 0.0], "0.5-2ms": [0, 0.0], ">2ms": [0, 0.0]}
    for g in gaps:
        k = ("<0.05ms" if g["idle_ms"] < 0.05 else "0.05-0.5ms" if g["idle_ms"] < 0.5 else
             "0.5-2ms" if g["idle_ms"] < 2 else ">2ms")
        buckets[k][0] += 1
        buckets[k][1] += g["idle_ms"] / 1e3
    worst = sorted(gaps, key=lambda g: -g["idle_ms"])[:top]
    return {"idle_s": sum(g["idle_ms"] for g in gaps) / 1e3, "gpu_s": sum(g["gpu_ms"] for g in gaps) / 1e3,
            "idle_with_gc_overlap_s": sum(g["idle_ms"] for g in gaps if g["gc_ms_between"] > 0) / 1e3,
            "buckets": {k: {"steps": n, "idle_s": round(s, 4)} for k, (n, s) in buckets.items()},
            "worst": [{k: round(v, 3) if isinstance(v, float) else v for k, v in g.items()} for g in worst]}


def prefill_profile(llm, reqs, SamplingParams) -> dict:
    """Kernel table of ONE prefill step like the run's (the workload's first prompts up to 8,192 tokens, ids shifted
    so nothing is a prefix hit, one output token each: one forward), CUDA activities only. Last: the profiler stays
    loaded in the process afterwards."""
    from nano_sampler import kernel_table
    from torch.profiler import ProfilerActivity, profile

    llm.reset_prefix_cache()
    prompts, n = [], 0
    for ids, _ in reqs:
        if n + len(ids) > 8192:
            break
        prompts.append({"prompt_token_ids": [(t + 7) % 10000 for t in ids]})
        n += len(ids)
    params = [SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.6)] * len(prompts)
    gen_timed(llm, prompts, params)  # same shapes once unprofiled (nothing compiles under the profiler)
    llm.reset_prefix_cache()
    import torch

    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        dt, _ = gen_timed(llm, prompts, params)
    rows = kernel_table(prof, 1, limit=30)
    return {"prompts": len(prompts), "tokens": n, "wall_s": dt,
            "gpu_kernels_us": round(sum(r["us_per_step"] for r in kernel_table(prof, 1, limit=10_000)), 1),
            "kernels": rows}


def prefill_host_profile(llm, worker, reqs, SamplingParams, min_tokens: int = 1024, top: int = 35) -> dict:
    """Where the step thread's host time goes in the eager forward of an 8k-token prefill step (session 9: ~27 ms a
    step on the H200, about its GPU time, so the GPU idled 7-10 ms after each): the prompts of ``prefill_profile``,
    twice unprofiled (each forward call's wall time, host clock), then under cProfile enabled on the step thread
    for the forward calls of >= ``min_tokens`` tokens only (inflated; read the shares). Before ``prefill_profile``
    (the torch profiler stays loaded after it). Functions by own time and by cumulative time."""
    import cProfile
    import io
    import pstats

    runner = worker.runner
    real = runner.forward
    prof = cProfile.Profile()
    walls: list[float] = []
    state = {"profile": False}

    def forward(inputs, *a, **k):
        if inputs.layout.num_tokens < min_tokens:
            return real(inputs, *a, **k)
        if state["profile"]:
            prof.enable()
        t = time.perf_counter()
        try:
            return real(inputs, *a, **k)
        finally:
            walls.append(time.perf_counter() - t)
            if state["profile"]:
                prof.disable()

    prompts, n = [], 0
    for ids, _ in reqs:
        if n + len(ids) > 8192:
            break
        prompts.append({"prompt_token_ids": [(t + 11) % 10000 for t in ids]})
        n += len(ids)
    params = [SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.6)] * len(prompts)
    runner.forward = forward
    try:
        out = {}
        for label, on in (("plain", False), ("plain", False), ("profiled", True)):
            llm.reset_prefix_cache()
            state["profile"], walls[:] = on, []
            gen_timed(llm, prompts, params)
            out.setdefault(f"{label}_forward_wall_ms", []).append([round(w * 1e3, 2) for w in walls])
    finally:
        del runner.forward
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        out[f"by_{key}"] = buf.getvalue().splitlines()[-(top + 2):]
    return {"tokens": n, **out}
