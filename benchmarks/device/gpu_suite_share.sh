#!/usr/bin/env bash
# Part a of the GPU suite (tests/gpu) split by file across GPUs: $1 = share index K, $2 = number of shares N; this
# lane runs every N-th file starting at K (sorted names), bounded by GPU_SUITE_LIMIT s, verbose, so a cut-off run
# still says which tests passed. Log: $OUT/gpu_suite/pytest_a<K>of<N>.txt. Part b stays in gpu_suite.sh b.
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
k=${1:?share index}; n=${2:?number of shares}
mapfile -t files < <(ls tests/gpu/test_*.py | sort | awk -v k="$k" -v n="$n" '(NR - 1) % n == k')
log="$R/pytest_a${k}of${n}.txt"
timeout -k 10 "${GPU_SUITE_LIMIT:-380}" python -m pytest -v -p no:cacheprovider --durations=15 -rfE \
  -k "${GPU_SUITE_K:-not flashinfer}" "${files[@]}" > "$log" 2>&1
echo "pytest rc=$? files: ${files[*]}"; grep -hE " (passed|failed)" "$log" | tail -2; grep -hE "(FAILED|ERROR)" "$log" | head -30
