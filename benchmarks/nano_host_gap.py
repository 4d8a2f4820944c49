"""What the GPU waits for in the nano-vllm run, and which host knob removes it (issue 17, session 9), in ONE engine.

The workload of ``gpu_e2e.py qwen3_nanovllm`` (Qwen3-0.6B shape, 256 x U[100, 1024] in/out, temperature 0.6),
warmed with ``gpu_e2e.warm_up``; then the runs ``--runs`` names, in that order, each with the prefix cache emptied
first (the runs repeat the same prompts). Every run records the cyclic GC's pauses (``gc.callbacks``: count and
seconds per generation; the GC holds the GIL, so a pause stops the core thread and the step thread alike).

  defaults   the run as the headline times it
  probe      the same run, hooked: three CUDA events a step (GPU time of the forward and of logits + sampler, and
             the GPU's idle time before the next step's forward, by step kind; the largest idle gaps), and host
             timers around the core's and the runner's phases, each as wall time and as the thread's CPU time
             (wall - CPU = time the thread was runnable but blocked: the GIL, a device sync)
  no_freeze  ``OCTAVO_GC_FREEZE=0`` for the run: the GC as Python runs it, as before session 9 (by default
             ``LLM.generate`` defers full collections and freezes the heap alive at its start: core/gc_heap.py)
  prefill_prof  the same run with cProfile on the step thread inside the forward calls of >= 1,024 tokens only
             (the 18 eager 8k-token prefill steps, as they run beside the core thread's admissions; session 10's
             H100 probe: 37 ms of host per such forward in the run vs 17-22 ms alone): functions by own time
  core_prof  the same run with cProfile on the engine's stepping thread (schedule, KV admission + pacing, inputs'
             hand-off, update, outputs, the front end) only in steps entered while requests still wait (the prefill
             phase: the 18 host-bound 8k-token steps share the GIL with this work; session 11)
  gc_off     the cyclic GC disabled during the run: what the GC costs at most
  si_<us>    ``sys.setswitchinterval(<us> * 1e-6)`` during the run: a thread waiting for the GIL waits at most
             that long (Python's default is 5 ms)

    python benchmarks/nano_host_gap.py --out /tmp/gap.json [--budget-s 100] [--runs defaults probe gc_off ...]
        [--prefill-profile]   # last, if the budget allows: the kernel table of one 8k-token prefill step
    python benchmarks/nano_host_gap.py --out /tmp/gap.json --dry   # CPU: a tiny Qwen3, checks the hooks

Runs stop being started when ``--budget-s`` would be exceeded; the JSON is written after every run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import JitMisses, gen_timed, make_llm, nanovllm_workload, qwen3_config, warm_up, write_config  # noqa: E402
from nano_run_profile import StepEvents  # noqa: E402

T0 = time.perf_counter()


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


def main() -> None:
    import torch

    from octavo import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=100.0)
    ap.add_argument("--runs", nargs="*", default=["defaults", "probe", "no_freeze", "defaults", "no_freeze", "gc_off"])
    ap.add_argument("--prefill-profile", action="store_true", help="last: kernel table of one 8k-token prefill step")
    ap.add_argument("--prefill-host", action="store_true",
                    help="last: cProfile of the step thread's eager forward of one 8k-token prefill step")
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny Qwen3, 24 requests; checks the hooks")
    args = ap.parse_args()
    for r in args.runs:
        if r not in ("defaults", "probe", "no_freeze", "gc_off", "prefill_prof", "core_prof") and not r.startswith("si_"):
            raise SystemExit(f"unknown run {r!r}")
    if args.dry:
        torch.cuda.synchronize = lambda *a: None  # gen_timed's syncs; nothing runs on a GPU here
    res: dict = {"card": "cpu (dry run)" if args.dry else torch.cuda.get_device_name(),
                 "command": " ".join(["python", *sys.argv]),
                 "runs": []}

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - T0
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    with tempfile.TemporaryDirectory() as tmp:
        cfg, arch = qwen3_config()
        kw = dict(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
        reqs = nanovllm_workload()
        if args.dry:
            cfg = dict(cfg, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=512, bos_token_id=1, eos_token_id=2)
            kw = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=256, async_scheduling=True)
            reqs = [([t % 500 for t in ids[:40]], 1 + n % 24) for ids, n in nanovllm_workload(num=24)]
        d = write_config(cfg, tmp, "qwen3-0.6b")
        jit = JitMisses()
        llm, worker, info = make_llm(d, **kw)
        res.update(architecture=arch, fused=info.get("fused"), start_s=time.perf_counter() - T0,
                   async_scheduling=llm.llm_engine.settings.scheduler.async_scheduling,
                   gc_tracked_objects=len(gc.get_objects()), gc_freeze_env=os.environ.get("OCTAVO_GC_FREEZE"))
        res["warmup_s"] = warm_up(llm, [(len(ids), 1 + i % 32) for i, (ids, _) in enumerate(reqs)], seed=11,
                                  temperature=0.6, ids=(3, 500) if args.dry else (20000, 120000))
        print(f"engine ready + warmed in {time.perf_counter() - T0:.1f} s (warm-up {res['warmup_s']:.1f} s), "
              f"{res['gc_tracked_objects']} objects tracked by the GC", flush=True)
        save()
        prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6) for _, n in reqs]
        last = 10.0

        for name in args.runs:
            if time.perf_counter() - T0 + last * 1.4 + 2 > args.budget_s:
                res["runs"].append({"run": name, "skipped": "time budget"})
                continue
            extra: dict = {}
            undo = []
            if name == "no_freeze":
                os.environ["OCTAVO_GC_FREEZE"] = "0"
                undo.append(lambda: os.environ.pop("OCTAVO_GC_FREEZE"))
            elif name == "gc_off":
                gc.disable()
                undo.append(gc.enable)
            elif name.startswith("si_"):
                old = sys.getswitchinterval()
                sys.setswitchinterval(int(name[3:]) * 1e-6)
                undo.append(lambda old=old: sys.setswitchinterval(old))
            rec = timers = pprof = cprof = None
            if name == "prefill_prof":
                pprof = ForwardProfile(worker.runner, 64 if args.dry else 1024)
            if name == "core_prof":
                cprof = CoreProfile(llm.llm_engine.core)
            if name == "probe":
                sched = llm.llm_engine.core.scheduler  # (before StepEvents, which binds the runner's forward)
                timers = PhaseTimers(phase_targets(llm), phase=lambda sched=sched: bool(sched.waiting))
                rec = StepEvents(worker, (), 0)
            m0 = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
            gcp = GCPauses()
            core = llm.llm_engine.core
            st0 = dict(core.step_timers.as_dict())
            reset = llm.reset_prefix_cache()
            mark = len(jit.log)
            t_call = time.perf_counter()
            try:
                dt, outs = gen_timed(llm, prompts, params)
            finally:
                for f in undo:
                    f()
                if rec is not None:
                    rec.remove()
            extra["gc"] = gcp.remove()
            if pprof is not None:
                extra["prefill_forwards"] = pprof.remove()
            if cprof is not None:
                extra["core_prefill_phase"] = cprof.remove()
            if torch.cuda.is_available():  # the caching allocator's device calls (cudaFree synchronizes the device)
                m1 = torch.cuda.memory_stats()
                extra["allocator"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in ALLOC_KEYS}
            st1 = core.step_timers.as_dict()
            extra["step_timers"] = {k: round(st1[k] - st0[k], 4) for k in st1}
            extra["triton_builds_in_run"] = jit.since(mark)
            if timers is not None:
                extra["phases"] = timers.remove()
                extra["steps"] = rec.summary()
                extra["gaps"] = gap_summary(rec, gcp.spans)
                if rec.steps:  # host time before the first forward call (admission, first schedule + inputs) and
                    # after the last sampler call (its tokens, the outputs); full GC pauses in each
                    t_end, first, end = t_call + dt, rec.steps[0]["h0"], rec.steps[-1].get("h2", rec.steps[-1]["h1"])
                    extra["head_tail"] = {
                        "head_s": round(first - t_call, 4), "tail_s": round(t_end - end, 4),
                        "gc_in_head_s": round(sum(max(0.0, min(e, first) - b) for b, e, _ in gcp.spans if b < first), 4),
                        "gc_in_tail_s": round(sum(max(0.0, e - max(b, end)) for b, e, _ in gcp.spans if e > end), 4)}
            last = dt
            total = sum(len(o.outputs[0].token_ids) for o in outs)
            run = {"run": name, "seconds": dt, "output_tokens": total,
                   "throughput_qwen3_0p6b_nanovllm_tok_s": total / dt, "prefix_cache_reset": reset, **extra}
            print(json.dumps(run)[:4000], flush=True)
            res["runs"].append(run)
            save()
        if args.prefill_host and time.perf_counter() - T0 + 6 < args.budget_s:
            res["prefill_host"] = prefill_host_profile(llm, worker, reqs, SamplingParams,
                                                       min_tokens=64 if args.dry else 1024)
            print(json.dumps(res["prefill_host"])[:6000], flush=True)
            save()
        if args.prefill_profile and not args.dry and time.perf_counter() - T0 + 6 < args.budget_s:
            res["prefill_step"] = prefill_profile(llm, reqs, SamplingParams)
            print(json.dumps(res["prefill_step"])[:3000], flush=True)
            save()
        llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
