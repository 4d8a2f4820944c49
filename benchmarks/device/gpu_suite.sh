#!/usr/bin/env bash
# The whole GPU test suite: tests/gpu plus every test marked `gpu` elsewhere, bounded (GPU_SUITE_LIMIT s),
# with the slowest tests listed. Log: $OUT/gpu_suite/pytest.txt. GPU_SUITE_K: a pytest -k filter, default
# "not flashinfer" (flashinfer JIT-compiles its kernels on first use: minutes; its contract runs on its own).
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
export K="${GPU_SUITE_K:-not flashinfer}"
timeout -k 10 "${GPU_SUITE_LIMIT:-380}" bash -c 'python -m pytest -q -p no:cacheprovider --durations=15 -rfE -k "$K" tests/gpu tests/spec_decode/test_spec_gpu.py;
  python -m pytest -q -p no:cacheprovider --durations=15 -rfE -k "$K" -m gpu tests --ignore=tests/gpu --ignore=tests/spec_decode/test_spec_gpu.py' > "$R/pytest.txt" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$R/pytest.txt" | tail -5; grep -E "^(FAILED|ERROR)" "$R/pytest.txt" | head -30
