#!/usr/bin/env bash
# Issue 14 device benchmark (nvidia-h100-x1, ~200 s; bound 240 s): LLaVA-1.5-7B shape, load_format="dummy",
# 256 requests with one distinct 336x336 image each, 128 output tokens (ignore_eos), bf16; octavo vs
# transformers generate (first 128 requests, batches of 64, own process) on the same card (<= 175 s).
# Then (<= 55 s) the tiny Qwen2-VL checkpoint of the tests: fp32 greedy vs transformers on the GPU path
# (Triton attention + CUDA graphs: M-RoPE decode positions through the graph runner).
# Writes $OUT/mm/llava7b_throughput.json, $OUT/mm/qwen2vl_check.json (+ logs). Needs no real weights.
set -uo pipefail
cd "$(dirname "$0")/../.."
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed (continuing)"
mkdir -p "$OUT/mm"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "mm: start $(date -u +%T)"
timeout -k 5 175 python benchmarks/device/mm_bench.py --out "$OUT/mm/llava7b_throughput.json" \
  --requests 256 --output-len 128 --tf-requests 128 --tf-batch 64 --budget-s 165 2>&1 | tee "$OUT/mm/log.txt"
echo "mm: benchmark end $(date -u +%T) rc=${PIPESTATUS[0]}"
timeout -k 3 50 python benchmarks/device/mm_qwen2vl_check.py --out "$OUT/mm/qwen2vl_check.json" 2>&1 \
  | tail -n 40 | tee "$OUT/mm/qwen2vl_log.txt"
echo "mm: end $(date -u +%T)"
