#!/usr/bin/env bash
# Issue 14 device benchmark (nvidia-h100-x1, ~200 s; bound 240 s): LLaVA-1.5-7B shape, load_format="dummy",
# 256 requests with one distinct 336x336 image each, 128 output tokens (ignore_eos), bf16; octavo vs
# transformers generate (first 128 requests, batches of 64, own process) on the same card, plus octavo
# diagnostics (preprocessing ms/image, the same token counts text-only) (<= 155 s).
# Then (<= 2 x 55 s) the tiny Qwen2-VL and Qwen2.5-VL checkpoints of the tests: fp32 greedy vs transformers on
# the GPU path (Triton attention + CUDA graphs: M-RoPE decode positions through the graph runner).
# Writes $OUT/mm/llava7b_throughput.json, $OUT/mm/qwen{2,2.5}vl_check.json (+ logs). Needs no real weights.
set -uo pipefail
cd "$(dirname "$0")/../.."
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed (continuing)"
mkdir -p "$OUT/mm"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
echo "mm: start $(date -u +%T)"
timeout -k 5 155 python benchmarks/device/mm_bench.py --out "$OUT/mm/llava7b_throughput.json" \
  --requests 256 --output-len 128 --tf-requests 128 --tf-batch 64 --budget-s 150 2>&1 | tee "$OUT/mm/log.txt"
echo "mm: benchmark end $(date -u +%T) rc=${PIPESTATUS[0]}"
for v in 2 2.5; do  # each in its own process (each engine sizes the GPU for itself)
  timeout -k 3 55 python benchmarks/device/mm_qwen2vl_check.py --versions "$v" --out "$OUT/mm/qwen${v}vl_check.json" \
    2>&1 | tail -n 30 | tee "$OUT/mm/qwen${v}vl_log.txt"
done
echo "mm: end $(date -u +%T)"
