#!/usr/bin/env bash
# The GPU suite's tail when gpu_suite.sh was cut by its cap: $1 = a | b, runs the files from where that part stopped.
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
args=(-v -p no:cacheprovider -rfE -k "${GPU_SUITE_K:-not flashinfer}")
if [ "$1" = a ]; then
  timeout -k 5 "${LIMIT:-140}" python -m pytest "${args[@]}" tests/gpu/test_triton_contract.py tests/gpu/test_triton_kernels.py tests/gpu/test_triton_no_rebuilds.py > "$R/rest_a.txt" 2>&1
else
  timeout -k 5 "${LIMIT:-140}" python -m pytest "${args[@]}" --continue-on-collection-errors -m gpu tests/quant/test_fp8_prefetch.py tests/quant/test_fp8_silu_gemv.py tests/quant/test_fp8_smallm.py tests/quant/test_fp8_triton.py tests/quant/test_int4_gpu.py tests/reliability tests/structured tests/unit > "$R/rest_b.txt" 2>&1
fi
echo "rc=$?"; tail -3 "$R"/rest_*.txt
