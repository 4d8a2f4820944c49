#!/usr/bin/env bash
# The Qwen2-VL / Qwen2.5-VL GPU greedy checks of mm.sh alone (without the LLaVA throughput run), each bounded.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/mm"
for v in 2 2.5; do
  timeout -k 3 80 python benchmarks/device/mm_qwen2vl_check.py --versions "$v" --out "$OUT/mm/qwen${v}vl_check.json" \
    2>&1 | tail -n 30 | tee "$OUT/mm/qwen${v}vl_log.txt"
done
