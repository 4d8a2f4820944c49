#!/usr/bin/env bash
# MoE models on one GPU (issue 17 item 3 Done-when), HARD bound 74 s per part. Usage: moe_model.sh 1|2
#  part 1: (a) one layer at batch 1 (benchmarks/moe_bench.py, M=1: direct layout without the align launch, Triton
#          routing; quick M=1 tile search for Qwen3-30B-A3B first, its configs used by everything after), then
#          (b) MODEL-level batch-1 decode vs the roofline over the bytes actually read (routed experts only):
#          Qwen3-30B-A3B shape, all 48 layers; Mixtral-8x7B shape, 16 of its 32 layers (47 GB of bf16 weights);
#          dummy weights, bf16, CUDA graphs, through LLM (benchmarks/moe_e2e.py bs1).
#  part 2: throughput 256 x 512/512 (octavo) vs transformers (random init on the GPU, bf16) on the same shapes with
#          fewer layers (Qwen3-30B-A3B 8, Mixtral-8x7B 4) in the same process; transformers runs the longest output
#          that fits its time (octavo runs that length too); then the tiny-model parity tests vs a float32 oracle
#          (tests/kernels/test_moe_gpu.py -k parity) with the time left.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
PART=${1:-${MOE_PART:-1}}
D="$OUT/moe_model"
mkdir -p "$D/configs"
START=$(date +%s)
left() { echo $(( 74 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader > "$D/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$D/commit.txt" 2>/dev/null || true
cp plugins/platforms/moe_configs/*.json "$D/configs/"  # the tuner merges into the shipped tables
export OCTAVO_MOE_CONFIG_DIR="$D/configs"
if [ "$PART" = 1 ]; then
  echo "== layer bench (cap 17 s) $(date -u +%T)"
  timeout -k 2 17 python benchmarks/moe_bench.py --shapes qwen3-30b-a3b mixtral-8x7b --batch-sizes 1 \
    --tune-shapes qwen3-30b-a3b --tune-batch-sizes 1 --tune-budget-s 5 --tune-out "$D/configs" \
    --json "$D/layer.json" > "$D/layer.log" 2>&1
  echo "layer exit $? after $(( $(date +%s) - START )) s"; grep -E "M=1|tuned|bandwidth" "$D/layer.log" | cut -c1-900
  L=$(left); echo "== model bs1 (cap ${L} s) $(date -u +%T)"
  timeout -k 2 "$L" python benchmarks/moe_e2e.py --tasks bs1:qwen3-30b-a3b:48 bs1:mixtral-8x7b:16 \
    --deadline-s $(( L - 3 )) --out-dir "$D" > "$D/bs1.log" 2>&1
  echo "bs1 exit $? after $(( $(date +%s) - START )) s"
fi
if [ "$PART" != 1 ]; then
  L=$(left); echo "== throughput vs transformers (cap ${L} s) $(date -u +%T)"
  timeout -k 2 "$L" python benchmarks/moe_e2e.py --tasks tf:qwen3-30b-a3b:8 tput:qwen3-30b-a3b:8 \
    tf:mixtral-8x7b:4 tput:mixtral-8x7b:4 --tf-budget-s 5 --deadline-s $(( L - 3 )) --out-dir "$D" > "$D/tput.log" 2>&1
  echo "tput exit $? after $(( $(date +%s) - START )) s"
fi
L=$(left)
if [ "$L" -ge 22 ]; then  # part 1 too, when its engines started fast enough
  echo "== parity tests (cap ${L} s) $(date -u +%T)"
  OCTAVO_TRITON_GEMV=0 OCTAVO_MOE_CONFIG_DIR= timeout -k 2 "$L" python -m pytest -v -s -p no:cacheprovider \
    tests/kernels/test_moe_gpu.py -k "batch_one or (parity and Qwen3)" > "$D/parity.log" 2>&1
  echo "parity exit $? after $(( $(date +%s) - START )) s"
  grep -E "PASSED|FAILED|ERROR|passed|failed|Error|tokens, " "$D/parity.log" | tail -n 12
else
  echo "parity tests skipped: ${L} s left"
fi
for f in "$D"/*.json; do [ -f "$f" ] && { echo "--- $f"; head -c 1500 "$f"; echo; }; done
grep -E "^skip|Error|error" "$D"/*.log | head -n 20
