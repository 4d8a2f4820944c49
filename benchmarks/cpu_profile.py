"""Where a CPU decode step goes: phase breakdown of ``LLMEngine.step`` at batch 1, 8 and 64, and the top ops.

Why: issue 18 asks to profile before optimising. Two passes per batch size over the same decode steps:

1. timed (no profiler): light ``perf_counter`` wrappers around the phases of one step -- schedule, step
   build, input building, model forward, lm_head, sampling-batch building, sampler, scheduler update,
   output processing (incremental detokenization) -- so their shares are not inflated by instrumentation;
2. ``torch.profiler`` over a few more steps: self CPU time of every aten op inside the forward, grouped
   (linear, attention, norm, rotary, activation, other). ``forward wall - op time`` is the Python and
   dispatch cost of running the layers one by one (per-layer dispatch).

The wrappers are installed on this process's engine objects only (a benchmark, never the engine's code).
Run ``python benchmarks/cpu_profile.py --dtype float32 --batch-sizes 1 8 64 --steps 32``; repeat with
``--repeats`` for medians (the machine may be shared: compare ratios from one run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch
from cpu_record import isa, run_info, write_record  # benchmarks/ is sys.path[0] when run as a script

PHASES = ("schedule", "step_build", "execute", "build_inputs", "forward", "logits", "sampling_batch", "sampler",
          "update", "output_processing")
_CATEGORIES = (("linear", ("addmm", "aten::mm", "linear", "int4pack", "int8pack", "mkldnn", "onednn")),
               ("attention", ("scaled_dot_product", "index_copy", "aten::index", "masked_fill", "bmm", "softmax")),
               ("norm", ("rms_norm", "layer_norm", "pow", "rsqrt", "mean")),
               ("rotary", ("cos", "sin", "cat", "neg", "slice", "select", "chunk", "split", "narrow")),
               ("activation", ("silu", "gelu", "aten::mul")),
               ("embedding", ("embedding",)))


class Timer:
    """Accumulates wall time per phase through wrappers."""

    def __init__(self) -> None:
        self.total = defaultdict(float)
        self.on = False

    def wrap(self, obj, name: str, phase: str) -> bool:
        fn = getattr(obj, name, None)
        if fn is None:
            return False

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if self.on:
                    self.total[phase] += time.perf_counter() - t0

        setattr(obj, name, timed)
        return True


def install(engine, timer: Timer) -> None:
    import octavo.core.model_runner as mr

    core = engine.core
    timer.wrap(core.scheduler, "schedule", "schedule")
    timer.wrap(core.scheduler, "update", "update")
    if hasattr(core, "steps"):
        timer.wrap(core.steps, "build", "step_build")
    timer.wrap(core.executor, "execute", "execute")
    timer.wrap(engine.frontend, "process_outputs", "output_processing")
    worker = core.executor.driver
    runner = worker.runner
    timer.wrap(runner, "forward", "forward")
    timer.wrap(runner.model, "compute_logits", "logits")
    timer.wrap(mr, "build_step_inputs", "build_inputs")
    timer.wrap(mr, "build_sampling_batch", "sampling_batch")
    sampler = runner.sampler

    class TimedSampler:
        def __call__(self, *a, **kw):
            t0 = time.perf_counter()
            out = sampler(*a, **kw)
            if timer.on:
                timer.total["sampler"] += time.perf_counter() - t0
            return out

    runner.sampler = TimedSampler()


def categorize(name: str) -> str:
    for cat, keys in _CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other"


def run_batch(llm, bs: int, steps: int, prompt_len: int, seed: int) -> dict:
    from octavo import SamplingParams

    engine = llm.llm_engine
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=2 * steps + 8, ignore_eos=True)
    for i in range(bs):
        engine.add_request(f"p{bs}-{seed}-{i}", {"prompt_token_ids": torch.randint(100, 49000, (prompt_len,),
                                                                                    generator=g).tolist()}, params)
    full = 0
    for _ in range(64):  # finish the prefills, then two warm-up decode steps with every request in the batch
        full = full + 1 if len(engine.step()) == bs else 0
        if full == 2:
            break
    timer = engine._cpu_profile_timer
    timer.total.clear()
    timer.on = True
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0
    timer.on = False
    phases = {k: v / steps * 1e3 for k, v in timer.total.items()}
    step_ms = wall / steps * 1e3
    # op-level pass over a few steps
    ops = defaultdict(float)
    prof_steps = max(2, steps // 4)
    timer.total.clear()
    timer.on = True
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(prof_steps):
            engine.step()
    timer.on = False
    fwd_prof = timer.total["forward"] / prof_steps * 1e3
    # device work of the step: forward + lm_head + sampler (the ops below cover all three)
    work_prof = sum(timer.total[k] for k in ("forward", "logits", "sampler")) / prof_steps * 1e3
    top = []
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::") and "int4" not in evt.key and "mkldnn" not in evt.key:
            continue
        ms = evt.self_cpu_time_total / 1e3 / prof_steps
        ops[categorize(evt.key)] += ms
        top.append((ms, evt.key, evt.count // prof_steps))
    top.sort(reverse=True)
    while engine.has_unfinished_requests():  # drain
        engine.abort_request(list(engine._ids))
        engine.step()
    op_ms = sum(ops.values())
    return {"batch_size": bs, "step_ms": step_ms, "tok_s": bs / step_ms * 1e3, "phases_ms": phases,
            "other_ms": step_ms - sum(v for k, v in phases.items() if k in ("schedule", "step_build", "execute",
                                                                               "update", "output_processing")),
            "forward_profiled_ms": fwd_prof, "ops_ms": dict(ops), "op_total_ms": op_ms,
            "dispatch_ms_estimate": max(0.0, work_prof - op_ms),
            "top_ops": [{"op": k, "ms": round(ms, 3), "calls_per_step": c} for ms, k, c in top[:12]]}


def median_record(runs: list[dict]) -> dict:
    """Per-key median over repeats (numbers only; the first run's lists)."""
    out = dict(runs[0])
    for key in ("step_ms", "tok_s", "other_ms", "forward_profiled_ms", "op_total_ms", "dispatch_ms_estimate"):
        out[key] = statistics.median(r[key] for r in runs)
    for key in ("phases_ms", "ops_ms"):
        names = set().union(*(r[key] for r in runs))
        out[key] = {n: statistics.median(r[key].get(n, 0.0) for r in runs) for n in names}
    out["repeats"] = len(runs)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads (default: the engine's)")
    ap.add_argument("--out", default="benchmarks/results/cpu_profile.json")
    args = ap.parse_args(argv)

    from octavo import LLM
    from octavo.core.loader import default_model_path

    kw = {"quantization": args.quantization} if args.quantization else {}
    if args.num_threads:
        kw["num_threads"] = args.num_threads
    llm = LLM(default_model_path(), dtype=args.dtype, enable_prefix_caching=False, max_num_seqs=max(args.batch_sizes),
              enforce_eager=args.enforce_eager, **kw)
    timer = Timer()
    install(llm.llm_engine, timer)
    llm.llm_engine._cpu_profile_timer = timer
    results = []
    for bs in args.batch_sizes:
        runs = [run_batch(llm, bs, args.steps, args.prompt_len, seed) for seed in range(args.repeats)]
        rec = median_record(runs)
        results.append(rec)
        ph = rec["phases_ms"]
        print(f"bs={bs:3d} step {rec['step_ms']:.1f} ms ({rec['tok_s']:.1f} tok/s) | " +
              " ".join(f"{k} {ph.get(k, 0):.2f}" for k in PHASES) + f" | other {rec['other_ms']:.2f}", flush=True)
        print(f"        forward(profiled) {rec['forward_profiled_ms']:.1f} ms = ops {rec['op_total_ms']:.1f} (" +
              ", ".join(f"{k} {v:.1f}" for k, v in sorted(rec["ops_ms"].items(), key=lambda kv: -kv[1])) +
              f"); forward+logits+sampler minus ops (python/dispatch) ~{rec['dispatch_ms_estimate']:.1f}", flush=True)
    record = {"card": f"CPU {torch.get_num_threads()} threads, isa {isa()}", **run_info(__file__, argv),
              "dtype": args.dtype, "quantization": args.quantization, "results": results}
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
