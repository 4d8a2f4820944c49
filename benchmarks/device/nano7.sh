#!/usr/bin/env bash
# Issue 17, engineer "nano": the nano-vllm workload (Qwen3-0.6B shape) and the triton backend's decode attention
# on ONE GPU, hard bound 75 s a call. JSON + logs under $OUT/nano7/. One part per call, NANO_PART=<part>:
#   b1  (session 7 batch 1, default) run.json: benchmarks/nano_run_profile.py: one engine, warmed, the workload
#       timed; again with CUDA events per step (GPU time of forward / sampler / idle per step kind) + two
#       profiler windows (kernel tables); then the general attention kernel vs the launch table, same engine
#       (graphs recaptured).
#   ab  (session 7 batch 2) ab.json: nano_run_profile.py --no-events: the workload timed with the defaults, then
#       alternating variants in the same engine (split_4_8, defaults, attn_pdl_off, split_4_8, defaults), graphs
#       recaptured for each: batch 1's one-shot A/B had the first timed run ~7 % slower than later ones.
#   b2  (session 7 batch 2) the attention GPU tests with PDL launches on (the default since session 7):
#       tests/gpu/test_triton_kernels.py (float64 references, decode with/without splits) and the split / backend /
#       graph cases of tests/kernels/triton_decode_cases.py; then gemm_rows.json: the decode step's projections at
#       64-256 rows, cuBLAS vs cuBLASLt vs the roofline (benchmarks/gemm_rows_bench.py).
#   tail  tail.json: the backend's decode step at 8 / 24 / 48 requests with long contexts under split rules
#       (decode_attn_bench.py --plan tail).
#   8b  step8b.json: where a 512-row Llama-3-8B bf16 decode step goes (benchmarks/fp8_step_profile.py --variant
#       bf16, 8 of 32 layers, 220 x 1500/160: the batch and contexts of the 512 x 1000/1000 run's decode waves;
#       batch 1 ran /40, which left one full-batch decode step after the 41 prefill steps).
#   s6a decode_attn.json: decode attention launches at the nano / 8B / 8B-fp8 shapes (decode_attn_bench.py),
#       then tests/kernels/triton_decode_cases.py (session 6 batch 1, was nano6.sh NANO6_PART=b1).
#   s6b the backend's decode cases, then e2e_new/, e2e_old/: gpu_e2e.py qwen3_nanovllm with the table, then with
#       OCTAVO_TRITON_DECODE_KERNEL=0 (session 6 batch 2, was nano6.sh).
#   s5a sampler + q/k norm/rope cases, nano_sampler.py fused vs torch sampler + kernel table, sampler_bench.py
#       (session 5 batch 1, was nano5.sh NANO5_PART=b1).
#   s5b the cases, qwen3_attn_bench.py, nano_sampler.py fused (session 5 batch 2, was nano5.sh).
#   cases  tests/kernels/triton_decode_cases.py on CUDA (the table's launches vs float64, any order bitwise
#       equal, the backend vs the general kernel, CUDA-graph replay), for the time left.
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano7"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
unset OCTAVO_TRITON_DECODE_KERNEL OCTAVO_TRITON_DECODE_LAUNCH
PART="${NANO_PART:-${1:-b1}}"  # or the first argument (run_queue.sh passes arguments, not env)
echo "== part $PART $(date -u +%T)"

cases() {  # cap seconds, log name, pytest files and args...
  local cap=$1 log=$2; shift 2
  echo "== cases $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" python -m pytest -q -p no:cacheprovider -W ignore "$@" > "$R/$log" 2>&1
  echo "cases exit $?"; tail -n 12 "$R/$log"
}
run() {  # cap seconds, log name, command...
  local cap=$1 log=$2; shift 2
  echo "== $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" "$@" > "$R/$log" 2>&1
  echo "exit $?"; grep -v "^\[transformers\]\|^USDT" "$R/$log" | tail -n "${TAIL:-60}"
}
nano_e2e() {  # dir, cap
  mkdir -p "$R/$1"
  run "$2" "$1.log" python benchmarks/gpu_e2e.py qwen3_nanovllm --out-dir "$R/$1"
}

case "$PART" in
  b1)
    run "$(left)" run.log python benchmarks/nano_run_profile.py --out "$R/run.json" --budget-s $(( $(left) - 3 )) ;;
  ab)
    run "$(left)" ab.log python benchmarks/nano_run_profile.py --out "$R/ab.json" --budget-s $(( $(left) - 3 )) \
      --no-events --ab split_4_8 defaults attn_pdl_off split_4_8 defaults ;;
  b2)
    cases 40 cases.log tests/kernels/triton_decode_cases.py tests/gpu/test_triton_kernels.py \
      -k "not triton_decode_cases or split or backend or switch or graph"
    run "$(left)" gemm_rows.log python benchmarks/gemm_rows_bench.py --out "$R/gemm_rows.json" --budget $(( $(left) - 8 )) ;;
  tail)
    run "$(left)" tail.log python benchmarks/decode_attn_bench.py --plan tail --out "$R/tail.json" --budget $(( $(left) - 8 )) ;;
  8b)
    run "$(left)" step8b.log python benchmarks/fp8_step_profile.py --variant bf16 --layers 8 --prompts 220 \
      --in-len 1500 --out-len 160 --out "$R/step8b.json" ;;
  cases)
    cases "$(left)" cases.log tests/kernels/triton_decode_cases.py ;;
  s6a)
    run 46 decode_attn.log python benchmarks/decode_attn_bench.py --out "$R/decode_attn.json" --budget 40
    cases "$(left)" cases.log tests/kernels/triton_decode_cases.py ;;
  s6b)
    cases 16 cases.log tests/kernels/triton_decode_cases.py -k "backend or switch"
    nano_e2e e2e_new $(( $(left) / 2 + 1 ))
    (export OCTAVO_TRITON_DECODE_KERNEL=0; nano_e2e e2e_old "$(left)") ;;
  s5a)
    cases 16 cases.log tests/kernels/fused_sampler_cases.py tests/kernels/qk_norm_rope_cases.py
    CAP=$(( $(left) - 8 ))
    run "$CAP" nano_sampler.log python benchmarks/nano_sampler.py --out "$R/nano_sampler.json" --budget-s $(( CAP - 2 ))
    run "$(left)" sampler_bench.log python benchmarks/sampler_bench.py --out "$R/sampler_bench.json" \
      --qk-out "$R/qk_bench.json" ;;
  s5b)
    cases 16 cases.log tests/kernels/fused_sampler_cases.py tests/kernels/qk_norm_rope_cases.py
    run 14 attn.log python benchmarks/qwen3_attn_bench.py --out "$R/attn.json" --budget 9
    CAP=$(left)
    run "$CAP" nano_sampler.log python benchmarks/nano_sampler.py --out "$R/nano_sampler.json" \
      --budget-s $(( CAP - 2 )) --runs fused ;;
  *) echo "unknown NANO_PART=$PART"; exit 2 ;;
esac
echo "total $(( $(date +%s) - START )) s"
