#!/usr/bin/env bash
# The GPU test suite (tests/gpu plus the GPU-marked tests of other folders), bounded, log under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/tests"
timeout -k 10 "${GPU_TESTS_LIMIT:-330}" python -m pytest -q -p no:cacheprovider tests/gpu tests/spec_decode/test_spec_gpu.py tests/quant/test_int4_gpu.py tests/quant/test_fp8_triton.py \
  2>&1 | tail -n 40 | tee "$OUT/tests/pytest_tail.txt"
