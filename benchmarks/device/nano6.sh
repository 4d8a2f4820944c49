#!/usr/bin/env bash
# Issue 17, engineer "nano" (session 6): decode attention launch table + longest-first order, one GPU, hard
# bound 75 s. JSON + logs under $OUT/nano6/.
#   cases.log: tests/kernels/triton_decode_cases.py on CUDA: the table's launches vs float64 and in any request
#      order bitwise equal (Qwen3-0.6B / Llama-3-8B head shapes, contexts to 2,000, bf16 + fp8 caches), the
#      backend (two layers, decode-only and mixed steps) vs the general kernel, a CUDA graph whose replays must
#      recompute the order.
# NANO6_PART=b1: decode_attn.json (launches at the nano / 8B / 8B-fp8 shapes, old vs new:
#   benchmarks/decode_attn_bench.py, 46 s), then the cases in the time left.
# NANO6_PART=b2 (default): the backend cases (16 s; batch 1 ran the others), then e2e_new/, e2e_old/: the nano-vllm workload (gpu_e2e.py qwen3_nanovllm) with the
#   committed table, then with the general kernel (OCTAVO_TRITON_DECODE_KERNEL=0, the launch before session 6).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano6"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
unset OCTAVO_TRITON_DECODE_KERNEL OCTAVO_TRITON_DECODE_LAUNCH OCTAVO_TRITON_DECODE_PACK

PART="${NANO6_PART:-b2}"
cases() {  # cap, then pytest -k expression (empty: all)
  echo "== cases (cap $1 s, -k '${2:-}') $(date -u +%T)"
  timeout -k 2 "$1" python -m pytest -q -p no:cacheprovider -W ignore tests/kernels/triton_decode_cases.py \
    ${2:+-k "$2"} > "$R/cases.log" 2>&1
  echo "cases exit $?"; tail -n 15 "$R/cases.log"
}

if [ "$PART" = b1 ]; then
  echo "== decode attention launches (cap 46 s) $(date -u +%T)"
  timeout -k 2 46 python benchmarks/decode_attn_bench.py --out "$R/decode_attn.json" --budget 40 \
    > "$R/decode_attn.log" 2>&1
  echo "bench exit $?"; tail -n 40 "$R/decode_attn.log"
  cases $(( $(left) ))
  echo "total $(( $(date +%s) - START )) s"; exit 0
fi
cases 16 "backend or switch"

for mode in new old; do
  CAP=$(( $(left) ))
  [ "$mode" = new ] && CAP=$(( CAP / 2 + 1 ))
  echo "== nano-vllm, $mode launch (cap $CAP s) $(date -u +%T)"
  mkdir -p "$R/e2e_$mode"
  if [ "$mode" = old ]; then export OCTAVO_TRITON_DECODE_KERNEL=0; fi
  timeout -k 2 "$CAP" python benchmarks/gpu_e2e.py qwen3_nanovllm --out-dir "$R/e2e_$mode" \
    > "$R/e2e_$mode.log" 2>&1
  echo "$mode exit $?"; grep -h throughput "$R/e2e_$mode.log" | tail -n 2
done
echo "total $(( $(date +%s) - START )) s"
