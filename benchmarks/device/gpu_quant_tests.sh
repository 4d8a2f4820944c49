#!/usr/bin/env bash
# The quantization GPU tests alone (int4 packing fallback, fused fp8 quantization), bounded.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/qt"
timeout -k 5 120 python -m pytest -q -p no:cacheprovider tests/quant/test_int4_gpu.py tests/quant/test_fp8_triton.py \
  2>&1 | tail -n 30 | tee "$OUT/qt/pytest_tail.txt"
