"""Where a batch-64 CPU decode step of the offline workload goes, per module, in wall and CPU time (issue 18).

Why: the offline 64 x 128/128 goal (3x transformers) is decided by the batch-64 decode step (127 of them) and the
prefill. ``benchmarks/cpu_profile.py`` shows aten ops only; most of a CPU step now runs in C kernels called
through ctypes (attention, norms, rotary, SiLU) and oneDNN (packed linears), which the profiler files under
"python". This wraps the model's modules of one engine (qkv / o / gate_up / down projections, rotary, attention,
the two norms, SiLU-and-mul, the whole forward, the LM head, the sampler) with timers: wall clock and the
process's CPU time (all threads, so at 2 threads a module that keeps both cores busy shows ~2x its wall), summed
per step. Same workload as ``benchmarks/throughput.py``: SmolLM2-135M dense, 64 prompts of ``--prompt-len``
random tokens, greedy, ``ignore_eos``; the steps are timed after every request decodes.

With ``--ab-argmax`` the steps alternate between the platform's C greedy argmax and ``torch.argmax`` (paired
A/B of ``cpu_argmax.py`` in one process; the tokens are the same either way).

    python benchmarks/cpu_offline_split.py --dtype bfloat16 --threads 2 --steps 16
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time

import torch
from cpu_record import run_info, write_record  # benchmarks/ is sys.path[0] when run as a script

MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "rotary_emb", "attn", "input_layernorm",
           "post_attention_layernorm", "act_fn")


class Timers:
    def __init__(self) -> None:
        self.wall = collections.defaultdict(float)
        self.cpu = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.on = False

    def wrap(self, obj, attr: str, key: str) -> None:
        f = getattr(obj, attr)

        def timed(*a, **kw):
            if not self.on:
                return f(*a, **kw)
            t, c = time.perf_counter(), time.process_time()
            out = f(*a, **kw)
            self.wall[key] += time.perf_counter() - t
            self.cpu[key] += time.process_time() - c
            self.calls[key] += 1
            return out

        setattr(obj, attr, timed)


def _gemm_switch(model):
    """``switch(kernel)``: the model's packed bf16 linears and LM head on cpu_bf16_gemm.py's kernel (True) or on
    oneDNN's packed weights (False); both give the same bits, so the steps of a run can alternate."""
    from octavo.plugins.platforms import cpu_packed_linear as cpl

    owners = [(m.quant_method, m.weight) for m in model.modules()
              if isinstance(getattr(m, "quant_method", None), cpl.PackedLinearMethod)]
    owners += [(m.logits_method, m.weight) for m in model.modules()
               if isinstance(getattr(m, "logits_method", None), cpl.PackedLogitsMethod)]
    pairs = [(o._packed, o._packed.gemm, torch.ops.mkldnn._reorder_linear_weight(w, o._packed.rows_hint))
             for o, w in owners if o._packed is not None and o._packed.gemm is not None]
    if not pairs:
        raise SystemExit("--ab-gemm: no linear runs cpu_bf16_gemm.py's kernel here (AMX CPU, or switched off)")

    def switch(kernel: bool) -> None:
        for p, gemm, onednn in pairs:
            p.gemm, p.packed = (gemm, None) if kernel else (None, onednn)

    return switch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ab-argmax", action="store_true", help="alternate the C argmax with torch.argmax per step")
    ap.add_argument("--ab-gemm", action="store_true",
                    help="alternate cpu_bf16_gemm.py's kernel with oneDNN's packed linears per step (same bits)")
    ap.add_argument("--prefill", action="store_true",
                    help="time the prefill steps instead (max_num_batched_tokens 2048, as benchmarks/throughput.py)")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)

    from octavo import LLM, SamplingParams
    from octavo.core.loader import default_model_path
    from octavo.core.sampler import Sampler

    llm = LLM(default_model_path(), dtype=args.dtype, quantization="none", enable_prefix_caching=False,
              max_num_seqs=args.batch, num_threads=args.threads,
              max_num_batched_tokens=max(2048, args.prompt_len * 16))
    eng = llm.llm_engine
    timers = Timers()
    model = next(o for o in gc.get_objects()
                 if isinstance(o, torch.nn.Module) and type(o).__name__.endswith("ForCausalLM"))
    for name, mod in model.named_modules():
        if name.split(".")[-1] in MODULES:
            timers.wrap(mod, "forward", name.split(".")[-1])
    timers.wrap(model, "forward", "FORWARD")
    timers.wrap(model, "compute_logits", "LM head (compute_logits)")
    samplers = [o for o in gc.get_objects() if isinstance(o, Sampler)]
    timers.wrap(Sampler, "__call__", "sampler")  # on the class: calls look special methods up on the type
    c_argmax = [s.greedy_argmax for s in samplers]
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=True)
    for i in range(args.batch):
        eng.add_request(f"r{i}", {"prompt_token_ids": torch.randint(100, 49000, (args.prompt_len,),
                                                                    generator=g).tolist()}, params)
    if args.prefill:
        timers.on = True
        t0, c0, n = time.perf_counter(), time.process_time(), 0
        while len(eng.step()) < args.batch:  # prefill steps until every request has its first token
            n += 1
        n += 1
        wall, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
        timers.on = False
        print(f"{args.dtype}, {args.threads} thread(s): prefill of {args.batch} x {args.prompt_len} in {n} steps: "
              f"wall {wall:.0f} ms, process CPU {cpu:.0f} ms (whole prefill, ms below are totals)")
        for k in sorted(timers.wall, key=lambda k: -timers.wall[k]):
            print(f"  {k:26s} wall {timers.wall[k] * 1e3:8.1f}  CPU {timers.cpu[k] * 1e3:8.1f} ms  ({timers.calls[k]} calls)")
        return 0
    full = 0
    while full < 2:  # prefills done, two untimed decode steps with every request in the batch
        full = full + 1 if len(eng.step()) == args.batch else 0
    ab = {"c": [], "torch": []}
    gemm_ab = _gemm_switch(model) if args.ab_gemm else None
    steps_ab: dict = {"kernel": [], "onednn": []}
    timers.on = True
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(args.steps):
        use_c = not args.ab_argmax or k % 2 == 0
        for s, f in zip(samplers, c_argmax):
            s.greedy_argmax = f if use_c else None
        before = timers.cpu["sampler"]
        if gemm_ab is not None:
            gemm_ab(k % 2 == 0)
        c1 = time.process_time()
        eng.step()
        steps_ab["kernel" if k % 2 == 0 else "onednn"].append(time.process_time() - c1)
        ab["c" if use_c else "torch"].append(timers.cpu["sampler"] - before)
    wall = (time.perf_counter() - t0) / args.steps * 1e3
    cpu = (time.process_time() - c0) / args.steps * 1e3
    timers.on = False
    rows = {k: {"wall_ms": round(timers.wall[k] / args.steps * 1e3, 3), "cpu_ms": round(timers.cpu[k] / args.steps * 1e3, 3),
                "calls": timers.calls[k] // args.steps} for k in sorted(timers.wall, key=lambda k: -timers.wall[k])}
    print(f"{args.dtype}, {args.threads} thread(s), batch {args.batch}, contexts {args.prompt_len + 3}-"
          f"{args.prompt_len + 2 + args.steps}: step wall {wall:.1f} ms, process CPU {cpu:.1f} ms")
    for k, r in rows.items():
        print(f"  {k:26s} wall {r['wall_ms']:7.2f}  CPU {r['cpu_ms']:7.2f} ms/step  ({r['calls']} calls)")
    record = {**run_info(__file__, argv), "load_average": os.getloadavg(), "step_wall_ms": wall, "step_cpu_ms": cpu, "modules": rows}
    if args.ab_argmax:
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in ab.items() if v}
        record["sampler_cpu_ms_median"] = med
        print("  sampler CPU ms/step, median: " + ", ".join(f"{k} argmax {v:.2f}" for k, v in med.items()))
    if gemm_ab is not None:
        gemm_ab(True)
        med = {k: round(sorted(v)[len(v) // 2] * 1e3, 2) for k, v in steps_ab.items() if v}
        record["step_cpu_ms_median_gemm_ab"] = med
        print("  step process CPU ms, median: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
              + f" (steps alternate; {len(steps_ab['kernel'])} each)")
    if args.out:
        write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
