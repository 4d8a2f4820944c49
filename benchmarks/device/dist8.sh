#!/usr/bin/env bash
# Issue 12 (engineer "dist"): tensor parallelism on 2+ GPUs, the one script (parts) that replaced dist6.sh and dist7.sh
# (and before them dist.sh, dist2.sh, dist5.sh). NEEDS BOTH GPUs (2x H100 or 2x H200; part 70b: 4), runs alone.
# Runs from the repo root; JSON + logs to $OUT/dist/dist8/. Dummy-weight Llama-3 shapes, bf16. NVLink multicast stays
# off: NCCL_NVLS_ENABLE / TORCH_SYMM_MEM_DISABLE_MULTICAST are recorded, never changed. Every step has a hard cap.
# Warm-up: every engine times 16 untimed tokens (Triton compile, autotune, graph capture) before its timed runs.
#   DIST8_PARTS (space separated; default "test early tp1"), run in the order test, gemv, early, table, ab, crossing, tp1, tp2,
#   test6, ar, nccl, goal, 70b (each step capped: a protocol that hangs costs only its step):
#   gemv  (<= 58 s) one TP=2 engine (mp, async) in the defaults: batch-1 ms/token + graph; then every rank sweeps the
#         batch-1 GEMV tiles per weight shape in a PDL chain on its real weights (benchmarks/gpu_tp_gemv.py), and the
#         winners are A/B'd against the autotuner's tiles in the same engine (re-captured; graph + ms/token, twice)
#   early (<= 64 s) one TP=2 engine in the defaults (since session 8 the pushed message's consumer polls the peer's
#         words before its PDL wait, OCTAVO_TP_EARLY_POLL): batch-1 ms/token + graph + per-layer kernel traces (graph
#         and real decode steps), then re-captured with it off / on alternating twice (graph + ms/token + tokens)
#   table (<= 50 s) one TP=2 engine in the defaults (the committed GEMV tile table of cuda_gemv_table.py on):
#         batch-1 ms/token + graph, then table off / on alternating twice in the same engine (re-captured)
#   ab    (<= 50 s) one TP=2 engine in the defaults, its per-layer kernel trace and a trace of real decode steps, then
#         re-captured per mode of DIST8_TP2_MODES (default: the defaults again, push off, push with PDL off = true
#         per-kernel times) and last without any all-reduce (their in-step cost)   [session 7's dist7.sh]
#   crossing (<= 110 s) session 12: the all-reduce + RMSNorm crossing (~6.5 us on the critical path twice a layer).
#         One TP=2 engine STARTED with OCTAVO_TP_CROSSING_PRELOAD=1 (loads off the crossing's critical path: the fused
#         kernel's residual row, norm weight, call index and LL address before its PDL wait, the pushing GEMV's call
#         index and peer address at its start) and OCTAVO_NORM_SMALL_ROWS_WARPS=16 (every RMSNorm launch of <= 4 rows, plain and fused,
#         on 16 warps instead of 4; fp8's one-row quantizing norm won with 16), so the fusion's bitwise start check runs
#         with both (log); then re-captured: defaults, +rw, +n16, +rw+n16, +rw+n8, then the first four again
#         (graph + ms/token + tokens + per-layer kernel trace each). TP=1 is not run: n16 would be a TP>=2 default.
#   tp1   (<= 26 s) TP=1 (uni, async) in the defaults, then re-captured in the defaults: the denominators
#   tp2   (<= 40 s) TP=2 (mp, async) batch 1 in the defaults as started, max_num_seqs 8 as tp1's (the goal engine's
#         batch 1 runs at max_num_seqs 512, ~0.04 ms slower in session 11): the like-for-like numerator
#   test  (<= 60 s) 2 GPUs: the pushing GEMV + fused norm / receive-only kernel == NCCL + unfused norm, bitwise, also
#         with fixed GEMV tiles (cuda_gemv_table.py), the early poll, the preload (+16 warps); a layer's PDL chain == without
#   test6 (<= 45 s) 2 GPUs: one-shot all-reduce / all-gather / all-reduce + RMSNorm == NCCL (+ unfused norm) bitwise,
#         eager + graphs, with PDL; LL protocol                                      [session 6's dist6.sh test]
#   ar    (<= 30 s) all-reduce microbench: NCCL vs symm_mem vs one-shot, 8 KiB..1 MiB, eager and in a graph; since
#         session 10 also 2/4/8 MiB (NCCL vs one-shot: a 512-row decode step's messages, NCCL's today)
#   nccl  (<= 40 s) TP=2 NCCL only, then no all-reduce at all (the all-reduces' in-step cost)
#   goal  (<= 118 s) 512 x 1000/1000 TP=2 throughput (temperature 1, async; TP=1: the lead's e2e_8b.sh)
#   70b   (<= 150 s, 4 GPUs; + <= 120 s only if it gave no number) Llama-3-70B shape TP=4 batch-1 decode vs its
#         roofline (35.3 GB per GPU over 3.01 TB/s, session 3's measured H100 rate, and over the rate every rank
#         measures in the engine, --measure-copy-rate), in the defaults; without a number, again with NCCL only
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/dist/dist8"
mkdir -p "$R"
PARTS=" ${DIST8_PARTS:-test early tp1} "
MODES="${DIST8_TP2_MODES:-fused+pdl+silu+push+early fused+pdl+silu fused+silu+push}"
# no git here (the device's .git is stale; the lead records the tree)
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
  echo "== dist8: $name (cap ${cap}s) $(date -u +%T)"
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
# the 2-GPU test first this time: it covers the new early poll (a hang there costs only its cap)
has test && step gpu_test 60 python3 -u -m pytest -v -x tests/gpu/test_gemv_push_gpu.py tests/gpu/test_pdl_gpu.py \
  -k "gemv_push or pdl_chain"
