#!/usr/bin/env bash
# The whole GPU test suite: tests/gpu plus every test marked `gpu` elsewhere, bounded (GPU_SUITE_LIMIT s),
# with the slowest tests listed. Log: $OUT/gpu_suite/pytest.txt
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
timeout -k 10 "${GPU_SUITE_LIMIT:-380}" bash -c 'python -m pytest -q -p no:cacheprovider --durations=15 -rfE tests/gpu tests/spec_decode/test_spec_gpu.py;
  python -m pytest -q -p no:cacheprovider --durations=15 -rfE -m gpu tests --ignore=tests/gpu --ignore=tests/spec_decode/test_spec_gpu.py' > "$R/pytest.txt" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$R/pytest.txt" | tail -5; grep -E "^(FAILED|ERROR)" "$R/pytest.txt" | head -30
