#!/usr/bin/env bash
# Issue 13 (engineer "lora"): LoRA decode steps captured in CUDA graphs. ONE GPU. HARD bound 75 s (timeouts inside).
# Writes JSON + logs to $OUT/lora/. Runs from the repo root (the lead has run `pip install -e .`).
#   1. parity (<= 30 s): tests/lora/test_lora_gpu.py: the static LoRA ops (dense torch, fused, Triton SGMV)
#      replayed in a CUDA graph == eager for 6 adapter mixes, and vs a float64 oracle (bf16 at the 8B q/k/v width,
#      fp32); a tiny fp32 Llama engine with 5 PEFT adapters mixed with the base model: decode steps with adapters
#      replay graphs and greedy tokens == an enforce_eager engine (+ peft where installed), each op;
#      plus the eager Triton kernel check (tests/lora/test_lora_ops.py::test_triton_kernels_on_cuda).
#   2. throughput (the rest, <= 43 s): Llama-3-8B WIDTHS with 16 of its 32 layers (3 engine loads of the full
#      8B do not fit 75 s), random weights, bf16, batch 64 (prompt 128, 64 new tokens), engines one after the
#      other: base alone (no LoRA) | LoRA with the dense torch graph op | the Triton SGMV graph op | dense with
#      the Triton masked expand (OCTAVO_LORA_KERNEL=fused; the last engines are skipped if time runs out); each
#      LoRA engine times base requests and the batch mixed over 8 rank-16 adapters (all 7 projections).
# Dry run on CPU: OUT=/tmp/x LORA_SHAPE=tiny PATH=.venv/bin:$PATH bash benchmarks/device/lora.sh
set -u
R="${OUT:-/tmp/out}/lora"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
echo "== lora: parity $(date -u +%T)"
timeout -k 2 30 python3 -m pytest -v -p no:cacheprovider tests/lora/test_lora_gpu.py \
  tests/lora/test_lora_ops.py::test_triton_kernels_on_cuda 2>&1 | tee "$R/parity.log" \
  | grep -E "PASSED|FAILED|SKIPPED|ERROR|Error|passed|failed" | tail -20
echo "parity exit ${PIPESTATUS[0]} at ${SECONDS}s" | tee -a "$R/exits.txt"
LEFT=$((73 - SECONDS))
echo "== lora: throughput $(date -u +%T), ${LEFT}s left"
timeout -k 2 "$LEFT" python3 benchmarks/lora_gpu.py --shapes "${LORA_SHAPE:-8b}" --layers "${LORA_LAYERS:-16}" \
  --engines base torch triton fused --repeats 2 --budget-s $((LEFT - 3)) --engine-s 9 --out "$R" 2>&1 \
  | grep -v -E "Loading weights|it/s\]" | tee "$R/lora.log" | grep -E "lora_gpu|Error|error" | tail -30
echo "throughput exit ${PIPESTATUS[0]} at ${SECONDS}s $(date -u +%T)" | tee -a "$R/exits.txt"
