#!/usr/bin/env bash
# Issue 9 item 4 (engineer "kvfp8"): FP8 KV cache on one H100, HARD bound 60 s (timeout 58). Kind: nvidia-h100-x1.
# benchmarks/kvfp8_gpu.py in one process (phases skip themselves when the 48 s budget runs short; the JSON is
# rewritten after each phase): (1) the Triton KV-write kernel's fp8 bytes vs torch's cast and the paged-attention
# kernel on an fp8 cache vs torch_sdpa; (2) tiny random Llama, triton backend, bf16 vs fp8 (e4m3/e5m2) cache:
# greedy agreement + worst logit error; (3) LLM with CUDA graphs, checkpoint k_scale/v_scale, kv auto vs fp8 at the
# same gpu_memory_utilization: KV blocks (~2x) and tokens; (4) if time is left: Llama-3-8B shape with 8 layers
# (not 32: the bound), dummy weights, offline 256 x 512/128, bf16 vs quantization=fp8 + kv_cache_dtype=fp8.
# JSON: $OUT/kvfp8/kvfp8_gpu.json, log: $OUT/kvfp8/kvfp8_gpu.log
set -u
R="${OUT:-/tmp/out}/kvfp8"
mkdir -p "$R"
echo "== kvfp8: fp8 KV cache $(date -u +%T)"
# phases 1-3 ran on H100 at 17:24 UTC (docs/performance.md, "FP8 KV cache"); a rerun takes only the throughput
# phase they left no time for (KVFP8_PHASES=kernels,model_parity,engines,throughput_8b_shape for all)
OCTAVO_DISABLE_PROGRESS=1 timeout -k 2 58 python3 benchmarks/kvfp8_gpu.py --out "$R/kvfp8_gpu.json" --budget 48 \
  --phases "${KVFP8_PHASES:-throughput_8b_shape}" > "$R/kvfp8_gpu.log" 2>&1
echo "exit $? $(date -u +%T)"
grep -v " INFO " "$R/kvfp8_gpu.log" | tail -30
