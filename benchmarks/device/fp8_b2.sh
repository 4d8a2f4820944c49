#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), GPU batch 2, optional (<= 58 s, one GPU): where a 512-row fp8 + fp8-KV decode step goes
# now that the decode kernel is the default for fp8 caches (batch 1's step profile timed out while loading).
# benchmarks/fp8_step_profile.py --variant fp8: 8B shape, 8 layers, quantization=fp8 + kv_cache_dtype=fp8,
# 512 x 1000/80, max_num_seqs 512, async scheduling off (per-step host / GPU split), batch-1 GEMV off (it only
# serves one-row steps and its load-time tuning costs seconds): per-step GPU time by kind, kernel tables of
# decode steps at 512 rows (graph, eager) and of one mixed step. JSON + log: $OUT/fp8/
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
echo "== fp8 step profile (decode kernel default) $(date -u +%T)"
OCTAVO_DISABLE_PROGRESS=1 OCTAVO_FP8_GEMV_MAX_M=0 timeout -k 2 56 python benchmarks/fp8_step_profile.py --variant fp8 \
  --out-len 80 --out "$R/step_fp8.json" > "$R/step_fp8.log" 2>&1
echo "exit $? $(date -u +%T)"; grep -v " INFO \| WARNING " "$R/step_fp8.log" | tail -60
