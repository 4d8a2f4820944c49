#!/usr/bin/env bash
# Issue 17, engineer "nano", session 8: ONE GPU, hard bound 75 s a call. JSON + logs under $OUT/nano8/. One part per
# call, NANO_PART=<part> (or the first argument):
#   b1  (batch 1) gemm_triton.json: the decode step's projections (Qwen3-0.6B, Llama-3-8B, the 0.6B lm_head) at
#       64-256 rows, cuBLAS vs the Triton GEMM's tile / split-K / TMA sweep (benchmarks/gemm_triton_bench.py; every
#       config checked against float64); then the no-rebuild GPU tests of the attention kernels
#       (tests/gpu/test_triton_no_rebuilds.py: varied mixed / decode-only steps build no new variant, match float64).
#   b2  (batch 2) ab.json: nano_run_profile.py --no-events: the warmed nano-vllm workload timed with the defaults
#       (its first timed run: Triton builds inside it are listed with their keys), then gemm_off (cuBLAS projections
#       + the .float() logits copy) / defaults / gemm_off in the same engine, graphs recaptured for each, as the
#       budget allows; then tests/kernels/cuda_gemm_cases.py on CUDA for the time left (the tables' launches and
#       shapes vs float64, split-K repeatable, float32 logits).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano8"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
unset OCTAVO_TRITON_DECODE_KERNEL OCTAVO_TRITON_DECODE_LAUNCH OCTAVO_TRITON_GEMM
PART="${NANO_PART:-${1:-b1}}"
echo "== part $PART $(date -u +%T)"

cases() {  # cap seconds, log name, pytest files and args...
  local cap=$1 log=$2; shift 2
  echo "== cases $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" python -m pytest -q -p no:cacheprovider -W ignore "$@" > "$R/$log" 2>&1
  echo "cases exit $?"; tail -n 15 "$R/$log"
}
run() {  # cap seconds, log name, command...
  local cap=$1 log=$2; shift 2
  echo "== $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" "$@" > "$R/$log" 2>&1
  echo "exit $?"; grep -v "^\[transformers\]\|^USDT" "$R/$log" | tail -n "${TAIL:-60}"
}

case "$PART" in
  b1)
    run 56 gemm_triton.log python benchmarks/gemm_triton_bench.py --out "$R/gemm_triton.json" --budget 32
    cases "$(left)" rebuilds.log tests/gpu/test_triton_no_rebuilds.py ;;
  b2)
    run 61 ab.log python benchmarks/nano_run_profile.py --out "$R/ab.json" --budget-s 58 \
      --no-events --ab gemm_off defaults gemm_off
    cases "$(left)" gemm_cases.log tests/kernels/cuda_gemm_cases.py -k "not silu and not llama_mlp" ;;
  *) echo "unknown NANO_PART=$PART"; exit 2 ;;
esac
echo "total $(( $(date +%s) - START )) s"
