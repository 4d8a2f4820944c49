#!/usr/bin/env bash
# Issue 9 (engineer "fp8", session 5), GPU batch 2, one GPU, HARD bound 75 s. JSON + logs: $OUT/fp8/
# 1. benchmarks/fp8_bs1.py --ab norm: full Llama-3-8B shape, fp8 + fp8 KV, batch-1 decode with the defaults as
#    committed (CUDA-core GEMV, autotune set with (4, 1024) in place of (32, 512)): ms/token vs roofline, graph
#    forward, kernel table; then the quantizing RMSNorm on 8 and 16 warps at one row (graph recaptured each time).
# 2. the GPU-marked tests: tests/quant/test_fp8_gemv.py (CUDA-core GEMV, new autotune set), test_fp8_gemv_tc.py
#    (tensor-core GEMV vs float64 / CUDA-core GEMV, PDL replayed from a graph), test_fp8_decode_attention.py
#    (decode kernel compiled, pack 1/2/4, vs float64 and through the backend vs the general kernel).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
T0=$(date +%s)
left() { echo $(( 72 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
echo "== bs1 fp8 8B (graph), committed defaults, then norm warps 8 / 16 $(date -u +%T)"
timeout -k 2 40 python benchmarks/fp8_bs1.py --ab norm --out "$R/bs1.json" > "$R/bs1.log" 2>&1
echo "exit $?"; grep -v " INFO \| WARNING " "$R/bs1.log" | tail -45
L=$(left)
echo "== GPU tests $(date -u +%T) ($L s left)"
timeout -k 2 $(( L - 1 )) python -m pytest -q -m gpu -p no:cacheprovider tests/quant/test_fp8_gemv.py \
  tests/quant/test_fp8_gemv_tc.py tests/quant/test_fp8_decode_attention.py > "$R/tests.log" 2>&1
echo "exit $?"; tail -25 "$R/tests.log"
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
