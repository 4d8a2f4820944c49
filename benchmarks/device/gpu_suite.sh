#!/usr/bin/env bash
# The whole GPU test suite: tests/gpu plus every test marked `gpu` elsewhere, bounded (GPU_SUITE_LIMIT s), verbose
# (a cut-off run still says which tests passed). Log: $OUT/gpu_suite/pytest_<part>.txt. Argument: a (tests/gpu),
# b (the gpu-marked tests elsewhere + spec decode's GPU test) or all (default). GPU_SUITE_K: a pytest -k filter,
# default "not flashinfer" (flashinfer JIT-compiles its kernels on first use: minutes; its contract runs on its own).
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
part=${1:-all}
K="${GPU_SUITE_K:-not flashinfer}"
args=(-v -p no:cacheprovider --durations=15 -rfE -k "$K")
run_a() { python -m pytest "${args[@]}" tests/gpu; }
run_b() { python -m pytest "${args[@]}" tests/spec_decode/test_spec_gpu.py;
          python -m pytest "${args[@]}" --continue-on-collection-errors -m gpu tests --ignore=tests/gpu --ignore=tests/spec_decode/test_spec_gpu.py; }
case $part in
  a) export -f run_a; timeout -k 10 "${GPU_SUITE_LIMIT:-380}" bash -c "$(declare -p args K); $(declare -f run_a); run_a" > "$R/pytest_a.txt" 2>&1 ;;
  b) timeout -k 10 "${GPU_SUITE_LIMIT:-380}" bash -c "$(declare -p args K); $(declare -f run_b); run_b" > "$R/pytest_b.txt" 2>&1 ;;
  *) timeout -k 10 "${GPU_SUITE_LIMIT:-380}" bash -c "$(declare -p args K); $(declare -f run_a run_b); run_a; run_b" > "$R/pytest_all.txt" 2>&1 ;;
esac
echo "pytest rc=$?"; grep -hE " (passed|failed)" "$R"/pytest_*.txt | tail -5; grep -hE "(FAILED|ERROR)" "$R"/pytest_*.txt | head -30
