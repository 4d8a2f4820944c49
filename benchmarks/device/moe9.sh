#!/usr/bin/env bash
# MoE on one GPU, sessions 9-12 (issue 17, MoE keys). HARD bound per call over all parts given: 98 s for one part,
# 135 s for more, 150 s when ab11, ab12 or ab13 is one of them, 145 s for ab13 alone ($MOE_BOUND_S to change it; a
# package install, when needed, counts inside it).
# Usage:  moe9.sh PART [PART ...]   (parts run in the order given, each capped by what is left). Results (logs, JSON) under $OUT/moe9/.
# Parts:
#  ab      Qwen3-30B-A3B, all 48 layers, batch-1 decode vs the roofline over the bytes read (routed experts only)
#          with the engine's defaults (cap 95 s; its first JSON line is the headline), then the same-engine A/B of
#          $MOE_PF_SET (default b10, benchmarks/moe_variants.py: the early o_proj off (a default since session 10),
#          the early qkv GEMV and the input norm + qkv launch loading weights before the PDL wait), re-captured per
#          variant (rel_diff must be 0: same bits), kernel tables of the best with PDL on and off (per-layer profile).
#  ab11    session 11: the same headline with --host-diag (CUPTI trace + cProfile of a 65-token generation: GPU idle
#          per step, where the gaps sit, syncs per step; moe_host.py), then the b11 A/B (route once, input norm + qkv,
#          o_proj tiles, pipelined w13 tiles) and kernel tables (cap 115 s).
#  ab12    session 11 batch 2: the headline with OCTAVO_GRAPH_HEAD=1 in the engine but the head graphs switched off
#          for it (the default eager head), then head graphs off / on alternating (moe_head_ab.py; lever: the host
#          work per step), the GIL switch interval / blocking event wait alternating (--host-ab), --host-diag, the b12 A/B (batch 1's winners now defaults vs session 10's, w13 as tl.dot
#          tiles, the early w2, tiles around the defaults) and kernel tables (cap 120 s).
#  b2b     session 11 batch 2b (one GPU alone, cap 78 s, bound 80 s alone): the headline of ab12 (head graphs captured,
#          off for it) + head graphs off / on + --host-diag, then the b12s rows while time is left (no tables).
#  ab13    session 12 batch 1: the headline (engine defaults; head graphs captured, off), then in the same engine,
#          ms per token alternating: one pinned staging copy per step x head graphs (--switch-ab, 3 rotated rounds),
#          w13 partial routing + early w2 with the engine's graphs re-captured, then with staging, then + head graphs
#          (--engine-ab, 2 rounds: the candidate defaults together), --host-diag with staging on, the b13 graph rows
#          (partial routing x early w2) and kernel tables (cap 140 s).
#  b2s12   session 12 batch 2 (one GPU alone, cap 78 s, bound 80 s alone): the headline on the freeze tree (defaults:
#          partial routing + early w2 since 4ab4add), staging off / on alternating (--switch-ab, 4 rotated rounds),
#          the forward graph's replay after a copy / a kernel / itself (--graph-gap-diag), --host-diag with staging on
#          (since 980b647 the staged graph inputs end with a multi-tensor copy kernel: does b1's 41 us pre-graph idle go?).
#  stest   the pinned staging copy: test_step_staging_gpu.py (views = plain copies over the ring while the GPU lags;
#          a tiny Llama's greedy and seeded tokens with staging off / on in one engine, graphs replayed) (cap 45 s).
#  nanost  the pinned staging copy on nano.sh's workload (benchmarks/gpu_e2e.py qwen3_nanovllm, async): fresh processes
#          with OCTAVO_STEP_STAGING 0, 1, 0, 1 while time is left (each capped at 55 s; ~42 s each on one H100 alone),
#          JSON under $OUT/moe9/nanost/<n>_<0|1>/ (the engine-wide default question of lever 1).
#  rtest   route once (OCTAVO_MOE_ROUTE_ONCE): test_moe_route_once_gpu.py (bits at the Qwen3-30B-A3B layer, eager and
#          in a graph over 6 layers; a tiny Qwen3-MoE's greedy tokens with it on and off) (cap 40 s).
#  mixab   Mixtral-8x7B with 8 of 32 layers (as session 6: 23 GB of weights; 32 layers do not fit 80 GB), the
#          same measurement, the defaults re-captured twice and their kernel tables (moe_variants.MIXTRAL).
#  bs1     Qwen3-30B-A3B, 48 layers, batch 1 with the engine's defaults only (the headline measurement).
#  bs1head the same with the LM head + sampler graphs captured (OCTAVO_GRAPH_HEAD=1, engineer head's opt-in), then
#          ms per token with them off / on alternating in that engine (moe_head_ab.py).
#  tput    Qwen3-30B-A3B with 8 of 48 layers: octavo 256 x 512/512 (+ /64), then transformers in the same process
#          (fewer requests x 512/512 if 256 do not fit 12 s) (moe7.sh tput).
#  etest   the GEMVs that load weights before the PDL wait: test_moe_gemv_early_gpu.py (qkv / o_proj) and
#          test_moe_norm_qkv_gpu.py (input norm + qkv; bit-equal to the engine GEMV at its BLOCK_K), then
#          test_moe_w2_early_gpu.py (the early w2 launch's bits over a 6-layer chain, eager and in a graph; since
#          session 12 also w13's partial routing alone and with the early w2) (cap 50 s).
#  tests   the MoE GPU tests of the batch-1 path: the two of etest, test_moe_prefetch_gpu.py, and
#          test_moe_gpu.py's batch-one / two-launch / parity cases (cap 60 s).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: moe9.sh PART [PART ...] (ab ab11 ab12 ab13 b2b b2s12 mixab bs1 bs1head tput rtest etest stest nanost tests)"; exit 2; }
D="$OUT/moe9"
mkdir -p "$D/configs"
START=$(date +%s)
case " $* " in " b2b " | " b2s12 ") DEF=80 ;; " ab13 ") DEF=145 ;; " nanost ") DEF=150 ;; *" ab11 "* | *" ab12 "* | *" ab13 "*) DEF=150 ;; *) DEF=$([ $# -gt 1 ] && echo 135 || echo 98) ;; esac
BOUND=${MOE_BOUND_S:-$DEF}
left() { echo $(( BOUND - ($(date +%s) - START) )); }
# s9 batch 1: the package was not importable in the lanes; install it here then, as the harness should have
# (inside the bound: the parts after it get what is left)
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$D/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$D/install.txt" 2>&1
  timeout 20 python -c "import octavo; print('octavo', octavo.__file__)" 2>&1 | tee -a "$D/install.txt"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader > "$D/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$D/commit.txt" 2>/dev/null || true
git status --short -- plugins/platforms benchmarks > "$D/dirty.txt" 2>/dev/null || true
cp plugins/platforms/moe_configs/*.json "$D/configs/"
export OCTAVO_MOE_CONFIG_DIR="$D/configs"
e2e() {  # e2e NAME CAP ARGS...: moe_e2e.py under a cap, its log in $D/NAME.log, JSON lines shown
  local name=$1 cap=$2; shift 2
  echo "== $name: moe_e2e.py $* (cap ${cap} s) $(date -u +%T)"
  timeout -k 2 "$cap" python benchmarks/moe_e2e.py "$@" --deadline-s $(( cap - 3 )) --out-dir "$D/$name" \
    > "$D/$name.log" 2>&1
  echo "$name exit $? after $(( $(date +%s) - START )) s"
  grep -E "^\{|^skip|Error|tok/s" "$D/$name.log" | cut -c1-3000
}
pyt() {  # pyt NAME CAP FILES...: pytest under a cap
  local name=$1 cap=$2; shift 2
  echo "== $name: pytest $* (cap ${cap} s) $(date -u +%T)"
  OCTAVO_TRITON_GEMV=0 OCTAVO_MOE_CONFIG_DIR= timeout -k 2 "$cap" python -m pytest -v -p no:cacheprovider "$@" \
    > "$D/$name.log" 2>&1
  echo "$name exit $? after $(( $(date +%s) - START )) s"
  grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" "$D/$name.log" | tail -n 30
}
for PART in "$@"; do
  L=$(left)
  [ "$L" -ge 10 ] || { echo "skip $PART: ${L} s left"; continue; }
  mkdir -p "$D/$PART"
  case "$PART" in
    ab) C=$(( L < 95 ? L : 95 )); MOE_PF_SET=${MOE_PF_SET:-b10} e2e ab "$C" --tasks bs1:qwen3-30b-a3b:48 --profile-prefetch ;;
    ab11) C=$(( L < 115 ? L : 115 )); MOE_PF_SET=b11 e2e ab11 "$C" --tasks bs1:qwen3-30b-a3b:48 --host-diag \
      --profile-prefetch ;;
    ab12) C=$(( L < 120 ? L : 120 )); OCTAVO_GRAPH_HEAD=1 MOE_PF_SET=b12 e2e ab12 "$C" --tasks bs1:qwen3-30b-a3b:48 \
      --graph-head-ab --host-ab --host-diag --profile-prefetch ;;
    ab13) C=$(( L < 140 ? L : 140 )); OCTAVO_GRAPH_HEAD=1 MOE_PF_SET=b13 e2e ab13 "$C" --tasks bs1:qwen3-30b-a3b:48 \
      --switch-ab --engine-ab --host-diag --staging-diag --profile-prefetch ;;
    b2s12) C=$(( L < 78 ? L : 78 )); e2e b2s12 "$C" --tasks bs1:qwen3-30b-a3b:48 --switch-ab --ab-rounds 4 \
      --graph-gap-diag --host-diag --staging-diag ;;
    b2b) C=$(( L < 78 ? L : 78 )); OCTAVO_GRAPH_HEAD=1 MOE_PF_SET=b12s e2e b2b "$C" --tasks bs1:qwen3-30b-a3b:48 \
      --graph-head-ab --host-diag --profile-prefetch ;;
    mixab) C=$(( L < 60 ? L : 60 )); MOE_PF_SET=mix e2e mixab "$C" --tasks bs1:mixtral-8x7b:8 --profile-prefetch ;;
    bs1) C=$(( L < 50 ? L : 50 )); e2e bs1 "$C" --tasks bs1:qwen3-30b-a3b:48 ;;
    bs1head) C=$(( L < 55 ? L : 55 )); OCTAVO_GRAPH_HEAD=1 e2e bs1head "$C" --tasks bs1:qwen3-30b-a3b:48 --graph-head-ab ;;
    tput) C=$(( L < 80 ? L : 80 )); e2e tput "$C" --tasks tput:qwen3-30b-a3b:8 tf:qwen3-30b-a3b:8 --tf-budget-s 12 \
      --tf-fewer-prompts ;;
    rtest) pyt rtest $(( L < 40 ? L : 40 )) tests/kernels/test_moe_route_once_gpu.py ;;
    nanost) for i in 1 2; do for st in 0 1; do
        L=$(left); [ "$L" -ge 50 ] || { echo "nanost: ${L} s left, stop"; break 2; }
        echo "== nanost $i staging=$st $(date -u +%T)"
        OCTAVO_ASYNC_SCHEDULING=true OCTAVO_STEP_STAGING=$st timeout -k 5 55 python benchmarks/gpu_e2e.py qwen3_nanovllm \
          --out-dir "$D/nanost/${i}_$st" > "$D/nanost/${i}_$st.log" 2>&1
        echo "exit $? $(grep -ho '"throughput_qwen3_0p6b_nanovllm_tok_s": [0-9.]*' "$D/nanost/${i}_$st"/*.json 2>/dev/null)"
      done; done ;;
    stest) pyt stest $(( L < 45 ? L : 45 )) tests/gpu/test_step_staging_gpu.py ;;
    etest) pyt etest $(( L < 50 ? L : 50 )) tests/kernels/test_moe_gemv_early_gpu.py tests/kernels/test_moe_norm_qkv_gpu.py \
      tests/kernels/test_moe_w2_early_gpu.py ;;
    tests) pyt tests $(( L < 60 ? L : 60 )) tests/kernels/test_moe_gemv_early_gpu.py \
      tests/kernels/test_moe_norm_qkv_gpu.py tests/kernels/test_moe_prefetch_gpu.py \
      tests/kernels/test_moe_gpu.py -k "prefetch or pipe or batch_one or two_launch or parity" ;;
    *) echo "unknown part $PART (ab ab11 ab12 ab13 b2b b2s12 mixab bs1 bs1head tput rtest etest stest nanost tests)"; exit 2 ;;
  esac
done
for f in "$D"/*/*.json; do [ -f "$f" ] && { echo "--- $f"; head -c 1500 "$f"; echo; }; done
