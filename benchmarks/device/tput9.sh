#!/usr/bin/env bash
# Issue 17, engineer "tput", session 9: ONE GPU, hard bound 150 s a call for b1, 90 s for b2 (every step under
# `timeout`, the caps below sum to <= 148 / 88 s). JSON + logs under $OUT/tput9/. One part per call, TPUT_PART=<part> (or the first argument):
#   (the package is installed first if it is not importable: pip install --no-deps -e ., <= 100 s of the bound)
#   b2  (batch 2, hard bound 88 s) profile.json: b1 ran on an H200 with its own cache (two waves: 442 + 70); here the
#       H100's schedule: 430 x 1000/1000 (the run's two full waves of 215; on a bigger card with the H100's 26,970
#       blocks, fp8's KV sizing) hooked as in b1 (CUDA events a step: GPU time vs idle vs the model, idle outliers) with
#       one profiler window of 8 decode steps at decode step 300; on the timeout's SIGTERM the steps so far are
#       summarized. (cuda_gemm.BLAS_TABLE's tail rows are measured by the lead's headline run, defaults.) First, <= 9 s:
#       gemm_rows.json, the 8B projections at 88 rows (the H100 tail) and 448 (an H200's own wave: b1's gate_up
#       kernel there ran at ~390 TFLOP/s), cuBLAS / cuBLASLt / operands swapped.
#   b1  (batch 1) profile.json (cap <= 106 s + 8 s to summarize on SIGTERM): benchmarks/tput_run_profile.py, the warmed 512 x 1000/1000 8B run in one
#       engine with CUDA events around every step (forward, logits + sampler, GPU idle before the next step), each
#       step's rows and summed context against a byte/FLOP model, and two profiler windows of 8 decode steps (the
#       ~211-row wave at decode step 300, the ~90-row tail wave at 2,600); then gemm_rows.json (cap 17 s): the 8B
#       projections at 128-256 rows in a captured chain over weight copies beyond L2 (gemm_rows_bench.py --chain):
#       cuBLAS, cuBLASLt, each also with the operands swapped (W @ x^T); then waves.json (the rest, ~17 s): one
#       8B attention layer at the run's equal-context waves (82 / 215 requests x 1,500 keys), the launch table's
#       entry vs other tiles and chunked split-KV (decode_attn_bench.py --plan waves).
# Session 10 (an H100 this time), TPUT_PART=s10b1 (hard bound 148 s): gemm_rows.json first (cap 24 s): the 8B projections
#   + LM head at 264 / 272 (the paced run's plateau), 216 / 88 (the waves'), 248 / 184, cuBLAS / cuBLASLt / swapped, in
#   captured chains; then profile.json (the rest, <= 118 s): one engine, the headline's warm-up, a hooked one-wave run
#   (215 x 1000/300: CUDA events a step vs the byte/FLOP model, one profiler window of 8 decode steps at ~215 rows and
#   one on a prefill-chunk step), then in-engine A/Bs (graphs recaptured for each): all cuBLAS GEMMs through cuBLASLt
#   vs defaults at 215 requests, and the tail (82 requests: BLAS_TABLE's cuBLASLt rows vs cuBLAS).
# TPUT_PART=s10b2 (hard bound 118 s): gemm_rows.json at the paced run's plateau sizes (cap 14 s), then pace.json: the
#   headline's engine and workload timed ONCE with pacing off (the waves), to set against the lead's e2e_8b.sh (pacing
#   auto, the default) in the same call: batch 2 keeps requests <= 120 s, so the in-engine pair below does not fit.
# TPUT_PART=pace (hard bound 190 s): admission pacing (core/kv_pacing.py) on vs off in ONE engine, the headline's
#   bf16 512 x 1000/1000 workload and engine (benchmarks/fp8_tail_ab.py --knob pacing, bf16): runs on,off.
# TPUT_PART=m11 (session 11, engineer margin; hard bound 148 s): profile.json, the headline's engine, warm-up and whole
#   512 x 1000/1000 run with its default pacing (auto: rate 1.2, 2,720 steps at the H100's 26,971 blocks) hooked, no
#   profiler windows: GPU time vs idle between steps by step kind, every idle gap over 2 ms: what is left outside the
#   graphs per decode step on the paced schedule.
# TPUT_PART=s12b1 (session 12; hard bound 148 s): profile.json (cap <= 96 s) as m11 (the headline's engine, warm-up
#   and whole 512 x 1000/1000 run hooked, no profiler windows) on this tree, whose KV sizing no longer counts the
#   profile run's temporary KV cache (d533b81): kv_blocks / kv_sizing, steps, preemptions (must be 0), tok/s, GPU vs
#   idle; then gemm_lt.json (the rest but 22 s): the 8B projections at the paced run's plateau (graph size 272:
#   257-272 rows, ~935 of its steps), a prefill chunk's 8,192, then graph sizes 248-200: cuBLAS, cuBLASLt's pick
#   and every candidate of cuBLASLt's heuristic (benchmarks/gemm_lt_bench.py, captured chains; config attributes,
#   bits); then cuda_gemm_lt's GPU tests.
# TPUT_PART=s12b2 (session 12, batch 2, hard bound 148 s): cuda_gemm_lt's GPU tests (cap 24 s: every LT_TABLE pick of
#   this card offered and within bf16 rounding), then profile.json: the headline's engine and warm-up, 272 x 1000/100
#   hooked (34 prefill steps of 8,192 tokens, then ~100 decode steps at graph size 272: the two places LT_TABLE's
#   biggest picks act) and in the same engine OCTAVO_TRITON_GEMM off (gemm_off: cuBLAS for every projection) vs on,
#   alternating, GPU seconds per step kind.
# TPUT_PART=s12lt (session 12, hard bound 70 s): gemm_lt.json only: cuBLASLt's candidates for the 8B projections at the
#   paced run's ramp sizes (200 down to 104 rows, ~47 steps each), for LT_TABLE entries there.
set -uo pipefail
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/tput9"; mkdir -p "$R"
START=$(date +%s)
PART="${TPUT_PART:-${1:-b1}}"
BOUND=148; [ "$PART" = b2 ] && BOUND=88; [ "$PART" = s12lt ] && BOUND=70; [ "$PART" = pace ] && BOUND=190; [ "$PART" = s10b2 ] && BOUND=118
left() { echo $(( BOUND - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
echo "== part $PART $(date -u +%T)"
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then  # s9 batch 1: the package was not installed
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
  timeout 20 python -c "import octavo; print('octavo', octavo.__file__)" 2>&1 | tee -a "$R/install.txt"
fi

run() {  # cap seconds, log name, command... (KILL_AFTER: seconds from SIGTERM to SIGKILL, default 2)
  local cap=$1 log=$2; shift 2
  echo "== $* (cap $cap s) $(date -u +%T)"
  timeout -k "${KILL_AFTER:-2}" "$cap" "$@" > "$R/$log" 2>&1
  echo "exit $?"; grep -v "^\[transformers\]\|^USDT" "$R/$log" | tail -n "${TAIL:-80}"
}

# a card with more memory than an H100's 80 GB (H200: 141 GB) runs the 8B workload with the H100's KV cache (26,420
# blocks of 16, session 8's bf16 count: three waves of ~211), so the schedule is the headline's; stated in the JSON
KVB=""
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
# (b2: 26,970, the H100's count after fp8's KV sizing 42811d2, ~+550 blocks: waves of 215, 215, 82)
DEFAULT_KVB=26420; [ "$PART" = b2 ] || [ "$PART" = m11 ] && DEFAULT_KVB=26970; [ "$PART" = s12b1 ] && DEFAULT_KVB=27480
if [ "${mem:-0}" -gt 100000 ]; then  # (and the model prices bytes at the H200's read rate, b1: 4.18 TB/s)
  KVB="--kv-blocks ${TPUT_KV_BLOCKS:-$DEFAULT_KVB} --read-tbps 4.18"; echo "card ${mem} MiB: $KVB"
fi

case "$PART" in
  b1)
    cap=$(( $(left) - 27 )); [ "$cap" -gt 106 ] && cap=106
    KILL_AFTER=8 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" --budget-s "$cap" $KVB
    run 20 gemm_rows.log python benchmarks/gemm_rows_bench.py --out "$R/gemm_rows.json" --chain --budget 13 \
      --shapes 8b_qkv 8b_o 8b_gate_up 8b_down --rows 216 224 232 96 208 240 256 192 128
    cap=$(left); [ "$cap" -gt 4 ] && run "$cap" waves.log python benchmarks/decode_attn_bench.py --plan waves \
      --out "$R/waves.json" --budget $((cap - 6)) --rep 40 ;;
  s10b1)  # <= 148 s
    run 24 gemm_rows.log python benchmarks/gemm_rows_bench.py --out "$R/gemm_rows.json" --chain --budget 16 \
      --shapes 8b_gate_up 8b_down 8b_qkv 8b_o 8b_lm_head --rows 272 264 216 248 88 184
    cap=$(( $(left) - 4 )); [ "$cap" -gt 118 ] && cap=118
    KILL_AFTER=6 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" \
      --budget-s "$((cap - 8))" $KVB --prompts 215 --out-len 300 --windows 150 --window 8 --prefill-window 10 \
      --ab blas:cublaslt defaults@82 gemm_off@82 defaults blas:cublaslt gemm_off@82 defaults@82 ;;
  s10b2)  # <= 118 s
    run 14 gemm_rows.log python benchmarks/gemm_rows_bench.py --out "$R/gemm_rows.json" --chain --budget 8 \
      --shapes 8b_gate_up 8b_down 8b_qkv 8b_o --rows 272 256 240
    run $(( $(left) - 3 )) pace.log python benchmarks/fp8_tail_ab.py --knob pacing --order off --out "$R/pace.json" ;;
  pace)  # <= 190 s: two full runs (~70 s each on an H100) after the build and warm-up
    run $(( $(left) - 3 )) pace.log python benchmarks/fp8_tail_ab.py --knob pacing --order "${PACE_ORDER:-on,off}" \
      --budget $(( BOUND - 80 )) --out "$R/pace.json" ;;
  b2)  # <= 88 s: batch 2's engineer slots are 90 s
    run 9 gemm_rows.log python benchmarks/gemm_rows_bench.py --out "$R/gemm_rows.json" --chain --budget 5 \
      --shapes 8b_gate_up 8b_o 8b_down 8b_qkv --rows 88 448
    cap=$(( $(left) - 7 ))
    KILL_AFTER=6 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" \
      --budget-s "$cap" $KVB --prompts 430 --windows 300 --window 8 --prefill-window 0 ;;
  m11)  # <= 148 s
    cap=$(( $(left) - 4 ))
    KILL_AFTER=6 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" \
      --budget-s "$((cap - 8))" $KVB --windows --prefill-window 0 ;;
  s12b1)  # <= 148 s (m11's run took 87 s in all)
    cap=$(( $(left) - 44 )); [ "$cap" -gt 96 ] && cap=96
    KILL_AFTER=6 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" \
      --budget-s "$((cap - 8))" $KVB --windows --prefill-window 0
    cap=$(( $(left) - 22 ))
    [ "$cap" -gt 8 ] && run "$cap" gemm_lt.log python benchmarks/gemm_lt_bench.py --out "$R/gemm_lt.json" \
      --budget $((cap - 8)) --rows 272 8192 264 248 256 240 232 224 216 208
    cap=$(( $(left) - 1 )); [ "$cap" -gt 4 ] && run "$cap" lt_test.log python -m pytest -q -p no:cacheprovider \
      tests/gpu/test_cuda_gemm_lt_gpu.py ;;
  s12b2)  # <= 148 s
    run 24 lt_test.log python -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_gemm_lt_gpu.py
    cap=$(( $(left) - 4 ))
    KILL_AFTER=6 run "$cap" profile.log python benchmarks/tput_run_profile.py --out "$R/profile.json" \
      --budget-s "$((cap - 8))" $KVB --prompts 272 --out-len 100 --windows --prefill-window 0 \
      --ab gemm_off defaults gemm_off defaults ;;
  s12lt)  # <= 70 s
    cap=$(( $(left) - 2 ))
    run "$cap" gemm_lt.log python benchmarks/gemm_lt_bench.py --out "$R/gemm_lt.json" --budget $((cap - 10)) \
      --rows 200 192 184 176 168 160 152 144 136 128 120 112 104 ;;
  *) echo "unknown TPUT_PART=$PART"; exit 2 ;;
esac
echo "total $(( $(date +%s) - START )) s"
