#!/usr/bin/env bash
# MoE on one GPU, session 6 (issue 17, MoE keys), HARD bound 74 s per part. Usage: moe6.sh 1|2|3
#  part 1: (a) benchmarks/moe_decode_bench.py: one layer at batch 1, the two-launch path (routing fused into
#          the w13 GEMV, the top-k weighted sum into the w2 GEMV) vs the general kernel + routing kernel (4
#          launches), a short tile search for the two-launch path (best tiles -> $D/configs, used after);
#          (b) Qwen3-30B-A3B shape, all 48 layers, batch-1 decode vs the roofline over the bytes read (routed
#          experts only) through LLM, with --profile: the captured forward's kernel table, and an A/B that
#          re-captures the batch-1 forward with the general kernel (benchmarks/moe_profile.py).
#  part 2: Qwen3-30B-A3B shape with 8 of 48 layers: octavo 256 x 512/512 (+ /64), then transformers in the same
#          process: 256 x 512/512 if it fits 12 s, else FEWER requests x 512/512, else 256 x 512/shorter
#          (moe_e2e.py tput + tf --tf-fewer-prompts); then the MoE GPU tests when >= 16 s are left.
#  part 3: part 1 (b) again (after changes), then Mixtral-8x7B with 8 of 32 layers, batch 1 if time is left.
#  part 4: Mixtral-8x7B with 8 of 32 layers: one octavo engine (batch 1 + 256 x 512/512 + /64), then transformers
#          as in part 2 (fewer requests x 512/512 if 256 do not fit).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
PART=${1:-1}
D="$OUT/moe6/part$PART"
mkdir -p "$D/configs"
START=$(date +%s)
BOUND=74
left() { echo $(( BOUND - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader > "$D/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$D/commit.txt" 2>/dev/null || true
git status --short -- plugins/platforms benchmarks > "$D/dirty.txt" 2>/dev/null || true
cp plugins/platforms/moe_configs/*.json "$D/configs/"
export OCTAVO_MOE_CONFIG_DIR="$D/configs"
if [ "$PART" = 1 ]; then
  echo "== decode layer bench (cap 24 s) $(date -u +%T)"
  timeout -k 2 24 python benchmarks/moe_decode_bench.py --shapes qwen3-30b-a3b mixtral-8x7b --budget-s 7 2 \
    --config-dir "$D/configs" --json "$D/decode_layer.json" > "$D/decode_layer.log" 2>&1
  echo "decode bench exit $? after $(( $(date +%s) - START )) s"; grep -E "bandwidth|: \{" "$D/decode_layer.log" | cut -c1-700
fi
if [ "$PART" = 1 ] || [ "$PART" = 3 ]; then
  L=$(left); echo "== Qwen3-30B-A3B 48L bs1 + profile (cap ${L} s) $(date -u +%T)"
  TASKS="bs1:qwen3-30b-a3b:48"; [ "$PART" = 3 ] && TASKS="$TASKS bs1:mixtral-8x7b:8"
  timeout -k 2 "$L" python benchmarks/moe_e2e.py --tasks $TASKS --profile --deadline-s $(( L - 3 )) \
    --out-dir "$D" > "$D/bs1.log" 2>&1
  echo "bs1 exit $? after $(( $(date +%s) - START )) s"
  grep -E "^\{|^skip|Error" "$D/bs1.log" | cut -c1-2500
fi
if [ "$PART" = 2 ] || [ "$PART" = 4 ]; then
  TASKS="tput:qwen3-30b-a3b:8 tf:qwen3-30b-a3b:8"; [ "$PART" = 4 ] && TASKS="both:mixtral-8x7b:8 tf:mixtral-8x7b:8"
  L=$(left); echo "== $TASKS: octavo 256x512/512 then transformers (cap ${L} s) $(date -u +%T)"
  timeout -k 2 "$L" python benchmarks/moe_e2e.py --tasks $TASKS \
    --tf-budget-s 12 --tf-fewer-prompts --deadline-s $(( L - 3 )) --out-dir "$D" > "$D/tput.log" 2>&1
  echo "tput exit $? after $(( $(date +%s) - START )) s"
  grep -E "tok/s|^skip|Error" "$D/tput.log"
  L=$(left)
  if [ "$PART" = 2 ] && [ "$L" -ge 16 ]; then
    echo "== MoE GPU tests (cap ${L} s) $(date -u +%T)"
    OCTAVO_TRITON_GEMV=0 OCTAVO_MOE_CONFIG_DIR= timeout -k 2 "$L" python -m pytest -v -p no:cacheprovider \
      tests/kernels/test_moe_gpu.py -k "batch_one or two_launch" > "$D/tests.log" 2>&1
    echo "tests exit $? after $(( $(date +%s) - START )) s"
    grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$D/tests.log" | tail -n 12
  else
    echo "GPU tests skipped: ${L} s left"
  fi
fi
for f in "$D"/*.json; do [ -f "$f" ] && { echo "--- $f"; head -c 1200 "$f"; echo; }; done
