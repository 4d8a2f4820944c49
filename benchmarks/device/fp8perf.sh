#!/usr/bin/env bash
# Issue 9, engineer "fp8perf": fp8 linear layers on one H100, HARD bound 60 s. Kind: nvidia-h100-x1.
# benchmarks/fp8perf.py in ONE process, sections in this order, each skipped (and said so) when its 52 s budget
# runs short:
#  1. Llama-3-8B shape (32 layers, dummy weights) through LLM: fp8 then bf16 batch-1 decode ms/token, graph
#     replay alone, fraction of the roofline (weight bytes / copy bandwidth measured in the run); a short
#     offline run (32 x 512/128, max_num_seqs 32). The engine checks every fp8 kernel against its reference on
#     the device at load (counts in the JSON);
#  2. parity: GPU checks of tests/quant/test_fp8_gemv.py and test_fp8_fused.py (fp8 GEMV vs float64 and
#     _scaled_mm; quantizing RMSNorm / SiLU-and-mul vs the plain fused kernels + quantize_per_token, bytes
#     equal; CUDA-graph replay of the fp8 paths and of a linked norm -> fp8 linear -> SiLU -> fp8 linear block);
#  3. if time is left: fp8 batch-1 again with async_scheduling=True (host work overlapped), then
#     the projections of 8 layers of the 8B shape (every layer its own weights) in one CUDA graph per variant
#     and row count 1..256: bf16 cuBLAS / Triton GEMV, fp8 quantize + _scaled_mm, _scaled_mm on prequantized
#     input, fp8 GEMV; then per projection at one row.
# JSON: $OUT/fp8perf/fp8perf.json, log: $OUT/fp8perf/fp8perf.log
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/${FP8PERF_DIR:-fp8perf}"
mkdir -p "$R"
echo "== fp8perf $(date -u +%T)"
# FP8PERF_SECTIONS / FP8PERF_BUDGET / FP8PERF_TIMEOUT: a shorter rerun (benchmarks/device/fp8perf_b2.sh)
timeout -k 3 "${FP8PERF_TIMEOUT:-57}" python3 benchmarks/fp8perf.py --out "$R/fp8perf.json" \
  --budget "${FP8PERF_BUDGET:-52}" --sections "${FP8PERF_SECTIONS:-fp8,bf16,parity,fp8_async,linears}" \
  > "$R/fp8perf.log" 2>&1
echo "exit $? $(date -u +%T)"
grep -v " INFO " "$R/fp8perf.log" | grep -E "^(parity|e2e|linears|==)|Error|error" | tail -40
