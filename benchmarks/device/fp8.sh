#!/usr/bin/env bash
# Issue 9 (engineer "fp8"): where the fp8 + fp8-KV big-batch step of the 8B shape goes. One GPU, HARD bound 75 s.
# 1. benchmarks/fp8_step_profile.py --variant fp8: Llama-3-8B shape with 8 layers, quantization=fp8 +
#    kv_cache_dtype=fp8, 512 x 1000/100, max_num_seqs 512: per-step GPU forward / sampling / host split by step
#    kind, and torch.profiler kernel tables of decode steps at 512 rows (graph replay and eager).
# 2. benchmarks/fp8_attn_bench.py: one attention layer's decode at 512 requests x U[1000, 2000] context, fp8 and
#    bf16 cache: today's kernel at 4 launch configs vs the decode kernel (_triton_decode.py) variants (KV TB/s,
#    error vs fp32); one 8B layer's linears at 512 and 8192 rows, bf16 vs fp8 _scaled_mm.
# 3. the fp8 step profile again with OCTAVO_TRITON_DECODE_KERNEL=1 (the decode kernel inside the CUDA graphs).
# 4. (time left) the same step profile, bf16 weights + bf16 cache.
# JSON + logs: $OUT/fp8/
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
T0=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
echo "== fp8 step profile (fp8 + fp8 KV) $(date -u +%T)"
timeout -k 2 30 python benchmarks/fp8_step_profile.py --variant fp8 --out "$R/step_fp8.json" > "$R/step_fp8.log" 2>&1
echo "exit $?"; grep -v " INFO \| WARNING " "$R/step_fp8.log" | tail -50
echo "== attention / linears microbench $(date -u +%T) ($(left) s left)"
timeout -k 2 24 python benchmarks/fp8_attn_bench.py --out "$R/attn.json" --budget 20 > "$R/attn.log" 2>&1
echo "exit $?"; tail -30 "$R/attn.log"
L=$(left)
if [ "$L" -gt 10 ]; then
  echo "== fp8 step profile, decode kernel on $(date -u +%T) ($L s left)"
  OCTAVO_TRITON_DECODE_KERNEL=1 timeout -k 2 $(( L < 30 ? L - 1 : 30 )) python benchmarks/fp8_step_profile.py \
    --variant fp8 --out "$R/step_fp8_decode_kernel.json" > "$R/step_fp8_decode_kernel.log" 2>&1
  echo "exit $?"; grep -v " INFO \| WARNING " "$R/step_fp8_decode_kernel.log" | tail -40
fi
L=$(left)
if [ "$L" -gt 15 ]; then
  echo "== bf16 step profile $(date -u +%T) ($L s left)"
  timeout -k 2 $(( L - 2 )) python benchmarks/fp8_step_profile.py --variant bf16 --out "$R/step_bf16.json" \
    > "$R/step_bf16.log" 2>&1
  echo "exit $?"; grep -v " INFO \| WARNING " "$R/step_bf16.log" | tail -40
fi
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
