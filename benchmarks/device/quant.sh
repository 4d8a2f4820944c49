#!/usr/bin/env bash
# Issue 9 (engineer "quant"): FP8 on one H100, ~250 s (hard cap 290 s). Kind: nvidia-h100-x1.
# benchmarks/quant_gpu.py in ONE process, same card: (1) tiny-Llama correctness of fp8 (online + pre-quantized) and
# GPTQ int4 on CUDA vs their dequantized dense runs; (2) the fused Triton fp8 activation-quant kernel vs torch on the
# device (bit mismatches); (3) Llama-3-8B shape, dummy weights: batch-1 decode ms/token + fraction of the roofline
# (weight bytes / measured copy bandwidth) for bf16, fp8 (fused quant) and fp8 (torch-op quant); offline throughput
# bf16 vs fp8 on 512 prompts x 1000 in / QUANT_OUT_LEN out (default 400, not the 1000: the 240 s budget).
# JSON: $OUT/quant/quant_gpu.json, log: $OUT/quant/quant_gpu.log
set -u
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "quant: pip install -e . failed (continuing)"
R="${OUT:-/tmp/out}/quant"
mkdir -p "$R"
echo "== quant: fp8 vs bf16, Llama-3-8B shape $(date -u +%T)"
timeout -k 5 290 python3 benchmarks/quant_gpu.py --out "$R/quant_gpu.json" --prompts 512 --in-len 1000 \
  --out-len "${QUANT_OUT_LEN:-400}" --offline "${QUANT_OFFLINE-bf16,fp8}" > "$R/quant_gpu.log" 2>&1
echo "exit $? $(date -u +%T)"
grep -v " INFO " "$R/quant_gpu.log" | tail -40
