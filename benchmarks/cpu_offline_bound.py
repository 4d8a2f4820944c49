"""The floor of the offline 64 x 128/128 run on this CPU, measured: FMA peaks and torch's GEMM rates (issue 18).

Why: the offline goal asks octavo for 3x transformers' tok/s at the same dtype. Whether that is possible on a
given CPU is arithmetic, not opinion: the run needs a fixed number of FLOPs (the model's linears and LM head
over 8,192 prompt and 8,128 decode rows; attention is ~4 % of it), and

1. **the hardware floor**: those FLOPs at the core's peak multiply-add rate, measured here with a register-only
   loop (12 independent chains of ``vfmadd`` on zmm for float32, ``vdpbf16ps`` for bfloat16 where the CPU has
   AVX512-BF16; no memory traffic, so no GEMM can beat it; each chain starts from its own value, else the
   compiler merges the identical chains into one and the "peak" is 12x too high) times the number of cores;
2. **the bit-exact floor**: octavo's float32 linears must give ``F.linear``'s bits (the fp32 greedy parity tests
   pin exact results; a packed or hand-written fp32 GEMM sums in another order, see cpu_packed_linear.py), so
   they run the same BLAS calls as the peer. Here each linear shape of the run is timed alone with its weight hot
   in cache (``F.linear`` float32; bfloat16 as transformers runs it, plain ``F.linear``, and as octavo runs it:
   oneDNN on a weight packed once, or on AVX512-BF16 CPUs without AMX cpu_bf16_gemm.py's kernel), 1 thread, thread CPU time, best of ``--reps``; summed over the run and divided
   by the cores (perfect scaling). Both floors are optimistic (a real run also streams the weights from memory,
   runs attention, norms, sampling), so a run cannot be faster than either.

With the peer's measured seconds (``--peer-s``; or the ``transformers.elapsed_s`` of a ``benchmarks/throughput.py``
JSON, ``--peer-json``), it prints what 3x needs against each floor.

    python benchmarks/cpu_offline_bound.py --dtypes float32 bfloat16 --peer-json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from cpu_record import run_info, write_record  # benchmarks/ is sys.path[0] when run as a script

# SmolLM2-135M (the embedded model): hidden 576, MLP 1536, 30 layers, 9 q / 3 kv heads of 64, vocab 49,152
HIDDEN, MLP, LAYERS, HEADS, KV_HEADS, HEAD_D, VOCAB = 576, 1536, 30, 9, 3, 64, 49152
LINEARS = {"qkv": (HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_D), "o": (HEADS * HEAD_D, HIDDEN),
           "gate_up": (HIDDEN, 2 * MLP), "down": (MLP, HIDDEN)}  # name: (in, out)
PROMPTS, PROMPT_LEN, NEW_TOKENS, CHUNK = 64, 128, 128, 2048

PEAK_SRC = r"""
#include <immintrin.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* FLOP per thread-CPU second of 12 independent FMA chains (kind 0: float32 zmm vfmadd; 1: bf16 zmm vdpbf16ps) */
double peak(int kind, long iters) {
    double t, dt;
    float s = 0.f;
    if (kind == 0) {
#define DF(k) __m512 a##k = _mm512_set1_ps(1.0f + k * 1e-3f);
        R12(DF)
        const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
        t = now();
        for (long i = 0; i < iters; i++) {
#define FM(k) a##k = _mm512_fmadd_ps(a##k, b, c);
            R12(FM)
        }
        dt = now() - t;
#define SF(k) s += _mm512_reduce_add_ps(a##k);
        R12(SF)
        return (s != 12345.f) * 2.0 * 16 * 12 * iters / dt;
    }
#if defined(__AVX512BF16__)
#define DB(k) __m512 d##k = _mm512_set1_ps(k * 1e-3f);  /* distinct starts: equal chains would be merged */
    R12(DB)
    const __m512bh p = (__m512bh)_mm512_set1_epi16(0x3f80), q = (__m512bh)_mm512_set1_epi16(0x3400);
    t = now();
    for (long i = 0; i < iters; i++) {
#define DPB(k) d##k = _mm512_dpbf16_ps(d##k, p, q);
        R12(DPB)
    }
    dt = now() - t;
#define SB(k) s += _mm512_reduce_add_ps(d##k);
    R12(SB)
    return (s != 12345.f) * 2.0 * 32 * 12 * iters / dt;
#else
    return 0.0;
#endif
}
"""


def peaks() -> dict[str, float]:
    """GFLOP/s of one core: float32 FMA and (AVX512-BF16 CPUs) bf16 dot products, best of 3."""
    from octavo.plugins.quant.cpu_build import cached_library

    state: dict = {}
    lib = cached_library(state, PEAK_SRC, "octavo_fma_peak", ["-O2", "-march=native", "-shared", "-fPIC"],
                         {"peak": ([ctypes.c_int, ctypes.c_long], ctypes.c_double)})
    if lib is None:
        raise SystemExit(f"cannot build the FMA loop (AVX-512 needed): {state.get('why')}")
    out = {"float32": max(lib.peak(0, 20_000_000) for _ in range(3)) / 1e9}
    bf = max(lib.peak(1, 20_000_000) for _ in range(3)) / 1e9
    if bf:
        out["bfloat16"] = bf
    return out


def run_flops() -> dict[str, float]:
    """FLOPs of the offline run: linears over every prompt row and decode row, the LM head over the last prompt
    row of each request and every decode row, causal attention (4 * heads * d per query-key pair)."""
    per_row = 2 * LAYERS * sum(i * o for i, o in LINEARS.values())
    head = 2 * HIDDEN * VOCAB
    prompt_rows, decode_rows = PROMPTS * PROMPT_LEN, PROMPTS * (NEW_TOKENS - 1)
    pair = 4 * HEADS * HEAD_D * LAYERS
    ctx = sum(range(PROMPT_LEN + 1, PROMPT_LEN + NEW_TOKENS))  # decode contexts 129 .. 255
    return {"prefill linears": per_row * prompt_rows, "prefill LM head": head * PROMPTS,
            "prefill attention": pair * PROMPTS * PROMPT_LEN * (PROMPT_LEN + 1) / 2,
            "decode linears": per_row * decode_rows, "decode LM head": head * decode_rows,
            "decode attention": pair * PROMPTS * ctx}


def time_linear(rows: int, k: int, n: int, dtype: torch.dtype, mode: str, reps: int) -> float:
    """Best thread-CPU seconds of one ``rows x k -> n`` linear, weight hot; ``mode``: ``F.linear``, ``onednn``
    (the weight packed once, as cpu_packed_linear.py on AMX CPUs) or ``kernel`` (cpu_bf16_gemm.py)."""
    x, w = torch.randn(rows, k).to(dtype), (torch.randn(n, k) / k ** 0.5).to(dtype)
    if mode == "onednn":
        pw = torch.ops.mkldnn._reorder_linear_weight(w, PROMPTS)  # as octavo packs: rows_hint = max_num_seqs
        call = lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")  # noqa: E731
    elif mode == "kernel":
        from octavo.plugins.platforms import cpu_bf16_gemm

        wp = cpu_bf16_gemm.pack(w)
        call = lambda: cpu_bf16_gemm.linear(x, wp)  # noqa: E731
    else:
        call = lambda: F.linear(x, w)  # noqa: E731
    call()
    best = float("inf")
    for _ in range(reps):
        t = time.thread_time()
        call()
        best = min(best, time.thread_time() - t)
    return best


def gemm_seconds(dtype: torch.dtype, mode: str, reps: int) -> dict[str, float]:
    """1-thread seconds of the run's linears and LM head at the rates measured alone: decode shapes at 64 rows
    (x 127 steps), prefill shapes at 2,048 rows (x 4 chunks), the LM head at 64 rows (x 127 + 1)."""
    steps, chunks = NEW_TOKENS - 1, PROMPTS * PROMPT_LEN // CHUNK
    out = {"decode linears": 0.0, "prefill linears": 0.0}
    for k, n in LINEARS.values():
        out["decode linears"] += LAYERS * steps * time_linear(PROMPTS, k, n, dtype, mode, reps)
        out["prefill linears"] += LAYERS * chunks * time_linear(CHUNK, k, n, dtype, mode, reps)
    out["LM head"] = (steps + 1) * time_linear(PROMPTS, HIDDEN, VOCAB, dtype, mode, reps)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="cores of the goal run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer-s", nargs="*", default=[], help="DTYPE=SECONDS of transformers' timed run")
    ap.add_argument("--peer-json", nargs="*", default=[], help="benchmarks/throughput.py results (per dtype)")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    peer = dict((d, float(s)) for d, s in (p.split("=") for p in args.peer_s))
    for path in args.peer_json:
        with open(path) as f:
            rec = json.load(f)
        for d, r in (rec.get("results") or rec).items():
            if isinstance(r, dict) and "transformers" in r:
                peer[d] = r["transformers"]["elapsed_s"]
    flops = run_flops()
    total = sum(flops.values())
    pk = peaks()
    record = {**run_info(__file__, argv), "load_average": os.getloadavg(), "cpu": torch.backends.cpu.get_cpu_capability(),
              "run_tflop": {k: round(v / 1e12, 4) for k, v in flops.items()}, "peak_gflops_per_core": pk,
              "cores": args.cores, "dtypes": {}}
    print(f"run: {total / 1e12:.3f} TFLOP (" + ", ".join(f"{k} {v / 1e12:.3f}" for k, v in flops.items()) + ")")
    print("peak per core (register-only FMA loop, thread CPU time): "
          + ", ".join(f"{d} {v:.1f} GFLOP/s" for d, v in pk.items()))
    for name in args.dtypes:
        dtype = getattr(torch, name)
        rec: dict = {}
        if name in pk:
            rec["hardware_floor_s"] = total / (pk[name] * 1e9 * args.cores)
        variants = {"F.linear": "F.linear"}
        if dtype is torch.bfloat16:
            from octavo.plugins.platforms import cpu_bf16_gemm

            variants["oneDNN packed"] = "onednn"
            if cpu_bf16_gemm.wanted() and cpu_bf16_gemm.library() is not None:
                variants["cpu_bf16_gemm"] = "kernel"
        for label, mode in variants.items():
            g = gemm_seconds(dtype, mode, args.reps)
            lin = g["decode linears"] + g["prefill linears"] + g["LM head"]
            rec[f"gemm_1thread_s {label}"] = {k: round(v, 3) for k, v in g.items()}
            rec[f"gemm_floor_s {label}"] = lin / args.cores
            lin_flops = flops["decode linears"] + flops["prefill linears"] + flops["decode LM head"] \
                + flops["prefill LM head"]
            print(f"{name} {label}: run's linears alone {lin:.2f} s at 1 thread ({lin_flops / lin / 1e9:.1f} GFLOP/s; "
                  + ", ".join(f"{k} {v:.2f}" for k, v in g.items()) + f") -> {lin / args.cores:.2f} s on {args.cores} cores")
        if "hardware_floor_s" in rec:
            print(f"{name}: hardware floor {rec['hardware_floor_s']:.2f} s ({total / 1e12:.3f} TFLOP at "
                  f"{args.cores} x {pk[name]:.1f} GFLOP/s)")
        if name in peer:
            need = peer[name] / 3
            rec["peer_s"], rec["needed_for_3x_s"] = peer[name], need
            for key in [k for k in rec if k.endswith("floor_s") or k.startswith("gemm_floor")]:
                print(f"  3x transformers ({peer[name]:.2f} s) needs {need:.2f} s: {key} {rec[key]:.2f} s "
                      f"= {rec[key] / need:.2f} of that budget")
        record["dtypes"][name] = rec
    if args.out:
        write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
