#!/usr/bin/env bash
# Batch 2 (<= 45 s): the fused MoE kernel's end-to-end greedy parity on tiny Mixtral-like / Qwen3-MoE-like models,
# now against a float32 oracle (tests/kernels/test_moe_gpu.py -k parity); batch 1's moe.sh already gave the timings.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
D="$OUT/moe"
mkdir -p "$D"
START=$(date +%s)
git rev-parse HEAD > "$D/commit.txt" 2>/dev/null || true
OCTAVO_TRITON_GEMV=0 timeout -k 2 42 python -m pytest -v -s -p no:cacheprovider tests/kernels/test_moe_gpu.py -k parity \
  > "$D/parity.log" 2>&1
echo "parity tests exit $? after $(( $(date +%s) - START )) s"
grep -E "PASSED|FAILED|ERROR|passed|failed|Error|tokens, " "$D/parity.log" | tail -n 20
