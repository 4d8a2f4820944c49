"""One batch-1 token's weight stream through the int8-activation kernels, per linear kind, build against build.

Why: a batch-1 decode step reads every weight once from DRAM, in the model's order (per layer qkv, o, gate_up,
down; then the LM head). ``cpu_kernel_bw.py`` times each shape over its own 30 copies, where the small ones (qkv,
o: 20 MB in all) stay in a 32 MB L3 and look faster than they run in a step. This replays the real order on the
embedded SmolLM2 GGUF's own weights (loaded through ``LLM``), calls ``q4a8_gemm_q`` / ``q8a8_gemm_q`` directly
(no Python in the timed calls but the ctypes call), and compares builds of ``plugins/quant/cpu_int8act_src.py``
that differ by ``-D`` macros (``PF_BYTES``: the software prefetch distance, 0 = none; ``PF_HINT``) in alternating
rounds in one process: on a shared machine read the minimums and the medians side by side. The outputs of every build must be
bit-identical (asserted: the builds may differ only in speed).

    python benchmarks/cpu_kernel_stream.py --builds PF_BYTES=0 "" PF_HINT=_MM_HINT_T0 --threads 1 --reps 21
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def build(defines: str):
    from octavo.plugins.quant import cpu_int8act
    from octavo.plugins.quant.cpu_build import compile_shared_library
    from octavo.plugins.quant.cpu_int8act_src import C_SOURCE

    flags = cpu_int8act._flags("native") + [f"-D{d}" for d in defines.split(",") if d]
    lib = ctypes.CDLL(compile_shared_library(C_SOURCE, "octavo_q8act_variant", flags))
    for name, (argtypes, restype) in cpu_int8act._SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


_ACTS: dict = {}


def token_calls(model):
    """``[(kind, n, args)]`` of one batch-1 token in the model's order, on fixed random quantized activations
    (kept alive in the module's ``_ACTS``: the arguments are raw pointers into them)."""
    from octavo.plugins.quant import cpu_int8act

    P, acts, calls = ctypes.c_void_p, _ACTS, []

    def act(k, nibble):
        if (k, nibble) not in acts:
            g = torch.Generator().manual_seed(k)
            acts[(k, nibble)] = cpu_int8act.quantize_activation(torch.randn(1, k, generator=g), nibble=nibble)
        return [P(t.data_ptr()) for t in acts[(k, nibble)]]
    for layer in model.model.layers:
        for kind, m in (("qkv", layer.self_attn.qkv_proj), ("o", layer.self_attn.o_proj),
                        ("gate_up", layer.mlp.gate_up_proj), ("down", layer.mlp.down_proj)):
            n, k = m.w4.shape[0], m.w4.shape[1] * 2
            calls.append((kind, n, (*act(k, True), 1, k, P(m.w4.data_ptr()), P(m.s32.data_ptr()),
                                    P(m.z32.data_ptr()), n)))
    head = model.lm_head
    n, k = head.logits_q8.shape
    xq, d, _ = act(k, False)
    calls.append(("head", n, (xq, d, 1, k, P(head.logits_q8.data_ptr()), P(head.logits_s32.data_ptr()), n)))
    return calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", default=["PF_BYTES=0", ""],
                    help="one build per argument: comma-separated -D macros ('' = the source's defaults)")
    ap.add_argument("--threads", type=int, default=1, help="the kernels' OpenMP threads (1: thread CPU time)")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("OCTAVO_LOG_LEVEL", "warning")
    from octavo import LLM
    from octavo.core.loader import default_model_path

    llm = LLM(default_model_path(), num_threads=args.threads, enable_prefix_caching=False, max_num_seqs=1)
    model = llm.llm_engine.core.executor.driver.runner.model
    if not hasattr(model.model.layers[0].mlp.down_proj, "w4") or not hasattr(model.lm_head, "logits_q8"):
        raise SystemExit("the model's linears are not the int4 / int8 CPU layers (OCTAVO_CPU_INT8_ACT=0?)")
    libs = {b: build(b) for b in args.builds}
    calls = token_calls(model)
    kinds = list(dict.fromkeys(kind for kind, _, _ in calls))
    y = torch.empty(max(n for _, n, _ in calls))
    yp = ctypes.c_void_p(y.data_ptr())
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    times = {b: {k: [] for k in kinds} for b in libs}
    outs = {}
    for r in range(args.reps):
        for b, lib in libs.items():
            acc = dict.fromkeys(kinds, 0.0)
            q4, q8 = lib.q4a8_gemm_q, lib.q8a8_gemm_q
            for kind, n, a in calls:
                t = clock()
                (q8 if kind == "head" else q4)(*a, yp, args.threads)
                acc[kind] += clock() - t
                if r == 0:  # every call's output, compared across builds below
                    outs.setdefault(b, []).append(y[:n].clone())
            for k, v in acc.items():
                times[b][k].append(v * 1e3)
    first = next(iter(outs.values()))
    if not all(torch.equal(a, o) for out in outs.values() for a, o in zip(first, out)):
        raise SystemExit("the builds compute different bits")
    res = {}
    for b in libs:
        med = {k: statistics.median(v) for k, v in times[b].items()}
        low = {k: min(v) for k, v in times[b].items()}
        res[b or "default"] = {"median_ms": med, "min_ms": low, "total_median_ms": sum(med.values()),
                               "total_min_ms": sum(low.values())}
        print(f"{b or 'default':<14} " + "  ".join(f"{k} {med[k]:.3f} ({low[k]:.3f})" for k in kinds)
              + f"  token {sum(med.values()):.3f} ({sum(low.values()):.3f}) ms, median (min)")
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": "python benchmarks/cpu_kernel_stream.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "threads": args.threads, "reps": args.reps, "clock": clock.__name__, "builds": res,
              "loadavg_end": os.getloadavg()}
    print("load", record["loadavg_end"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
