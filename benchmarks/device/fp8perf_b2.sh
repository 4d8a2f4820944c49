#!/usr/bin/env bash
# Issue 9, engineer "fp8perf", GPU batch 2 (<= 45 s). Kind: nvidia-h100-x1. Batch 1 (fp8perf.sh) measured fp8
# end to end, the microbench and most parity checks, but its bf16 engine hit OOM (the fp8 engine was not
# released yet) and two GEMV parity checks failed without saying which assertion. This run: the bf16 baseline
# (batch-1 + offline, same workload as batch 1's fp8), then the parity checks with per-assertion messages
# (and the per-token quantization kernel vs torch), then fp8 again only if time is left.
# JSON: $OUT/fp8perf_b2/fp8perf.json, log: $OUT/fp8perf_b2/fp8perf.log
cd "$(dirname "$0")/../.."
FP8PERF_DIR=fp8perf_b2 FP8PERF_SECTIONS=bf16,parity,fp8 FP8PERF_BUDGET=38 FP8PERF_TIMEOUT=42 \
  bash benchmarks/device/fp8perf.sh
