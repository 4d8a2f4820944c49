#!/usr/bin/env bash
# Issue 13 (engineer "lora"): LoRA on one GPU. Kind: nvidia-h100-x1. HARD bound 60 s (timeout 58 s inside).
# Writes JSON + log to $OUT/lora/. Runs from the repo root (the lead has run `pip install -e .`).
#   1. kernel check: the Triton SGMV-style shrink/expand (octavo/lora/triton_ops.py) vs a float64 oracle and the
#      torch op, bf16 at 8B widths (tests/lora/test_lora_ops.py::test_triton_kernels_on_cuda, called in-process).
#   2. throughput: a random-weight (load_format=dummy) Llama-3-8B shape, bf16, batch 64 greedy requests
#      (prompt 128, 64 new tokens), base alone vs mixed over 8 rank-16 adapters on all 7 projections, one
#      engine, one round: base, mixed (Triton op), mixed (torch op). Then the same on a ~1B shape
#      (hidden 2048, 16 layers) if the time left allows. Each shape's JSON is written when it finishes.
# Dry run on CPU: LORA_SHAPES=tiny OUT=/tmp/x PATH=.venv/bin:$PATH benchmarks/device/lora.sh
set -u
R="${OUT:-/tmp/out}/lora"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
echo "== lora: start $(date -u +%T)"
timeout -k 2 57 python3 benchmarks/lora_gpu.py --shapes ${LORA_SHAPES:-8b 1b} --budget-s 55 --repeats 1 --torch-too --out "$R" 2>&1 \
  | grep -v -E "Loading weights|it/s\]" | tee "$R/lora.log" | grep -E "lora_gpu|Error|error" | tail -30
echo "lora exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$R/exits.txt"
