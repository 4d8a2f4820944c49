#!/usr/bin/env bash
# The GPU suite in bounded shares, one per one-GPU lane, so the whole suite runs in one batch (session 11's part b
# was cut by its 200 s cap and never reached its last test). Log: $OUT/gpu_suite/pytest_<share>*.txt (verbose: a
# cut-off run still says which tests passed; every test >= 1 s is listed, to rebalance the shares).
#   a1 | a2 | a3   tests/gpu by file (session 11 H100 times: a1 ~120 s, a2 ~135 s, a3 ~120 s); a tests/gpu file that
#                  no share names runs in a2, so a new file is never left out
#   b1             tests/spec_decode/test_spec_gpu.py (CUDA-only, not gpu-marked) + tests/kernels' gpu-marked tests
#   b2             the gpu-marked tests of tests/lora and tests/quant, then those everywhere else outside tests/gpu
#                  (tests/structured/test_apply_device.py is gpu-marked since session 12: before, no part ran it)
#   b3             the grammar worker's GPU test alone: it waits up to 90 s for the worker's start (its START_S), so
#                  it gets its own per-test limit (GPU_SUITE_WORKER_LIMIT, 125 s), thread method: a wait that SIGALRM
#                  cannot break is still cut, with every thread's stack in the log (faulthandler dump at 110 s too)
#   b2r            b2's second half alone (session 14: b2's lora+quant half used its whole bound on an H100)
#   m2             the 2-GPU tests of tests/gpu (a one-GPU lane skips them): one-shot all-reduce and TP=2 custom
#                  all-reduce vs NCCL, the GEMV push vs NCCL, TP=2 shard-argmax head graphs. Needs a lane with 2 GPUs
#                  (run_lanes.sh "@0,1 m2=...gpu_suite_share.sh+m2:180"); not part of gpu_suite.sh a|b|all
#   K N            old form (numbers): every N-th file of tests/gpu from the K-th
# a1..a3 = gpu_suite.sh a; b1..b3 = gpu_suite.sh b. Bound: GPU_SUITE_LIMIT s for the whole share (default 170; queue
# it at 180). Per test: GPU_SUITE_TEST_LIMIT s (default 120; a1 190: its float64 contract test took 105 s) through
# pytest-timeout where installed (the device venv has 2.5.0), else only the share's bound.
set -uo pipefail
cd "$(dirname "$0")/../.."
R="$OUT/gpu_suite"; mkdir -p "$R"
share=${1:?share: a1 a2 a3 b1 b2 b2r b3 m2, or K N}
limit=${GPU_SUITE_LIMIT:-170}
end=$(( $(date +%s) + limit ))
args=(-v -p no:cacheprovider -rfE --durations=0 --durations-min=1.0 -k "${GPU_SUITE_K:-not flashinfer}")
per_test=${GPU_SUITE_TEST_LIMIT:-120}
[ "$share" = a1 ] && per_test=${GPU_SUITE_TEST_LIMIT:-190}
has_timeout=0; python -c "import pytest_timeout" 2>/dev/null && has_timeout=1
run() {  # log-suffix [timeout-method] -- pytest arguments: one pytest under what is left of the share's bound
  local log="$R/pytest_$1.txt" method=$2; shift 3
  local left=$(( end - $(date +%s) )); extra=()
  [ "$left" -le 5 ] && { echo "$log: not run (share bound reached)" | tee "$log"; return; }
  [ "$has_timeout" = 1 ] && extra=(--timeout="$per_test" --timeout-method="$method")
  echo "=== $(date -u +%T) pytest ${extra[*]} $* (left ${left}s)" > "$log"
  timeout -k 10 "$left" python -m pytest "${args[@]}" "${extra[@]}" "$@" >> "$log" 2>&1
  echo "$log: rc=$? $(grep -hE "=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s" "$log" | tail -1)"
}
a1=(tests/gpu/test_triton_contract.py)
a3=(tests/gpu/test_cuda_gemm_gpu.py tests/gpu/test_cuda_platform.py tests/gpu/test_gemv_push_gpu.py
    tests/gpu/test_graph_head_gpu.py tests/gpu/test_pdl_gpu.py tests/gpu/test_tp_allreduce_gpu.py)
worker=tests/structured/test_grammar_worker_gpu.py
case $share in
  a1|a3) declare -n named=$share; files=()  # a named file that is gone is left out (pytest would stop on it)
      for f in "${named[@]}"; do [ -f "$f" ] && files+=("$f") || echo "$f: not in this tree"; done
      [ ${#files[@]} -gt 0 ] && run "$share" signal -- "${files[@]}" ;;
  a2) mapfile -t files < <(ls tests/gpu/test_*.py | grep -vxF -f <(printf '%s\n' "${a1[@]}" "${a3[@]}"))
      run a2 signal -- "${files[@]}" ;;
  b1) run b1_spec signal -- tests/spec_decode/test_spec_gpu.py
      run b1 signal -- -m gpu tests/kernels ;;
  b2) run b2 signal -- -m gpu tests/lora tests/quant
      # collection errors are modules the device cannot import (the embedded SmolLM2 at import; jsonschema until
      # .carry brought it in session 12): none holds a gpu-marked test (checked on CPU); -rfE names them at the end
      run b2_rest signal -- --continue-on-collection-errors -m gpu tests --ignore=tests/gpu --ignore=tests/kernels \
        --ignore=tests/lora --ignore=tests/quant --ignore=tests/spec_decode/test_spec_gpu.py --ignore="$worker" ;;
  b2r) run b2_rest signal -- --continue-on-collection-errors -m gpu tests --ignore=tests/gpu --ignore=tests/kernels \
        --ignore=tests/lora --ignore=tests/quant --ignore=tests/spec_decode/test_spec_gpu.py --ignore="$worker" ;;
  m2) run m2 signal -- tests/gpu/test_tp_allreduce_gpu.py tests/gpu/test_gemv_push_gpu.py tests/gpu/test_graph_head_gpu.py \
        -k "equals_nccl or tp2" ;;
  b3) per_test=${GPU_SUITE_WORKER_LIMIT:-125} run b3_worker thread -- -o faulthandler_timeout=110 "$worker" ;;
  [0-9]*) n=${2:?number of shares}
      mapfile -t files < <(ls tests/gpu/test_*.py | sort | awk -v k="$share" -v n="$n" '(NR - 1) % n == k')
      run "a${share}of$n" signal -- "${files[@]}" ;;
  *) echo "unknown share '$share' (a1 a2 a3 b1 b2 b2r b3 m2, or K N)"; exit 2 ;;
esac
tag=$share; [ -n "${2:-}" ] && tag="a${share}of$2"
grep -hE "^(FAILED|ERROR)|Timeout" "$R"/pytest_"$tag"*.txt | head -30