# shellcheck disable=SC2086
has gemv && step 8b_tp2_gemv 58 $TP --one 2 --tag gemv --async-modes on --graph-replay --gemv-ab 2
P="fused+pdl+silu+push"
# shellcheck disable=SC2086
has early && step 8b_tp2_early 64 $TP --one 2 --tag early --async-modes on --graph-replay --layer-trace \
  --ar-modes $P $P+early $P $P+early
# shellcheck disable=SC2086
has table && step 8b_tp2_table 50 $TP --one 2 --tag table --async-modes on --graph-replay --table-ab 2
# shellcheck disable=SC2086
has ab && step 8b_tp2_ab 50 $TP --one 2 --tag ab --async-modes on --graph-replay --layer-trace \
  --ar-modes $MODES --graph-replay-no-allreduce
if has crossing; then
  if has test && ! grep -q "^gpu_test exit 0 " "$R/exits.txt"; then  # the preload's 2-GPU test failed or hung:
    echo "crossing: the 2-GPU test did not pass, so no preload (it could hang): the 16/8-warp rows only"
    # shellcheck disable=SC2086
    step 8b_tp2_crossing 80 OCTAVO_NORM_SMALL_ROWS_WARPS=16 $TP --one 2 --tag crossing --async-modes on \
      --graph-replay --layer-trace --ar-modes $P $P+n16 $P+n8 $P $P+n16
  else
    # shellcheck disable=SC2086
    step 8b_tp2_crossing 110 OCTAVO_TP_CROSSING_PRELOAD=1 OCTAVO_NORM_SMALL_ROWS_WARPS=16 $TP --one 2 --tag crossing \
      --async-modes on --graph-replay --layer-trace \
      --ar-modes $P $P+rw $P+n16 $P+rw+n16 $P+rw+n8 $P $P+rw $P+n16 $P+rw+n16
  fi
fi
has tp1 && step 8b_tp1 26 $TP --one 1 --async-modes on --graph-replay --ar-modes custom+pdl+silu
# shellcheck disable=SC2086
has tp2 && step 8b_tp2 40 $TP --one 2 --async-modes on --graph-replay
has test6 && step gpu_test6 45 python3 -u -m pytest -v -x tests/gpu/test_pdl_gpu.py tests/gpu/test_tp_allreduce_gpu.py \
  -k "equals_nccl or pdl_chain"
has ar && step allreduce 30 python3 benchmarks/gpu_allreduce.py --world 2 --large --out "$R/allreduce.json"
has nccl && step 8b_tp2_nccl 40 OCTAVO_TP_ALLREDUCE=nccl $TP --one 2 --tag nccl --async-modes on --graph-replay \
  --kernel-table --graph-replay-no-allreduce
has goal && step 8b_tp2_goal 118 $TP --one 2 --tag goal --async-modes on --prompts 512 --in-len 1000 --out-len 1000 \
  --max-num-seqs 512 --temperature 1
S70=${DIST8_70B_SHAPE:-70b}  # "tiny": a CPU dry run of the 70b part (gloo, 4 processes)
if has 70b; then  # the defaults (the one-shot all-reduce + fused norm at 4 ranks: never run before session 10)
  step 70b_tp4 150 python3 benchmarks/gpu_tp.py --shape "$S70" --tp 4 --prompts 0 --max-num-seqs 8 \
    --copy-rate 3.01e12 --measure-copy-rate --out-dir "$R" --async-modes on --graph-replay
  if ! grep -q decode_bs1_ms_per_token "$R/${S70}_tp4.json" 2> /dev/null; then  # no number: NCCL only (session 3's)
    step 70b_tp4_nccl 120 OCTAVO_TP_ALLREDUCE=nccl python3 benchmarks/gpu_tp.py --shape "$S70" --tp 4 --prompts 0 \
      --max-num-seqs 8 --copy-rate 3.01e12 --measure-copy-rate --out-dir "$R" --async-modes on --tag nccl
  fi
fi
python3 benchmarks/device/dist_summary.py "$R"
