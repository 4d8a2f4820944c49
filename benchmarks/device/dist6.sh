#!/usr/bin/env bash
# Issue 12 (engineer "dist"): tensor parallelism on 2+ GPUs, the one script (parts) that replaced dist.sh, dist2.sh
# and dist5.sh. NEEDS BOTH GPUs (2x H100 or 2x H200; part 70b: 4), runs alone. Runs from the repo root; JSON + logs
# to $OUT/dist6/. Dummy-weight Llama-3 shapes, bf16. NVLink multicast stays off: NCCL_NVLS_ENABLE /
# TORCH_SYMM_MEM_DISABLE_MULTICAST are recorded, never changed. Every step has a hard cap.
#   DIST6_PARTS (space separated, default "test ab tp1": <= 132 s of caps, ~110 s expected; they run in the order
#   ar, ab, tp1, test, nccl, goal, 70b: the measurements before the test, so a hanging protocol costs only the test):
#   test  (<= 45 s) the 2-GPU test: one-shot all-reduce == NCCL bitwise (eager + graphs), its all-gather == NCCL's,
#         the all-reduce + add + RMSNorm kernel == NCCL's sum + the unfused norm kernel bitwise (eager + graph), all
#         also with PDL launches; tests/gpu/test_pdl_gpu.py: a layer's kernel chain with PDL == without, bitwise
#   ab    (<= 55 s) one TP=2 engine (mp, async) in the defaults (one-shot all-reduce fused into the RMSNorms,
#         programmatic dependent launches, gate/up + SiLU GEMV): batch-1 ms/token, the decode graph replayed alone,
#         its kernel table; then re-captured in the same engine with the LL all-reduce on (fused+pdl+silu+ll,
#         cuda_allreduce_ll.py) and with everything off (custom): the A/B of the same call, tables and tokens
#   tp1   (<= 32 s) TP=1 (uni, async) in the defaults (PDL + SiLU GEMV), then re-captured with both off (custom):
#         the like-for-like denominator
#   ar    (<= 20 s) all-reduce microbench: NCCL vs symm_mem vs one-shot, 8 KiB..1 MiB, eager and in a graph
#   nccl  (<= 40 s) TP=2 NCCL only, then no all-reduce at all (the all-reduces' in-step cost)
#   goal  (<= 118 s) 512 x 1000/1000 TP=2 throughput (temperature 1, async; TP=1: the lead's e2e_8b.sh)
#   70b   (<= 150 s, 4 GPUs) Llama-3-70B shape TP=4 batch-1 decode vs its roofline
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/dist6"
mkdir -p "$R"
PARTS=" ${DIST6_PARTS:-test ab tp1} "
FUSE="${DIST6_FUSE:-1}"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short > "$R/tree_status.txt" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpus.csv" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.device_count())" \
  > "$R/versions.txt" 2>&1
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-<unset>} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-<unset>}" \
  > "$R/env.txt"
cat "$R/gpus.csv" "$R/versions.txt" "$R/env.txt"

step() {  # step NAME CAP_S ENV... CMD...: run one bounded config, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== dist6: $name (cap ${cap}s) $(date -u +%T)"
  local t0=$SECONDS
  timeout -k 3 "$cap" env "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc in $((SECONDS - t0)) s" | tee -a "$R/exits.txt"
  grep -v " INFO " "$R/$name.log" | grep -v "^\[transformers\]" | grep -v '^{' | tail -8 | cut -c1-400
  grep "fusion\|all-reduce and all-gather\|Fused GPU kernels installed\|PDL" "$R/$name.log" | head -6 | cut -c1-300
  sleep 1  # a killed run's worker processes exit within ~1 s (orphan check) and free their GPUs
}
has() { [[ $PARTS == *" $1 "* ]]; }

TP="python3 benchmarks/gpu_tp.py --shape 8b --copy-rate 3.01e12 --out-dir $R --prompts 0 --max-num-seqs 8"
has ar && step allreduce 20 python3 benchmarks/gpu_allreduce.py --world 2 --out "$R/allreduce.json"
# batch 1 of session 6: re-enabling the fusion in a live engine after a capture without it (mode "fused" after
# "custom") stalled until the cap; the engines now start in the defaults and only switch LL on, then everything off
has ab && step 8b_tp2_ab 55 $TP --one 2 --tag ab --async-modes on --graph-replay --kernel-table \
  --ar-modes fused+pdl+silu+ll custom
has tp1 && step 8b_tp1 32 $TP --one 1 --async-modes on --graph-replay --kernel-table --ar-modes custom
# the 2-GPU test after the measurements: a protocol bug that hangs costs only this step (its ranks exit with pytest)
has test && step gpu_test 45 python3 -u -m pytest -v -x tests/gpu/test_pdl_gpu.py tests/gpu/test_tp_allreduce_gpu.py -k "equals_nccl or pdl_chain"
has nccl && step 8b_tp2_nccl 40 OCTAVO_TP_ALLREDUCE=nccl $TP --one 2 --tag nccl --async-modes on --graph-replay \
  --kernel-table --graph-replay-no-allreduce
has goal && step 8b_tp2_goal 118 OCTAVO_TP_ALLREDUCE=custom OCTAVO_TP_ALLREDUCE_FUSE_NORM=$FUSE $TP --one 2 --tag goal \
  --async-modes on --prompts 512 --in-len 1000 --out-len 1000 --max-num-seqs 512 --temperature 1
has 70b && step 70b_tp4 150 python3 benchmarks/gpu_tp.py --shape 70b --tp 4 --prompts 0 --max-num-seqs 8 \
  --copy-rate 3.01e12 --out-dir "$R" --async-modes on --graph-replay

python3 benchmarks/device/dist6_summary.py "$R"
