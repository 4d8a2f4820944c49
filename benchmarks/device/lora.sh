#!/usr/bin/env bash
# Issue 13 (engineer "lora"), session 5, batch 2. ONE GPU. HARD bound 75 s (timeouts inside; ~65 s expected).
# Writes JSON + logs to $OUT/lora/. Runs from the repo root (the lead has run `pip install -e .`).
#   1. per-op microbench (benchmarks/lora_ops_bench.py, <= 24 s): the LoRA ops of one decode step (batch 64,
#      8 slots, rank 16, 32 layers of 8B widths, block-diagonal B as the manager writes it, each in a CUDA graph)
#      for the dense op and the Triton SGMV op under several launch configs (checked against the dense op), with
#      the base linears next to them; and a 2048-token prefill step: torch layouts vs SGMV, eager and GPU-only.
#   2. the goal: the FULL Llama-3-8B shape (32 layers), random weights, bf16, batch 64 (prompt 128, 64 new
#      tokens), in one process: base alone | LoRA engine `auto` (the committed defaults: SGMV k_per_split=128 +
#      part_expand + static_h in graphs, SGMV for eager steps >= 512 tokens) | `k128` (batch 1's winner: no
#      part_expand / static_h); each times base requests and the batch mixed over 8 rank-16 adapters, 3 rounds.
#   3. graph parity: tiny fp32 Llama, 5 adapters mixed with the base model, graph engine vs enforce_eager engine
#      greedy tokens per request (kernel auto, the defaults with block_n=32 so that the tiny model's q/k/v (64/32/32)
#      and gate/up parts take the part_expand path), if time is left.
# Batch 1 (23:47 UTC) is recorded in docs/performance.md.
# Dry run on CPU: OUT=/tmp/x LORA_SHAPE=tiny LORA_LAYERS=2 PATH=.venv/bin:$PATH bash benchmarks/device/lora.sh
set -u
R="${OUT:-/tmp/out}/lora"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
echo "== lora: start $(date -u +%T)"
timeout -k 2 24 python3 benchmarks/lora_ops_bench.py --budget-s 14 --out "$R" > "$R/ops.log" 2>&1
echo "ops exit $? at ${SECONDS}s" | tee -a "$R/exits.txt"
grep "lora_ops" "$R/ops.log" | cut -c1-600 | tail -20
K128='k128=auto@OCTAVO_LORA_SGMV_CONFIG={"k_per_split":128,"part_expand":0,"static_h":0}'
LEFT=$((72 - SECONDS))
timeout -k 2 $LEFT python3 benchmarks/lora_gpu.py --shapes "${LORA_SHAPE:-8b}" --layers "${LORA_LAYERS:-32}" \
  --engines base auto "$K128" --repeats 3 --budget-s $((LEFT - 3)) --engine-s 8 --out "$R" \
  --parity 'parts32=auto@OCTAVO_LORA_SGMV_CONFIG={"block_n":32}' 2>&1 \
  | grep -v -E "Loading weights|it/s\]" | tee "$R/lora.log" | grep -E "lora_gpu|Error|error" | cut -c1-300 | tail -30
echo "lora exit ${PIPESTATUS[0]} at ${SECONDS}s $(date -u +%T)" | tee -a "$R/exits.txt"
