#!/usr/bin/env bash
# Issue 12 (engineer "dist", session 7): TP=2 vs TP=1 batch-1 decode of the Llama-3-8B shape (bf16, dummy weights)
# and where a TP=2 layer's time goes. NEEDS BOTH GPUs (2x H100 or 2x H200), runs alone. JSON + logs to
# $OUT/dist/dist7/. NVLink multicast stays off (recorded, never changed). Every step has a hard cap (<= 120 s total).
#   DIST7_PARTS (default "ab tp1 test"; run in the order ab, tp1, test):
#   ab   (<= 50 s) one TP=2 engine (mp, async) in the defaults (since session 7 batch 2: the row-parallel GEMV pushes
#        its output, cuda_allreduce_gemv.py, after its start check): batch-1 ms/token, the decode graph replayed
#        alone, its per-layer kernel trace (benchmarks/gpu_tp_profile.py graph_layer_trace) and a trace of real decode
#        steps; then re-captured in the same engine per mode of DIST7_TP2_MODES with graph, trace and ms/token
#        (default: the defaults again = the like-for-like row (the first measurement after start reads slower),
#        push off = the A/B, push with PDL off = true per-kernel times; +w8 = an 8-warp fused norm); last the
#        graph with no all-reduce at all (in-step cost, PDL off as the last mode)
#   tp1  (<= 30 s) TP=1 (uni, async) in the defaults, then re-captured in the defaults: the denominators
#   test (<= 35 s) 2 GPUs: the pushing GEMV + fused norm / receive-only kernel == NCCL + unfused norm, bitwise; a
#        layer's kernel chain (incl. the gate/up+SiLU GEMV's prefetched first tiles) with PDL == without
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/dist/dist7"
mkdir -p "$R"
PARTS=" ${DIST7_PARTS:-ab tp1 test} "
MODES="${DIST7_TP2_MODES:-fused+pdl+silu+push fused+pdl+silu fused+silu+push}"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short > "$R/tree_status.txt" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpus.csv" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.device_count())" \
  > "$R/versions.txt" 2>&1
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-<unset>} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-<unset>}" \
  > "$R/env.txt"
cat "$R/gpus.csv" "$R/versions.txt" "$R/env.txt"
echo "warm-up: every engine times 16 untimed tokens (Triton compile, autotune, graph capture) before its timed runs" \
  > "$R/warmup.txt"

step() {  # step NAME CAP_S ENV... CMD...: run one bounded config, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== dist7: $name (cap ${cap}s) $(date -u +%T)"
  local t0=$SECONDS
  timeout -k 3 "$cap" env "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc in $((SECONDS - t0)) s" | tee -a "$R/exits.txt"
  grep -v " INFO " "$R/$name.log" | grep -v "^\[transformers\]" | grep -v '^{' | tail -8 | cut -c1-400
  grep "fusion\|all-reduce and all-gather\|Fused GPU kernels installed\|PDL\|GEMV" "$R/$name.log" | head -8 | cut -c1-300
  sleep 1  # a killed run's worker processes exit within ~1 s (orphan check) and free their GPUs
}
has() { [[ $PARTS == *" $1 "* ]]; }

TP="python3 benchmarks/gpu_tp.py --shape 8b --copy-rate 3.01e12 --out-dir $R --prompts 0 --max-num-seqs 8"
# shellcheck disable=SC2086
has ab && step 8b_tp2_ab 50 $TP --one 2 --tag ab --async-modes on --graph-replay --layer-trace \
  --ar-modes $MODES --graph-replay-no-allreduce
has tp1 && step 8b_tp1 30 $TP --one 1 --async-modes on --graph-replay --layer-trace --ar-modes custom+pdl+silu
has test && step gpu_test 35 python3 -u -m pytest -v -x tests/gpu/test_gemv_push_gpu.py tests/gpu/test_pdl_gpu.py \
  -k "gemv_push or pdl_chain"
python3 benchmarks/device/dist7_summary.py "$R"
