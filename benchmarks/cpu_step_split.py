"""Where a batch-1 CPU decode step goes: the 4-bit linears, the int8 head, the rest of the forward, and the engine.

Why: issue 18 asks to profile the remaining milliseconds of the batch-1 step (kernels, attention, norms, LM head,
Python overhead) before optimizing further. This runs the embedded SmolLM2 GGUF through ``LLM`` (eager, or the
compiled decode step with ``--compiled``: ``OCTAVO_CPU_COMPILE=1``), decodes ``--tokens`` greedy tokens after a
64-token prompt under ``torch.profiler`` (CPU activities only), and splits the decode time per token into:

- ``int4_linears``: the GGUF's 4-bit layer calls (``octavo_cpu::int4_a8`` ops, or the eager kernel calls);
- ``int8_head``: the LM head (``octavo_cpu::int8_a8``);
- ``forward_rest``: the model forward minus those (norms, rotary, attention, residuals, dispatch);
- ``engine``: everything else in the step (scheduling, inputs, sampling, detokenization, Python).

Without ``--profile`` eager runs count the kernels' thread CPU time (``eager_*_cpu_ms_per_token``, exact at 1
thread) against the process CPU time per token: on a shared machine read those CPU times, not the wall times.
``--profile`` adds torch.profiler's op table (wall time inside each op, inflated by the profiler itself; the only
split available for the compiled step, whose ops are called from the graph).

    python benchmarks/cpu_step_split.py --threads 1 --tokens 32 [--compiled]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compiled", action="store_true", help="OCTAVO_CPU_COMPILE=1 (the compiled decode step)")
    ap.add_argument("--fused", action="store_true",
                    help="OCTAVO_CPU_FUSED_DECODE=1 (the decoder stack in one C call; its thread CPU time is "
                         "reported as fused_stack_cpu_ms_per_token, the LM head as eager_int8_head_cpu_ms_per_token)")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler op table (its own overhead inflates every op; off: CPU-time counters only)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from octavo import LLM, SamplingParams
    from octavo.core.loader import default_model_path

    os.environ["OCTAVO_CPU_COMPILE"] = "1" if args.compiled else "0"
    os.environ["OCTAVO_CPU_FUSED_DECODE"] = "1" if args.fused else "0"
    fused_cpu = [0.0]
    if args.fused:
        from octavo.plugins.platforms import cpu_fused_decode

        def timed(self, inputs, _f=cpu_fused_decode.CpuFusedDecodeRunner.maybe_run):
            c = time.thread_time()
            y = _f(self, inputs)
            fused_cpu[0] += time.thread_time() - c
            return y
        cpu_fused_decode.CpuFusedDecodeRunner.maybe_run = timed
    llm = LLM(default_model_path(), dtype=args.dtype, num_threads=args.threads, enable_prefix_caching=False,
              max_num_seqs=1)
    prompt = {"prompt_token_ids": list(range(1000, 1064))}

    def run(n):
        sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        llm.generate([prompt], sp, use_tqdm=False)

    kernel_cpu = {"octavo_cpu::int4_a8": 0.0, "octavo_cpu::int8_a8": 0.0}
    if not args.compiled:
        # eager calls the kernels directly: name them as the compiled ops, and count their CPU time (thread time:
        # exact with 1 thread, the calling thread's share otherwise)
        from octavo.plugins.quant import cpu_int8act

        for fn, name in (("int4_linear", "octavo_cpu::int4_a8"), ("int8_linear", "octavo_cpu::int8_a8")):
            def wrapped(*a, _f=getattr(cpu_int8act, fn), _n=name, **kw):
                if not args.profile:
                    c = time.thread_time()
                    y = _f(*a, **kw)
                    kernel_cpu[_n] += time.thread_time() - c
                    return y
                with torch.profiler.record_function(_n):
                    return _f(*a, **kw)
            setattr(cpu_int8act, fn, wrapped)
    run(4)  # warm-up (compiles the step when --compiled, unless inductor's cache has it)
    t0, c0 = time.perf_counter(), time.process_time()
    run(1)
    prefill_wall, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.profile else None
    with prof or contextlib.nullcontext():
        kernel_cpu.update({k: 0.0 for k in kernel_cpu})
        fused_cpu[0] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        run(args.tokens + 1)
        wall, cpu = time.perf_counter() - t0 - prefill_wall, time.process_time() - c0 - prefill_cpu
    by_name = {e.key: e for e in prof.key_averages()} if prof else {}

    def total_ms(*names):
        return sum(by_name[n].cpu_time_total for n in names if n in by_name) / 1e3

    per_tok = 1.0 / args.tokens
    int4 = total_ms("octavo_cpu::int4_a8")
    head = total_ms("octavo_cpu::int8_a8")
    top = sorted(by_name.values(), key=lambda e: -e.self_cpu_time_total)[:15]
    res = {"compiled": args.compiled, "fused": args.fused, "fused_stack_cpu_ms_per_token": fused_cpu[0] * 1e3 * per_tok,
           "threads": args.threads, "dtype": args.dtype, "tokens": args.tokens,
           "decode_wall_ms_per_token": wall * 1e3 * per_tok, "decode_cpu_ms_per_token": cpu * 1e3 * per_tok,
           "int4_linears_ms_per_token": int4 * per_tok, "int8_head_ms_per_token": head * per_tok,
           "eager_int4_cpu_ms_per_token": kernel_cpu["octavo_cpu::int4_a8"] * 1e3 * per_tok,
           "eager_int8_head_cpu_ms_per_token": kernel_cpu["octavo_cpu::int8_a8"] * 1e3 * per_tok,
           "int4_calls_per_token": by_name["octavo_cpu::int4_a8"].count * per_tok if "octavo_cpu::int4_a8" in by_name
           else 0, "top_self_cpu_ms_per_token": {e.key: e.self_cpu_time_total / 1e3 * per_tok for e in top},
           "loadavg": os.getloadavg()}
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    llm.shutdown() if hasattr(llm, "shutdown") else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
