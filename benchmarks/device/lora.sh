#!/usr/bin/env bash
# Issue 13 (engineer "lora"), BATCH 2: the GPU goal number. ONE GPU. HARD bound 60 s (timeout 57 s inside).
# Writes JSON + log to $OUT/lora/. Runs from the repo root (the lead has run `pip install -e .`).
#   1. throughput: the FULL Llama-3-8B shape (32 layers), random weights, bf16, batch 64 (prompt 128, 64 new
#      tokens), two engines one after the other: base alone (no LoRA) | LoRA with the default kernel choice
#      (OCTAVO_LORA_KERNEL=auto: decode graphs captured with the fixed-grid Triton SGMV op, eager prefill on the
#      torch layouts), timing base requests and the batch mixed over 8 rank-16 adapters (all 7 projections).
#   2. parity (what is left): a tiny fp32 Llama, 5 adapters (one with an embedding LoRA) mixed with the base
#      model: graph engine (decode steps with adapters replayed) vs enforce_eager engine, greedy tokens per
#      request, for kernel choices auto then triton (tests/lora/test_lora_gpu.py's engine check, in-process).
# Batch 1 (20:45, 16 layers, all ops + op-level parity) is recorded in docs/performance.md.
# Dry run on CPU: OUT=/tmp/x LORA_SHAPE=tiny LORA_LAYERS=2 PATH=.venv/bin:$PATH bash benchmarks/device/lora.sh
set -u
R="${OUT:-/tmp/out}/lora"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
echo "== lora: start $(date -u +%T)"
timeout -k 2 57 python3 benchmarks/lora_gpu.py --shapes "${LORA_SHAPE:-8b}" --layers "${LORA_LAYERS:-32}" \
  --engines base auto --repeats 2 --budget-s 55 --engine-s 8 --parity auto triton --out "$R" 2>&1 \
  | grep -v -E "Loading weights|it/s\]" | tee "$R/lora.log" | grep -E "lora_gpu|Error|error" | tail -30
echo "lora exit ${PIPESTATUS[0]} at ${SECONDS}s $(date -u +%T)" | tee -a "$R/exits.txt"
