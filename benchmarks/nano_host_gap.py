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
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import JitMisses, gen_timed, make_llm, nanovllm_workload, qwen3_config, warm_up, write_config  # noqa: E402
from nano_gap_probes import (  # noqa: E402
    ALLOC_KEYS,
    CoreProfile,
    ForwardProfile,
    GCPauses,
    PhaseTimers,
    gap_summary,
    phase_targets,
    prefill_host_profile,
    prefill_profile,
)
from nano_run_profile import StepEvents  # noqa: E402

T0 = time.perf_counter()


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
