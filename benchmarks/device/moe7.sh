#!/usr/bin/env bash
# MoE on one GPU (issue 17, MoE keys): THE MoE device script (replaces moe6.sh, moe_model.sh, moe.sh and
# moe_parity.sh, which were near-copies). HARD bound 74 s per call over all parts given. Usage:
#   moe7.sh PART [PART ...]    (parts run in the order given, each capped by what is left)
# Parts:
#  attn    Qwen3-30B-A3B, all 48 layers, batch-1 decode vs the roofline over the bytes read (routed experts only),
#          with the one-launch batch-1 attention installed (OCTAVO_MOE_DECODE_ATTN=1), then an A/B of it in the
#          same engine by re-capture (off = the four-launch path; split / tile variants) + kernel table of the best
#          (moe_e2e.py --profile-attn).
#  prefetch  (session 8) the same model with the engine's defaults, then an A/B of the L2 prefetch hints of the
#          batch-1 kernels in the same engine by re-capture (o_proj during attention, w2 during w13, the next
#          qkv during w2; moe_e2e.py --profile-prefetch; rel_diff must be 0: a hint changes no bit).
#  ab      (session 8 batch 2) the same model with the engine's defaults (batch 1's winners), then the same-engine
#          A/B of moe_profile.B2_VARIANTS (session 7's defaults, tiles with fewer registers, rank routing, ...).
#  bs1     the same model and measurement with the engine's defaults, plus the kernel table and the A/B of the
#          batch-1 MoE fusions (moe_e2e.py --profile; session 6's `moe6.sh 1` part (b)).
#  layer   one MoE layer at batch 1: the two-launch path vs the general kernel + routing, short tile search
#          (moe_decode_bench.py; session 6's `moe6.sh 1` part (a)).
#  bench   one MoE layer at M = 1, 16, 256: kernel vs grouped torch path, quick tile search (moe_bench.py;
#          session 4's `moe.sh`).
#  tput    Qwen3-30B-A3B with 8 of 48 layers: octavo 256 x 512/512 (+ /64), then transformers in the same process
#          (fewer requests x 512/512 if 256 do not fit 12 s) (session 6's `moe6.sh 2`).
#  mixtral Mixtral-8x7B with 8 of 32 layers: one engine (batch 1 + 256 x 512/512 + /64), then transformers
#          (session 6's `moe6.sh 4`; session 4's `moe_model.sh 2` ran it with --tf-budget-s 6).
#  pftest  (session 8) the prefetch hints change no bit, the input norm + qkv launch is right:
#          test_moe_prefetch_gpu.py, test_moe_norm_qkv_gpu.py (cap 25 s).
#  attntest  the one-launch attention's GPU test alone (test_moe_attn_gpu.py, cap 22 s).
#  attnbench batch-1 attention per layer, graph-replayed over 48 layers' caches: the backend's four launches vs the
#          one-launch variants (moe_attn_bench.py, cap 40 s).
#  tests   the MoE GPU tests: the one-launch attention (test_moe_attn_gpu.py), batch 1 / two-launch path and the
#          float32-oracle parity of the tiny models (test_moe_gpu.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: moe7.sh PART [PART ...] (attn prefetch ab pftest attntest attnbench bs1 layer bench tput mixtral tests)"; exit 2; }
D="$OUT/moe7"
mkdir -p "$D/configs"
START=$(date +%s)
BOUND=${MOE_BOUND_S:-74}
left() { echo $(( BOUND - ($(date +%s) - START) )); }
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
for PART in "$@"; do
  L=$(left)
  [ "$L" -ge 8 ] || { echo "skip $PART: ${L} s left"; continue; }
  mkdir -p "$D/$PART"
  case "$PART" in
    attn) OCTAVO_MOE_DECODE_ATTN=1 e2e attn "$L" --tasks bs1:qwen3-30b-a3b:48 --profile-attn ;;
    bs1) e2e bs1 "$L" --tasks bs1:qwen3-30b-a3b:48 --profile ;;
    prefetch) e2e prefetch "$L" --tasks bs1:qwen3-30b-a3b:48 --profile-prefetch ;;
    ab) MOE_PF_SET=b2 e2e ab "$L" --tasks bs1:qwen3-30b-a3b:48 --profile-prefetch ;;
    tput) e2e tput "$L" --tasks tput:qwen3-30b-a3b:8 tf:qwen3-30b-a3b:8 --tf-budget-s 12 --tf-fewer-prompts ;;
    mixtral) e2e mixtral "$L" --tasks both:mixtral-8x7b:8 tf:mixtral-8x7b:8 --tf-budget-s 12 --tf-fewer-prompts ;;
    layer)
      C=$(( L < 24 ? L : 24 )); echo "== layer: moe_decode_bench.py (cap ${C} s) $(date -u +%T)"
      timeout -k 2 "$C" python benchmarks/moe_decode_bench.py --shapes qwen3-30b-a3b mixtral-8x7b --budget-s 7 2 \
        --config-dir "$D/configs" --json "$D/layer/decode_layer.json" > "$D/layer.log" 2>&1
      echo "layer exit $? after $(( $(date +%s) - START )) s"; grep -E "bandwidth|: \{" "$D/layer.log" | cut -c1-700 ;;
    bench)
      C=$(( L < 31 ? L : 31 )); echo "== bench: moe_bench.py (cap ${C} s) $(date -u +%T)"
      timeout -k 2 "$C" python benchmarks/moe_bench.py --batch-sizes 1 16 256 --tune-budget-s 5 \
        --tune-batch-sizes 1 16 --tune-out "$D/configs" --json "$D/bench/bench.json" > "$D/bench.log" 2>&1
      echo "bench exit $? after $(( $(date +%s) - START )) s"; tail -n 12 "$D/bench.log" ;;
    attntest)
      C=$(( L < 22 ? L : 22 )); echo "== attntest: test_moe_attn_gpu.py (cap ${C} s) $(date -u +%T)"
      timeout -k 2 "$C" python -m pytest -v -p no:cacheprovider tests/kernels/test_moe_attn_gpu.py > "$D/attntest.log" 2>&1
      echo "attntest exit $? after $(( $(date +%s) - START )) s"
      grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" "$D/attntest.log" | tail -n 20 ;;
    pftest)
      C=$(( L < 25 ? L : 25 )); echo "== pftest: test_moe_prefetch_gpu.py (cap ${C} s) $(date -u +%T)"
      timeout -k 2 "$C" python -m pytest -v -p no:cacheprovider tests/kernels/test_moe_prefetch_gpu.py \
        tests/kernels/test_moe_norm_qkv_gpu.py > "$D/pftest.log" 2>&1
      echo "pftest exit $? after $(( $(date +%s) - START )) s"
      grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" "$D/pftest.log" | tail -n 20 ;;
    attnbench)
      C=$(( L < 40 ? L : 40 )); echo "== attnbench: moe_attn_bench.py (cap ${C} s) $(date -u +%T)"
      timeout -k 2 "$C" python benchmarks/moe_attn_bench.py --json "$D/attnbench/attn_bench.json" > "$D/attnbench.log" 2>&1
      echo "attnbench exit $? after $(( $(date +%s) - START )) s"; grep -E "^\{|Error" "$D/attnbench.log" | cut -c1-400 ;;
    tests)
      echo "== tests (cap ${L} s) $(date -u +%T)"
      # OCTAVO_TRITON_GEMV=0: no per-shape GEMV autotuning while the tiny engines start (not what this checks)
      OCTAVO_TRITON_GEMV=0 OCTAVO_MOE_CONFIG_DIR= timeout -k 2 "$L" python -m pytest -v -p no:cacheprovider \
        tests/kernels/test_moe_attn_gpu.py tests/kernels/test_moe_gpu.py -k "one_launch or batch_one or two_launch or parity" \
        > "$D/tests.log" 2>&1
      echo "tests exit $? after $(( $(date +%s) - START )) s"
      grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$D/tests.log" | tail -n 20 ;;
    *) echo "unknown part $PART (attn prefetch ab pftest attntest attnbench bs1 layer bench tput mixtral tests)"; exit 2 ;;
  esac
done
for f in "$D"/*/*.json; do [ -f "$f" ] && { echo "--- $f"; head -c 1500 "$f"; echo; }; done
