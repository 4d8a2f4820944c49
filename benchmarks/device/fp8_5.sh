#!/usr/bin/env bash
# Issue 9 (engineer "fp8", session 5), one GPU, HARD bound 75 s. JSON + logs: $OUT/fp8/
# 1. benchmarks/fp8_bs1.py: full Llama-3-8B shape, quantization=fp8 + kv_cache_dtype=fp8, batch-1 decode ms/token
#    vs the fp8-bytes roofline (gpu_e2e.py's formula), the captured forward alone, a kernel table of 10 graph
#    replays; then every fp8 linear on the tensor-core GEMV (fp8_gemv_tc.py), graph recaptured, same numbers;
#    then the same with programmatic dependent launch (OCTAVO_FP8_GEMV_PDL).
#    Meanwhile (background, CPU): Triton compiles of the microbenchmarks' variants into the on-disk cache.
# 2. benchmarks/fp8_gemv_bench.py: one-row GEMV per 8B projection shape, CUDA-core vs tensor-core kernels x tiles,
#    us and fraction of 3.35e12 B/s; best tensor-core tile at 2-16 rows vs _scaled_mm.
# 3. benchmarks/fp8_attn_bench.py --set s5: decode attention, 200 requests x U[1000, 2000] context, fp8 and bf16
#    cache, 1 / 2 / 4 KV heads per program (KV TB/s, error vs fp32); time left: the main ones at 512 requests.
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
T0=$(date +%s)
left() { echo $(( 72 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
( timeout -k 2 30 python benchmarks/fp8_gemv_bench.py --compile-only --workers 6 --budget 28 --out "$R/gemv_compile.json" \
    > "$R/compile.log" 2>&1
  timeout -k 2 16 python benchmarks/fp8_attn_bench.py --set s5 --compile-only --budget 14 --ctx-lo 1000 --ctx-hi 2000 \
    --out "$R/attn_compile.json" >> "$R/compile.log" 2>&1 ) &
BG=$!
echo "== bs1 fp8 8B (graph), default then tensor-core GEMV $(date -u +%T)"
timeout -k 2 44 python benchmarks/fp8_bs1.py --ab tc --out "$R/bs1.json" > "$R/bs1.log" 2>&1
echo "exit $?"; grep -v " INFO \| WARNING " "$R/bs1.log" | tail -70
wait $BG 2>/dev/null; tail -3 "$R/compile.log"
L=$(left)
echo "== GEMV microbench $(date -u +%T) ($L s left)"
if [ "$L" -gt 20 ]; then
  G=$(( L - 14 < 14 ? L - 14 : 14 ))
  timeout -k 2 $(( G + 3 )) python benchmarks/fp8_gemv_bench.py --no-prewarm --budget $G --out "$R/gemv.json" \
    > "$R/gemv.log" 2>&1
  echo "exit $?"; tail -90 "$R/gemv.log"
fi
L=$(left)
echo "== decode attention 200 x U[1000,2000] $(date -u +%T) ($L s left)"
if [ "$L" -gt 5 ]; then
  B=$(( L - 3 < 11 ? L - 3 : 11 ))
  timeout -k 1 $(( B + 2 )) python benchmarks/fp8_attn_bench.py --set s5 --no-prewarm --budget $B --batch 200 \
    --ctx-lo 1000 --ctx-hi 2000 --out "$R/attn.json" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -20 "$R/attn.log"
fi
L=$(left)
if [ "$L" -gt 6 ]; then
  echo "== decode attention 512 x U[1000,2000] $(date -u +%T) ($L s left)"
  timeout -k 1 $(( L - 1 )) python benchmarks/fp8_attn_bench.py --set s5big --no-prewarm --budget $(( L - 3 )) \
    --batch 512 --ctx-lo 1000 --ctx-hi 2000 --out "$R/attn512.json" > "$R/attn512.log" 2>&1
  echo "exit $?"; tail -8 "$R/attn512.log"
fi
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
