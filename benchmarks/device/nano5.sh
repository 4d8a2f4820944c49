#!/usr/bin/env bash
# Issue 17, engineer "nano" (session 5): the fused Triton sampler (core/sampler_triton.py) on one GPU, hard bound 75 s.
# JSON + logs under $OUT/nano5/:
#   1. cases.log: tests/kernels/fused_sampler_cases.py on CUDA (vocab 151,936): kernel == Gumbel-max over its own
#      noise, greedy == torch argmax (ties), noise KS/independence, chi-square of 40k draws vs softmax, seeds,
#      logit processors, routing.
#   2. nano_sampler.json: nano-vllm workload (Qwen3-0.6B shape, 256 x U[100,1024], temp 0.6) with the fused then the
#      torch sampler in ONE engine (same card, back to back), then a kernel table of decode steps (batch 128).
#   3. sampler_bench.json: sampler alone, torch vs fused, rows 1/64/256 x 151,936, fp32 and bf16 logits;
#      qk_bench.json: Qwen3 q/k norm + rope, eager kernels vs the one fused kernel, 28 layers in a CUDA graph.
#   (cases.log also runs tests/kernels/qk_norm_rope_cases.py: the fused q/k norm + rope vs the eager layers.)
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano5"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}

echo "== cases $(date -u +%T)"
timeout -k 2 16 python -m pytest -q -x -p no:cacheprovider tests/kernels/fused_sampler_cases.py \
  tests/kernels/qk_norm_rope_cases.py > "$R/cases.log" 2>&1
echo "cases exit $?"; tail -n 15 "$R/cases.log"

CAP=$(( $(left) - 8 ))
echo "== nano-vllm fused vs torch sampler (cap $CAP s) $(date -u +%T)"
timeout -k 2 "$CAP" python benchmarks/nano_sampler.py --out "$R/nano_sampler.json" --budget-s $(( CAP - 2 )) \
  ${NANO5_ARGS:-} > "$R/nano_sampler.log" 2>&1
echo "nano exit $?"; grep -v "^\[transformers\]" "$R/nano_sampler.log" | tail -n 45

CAP=$(( $(left) ))
if [ "$CAP" -gt 3 ]; then
  echo "== sampler microbench, then qk norm + rope bench (cap $CAP s) $(date -u +%T)"
  timeout -k 2 "$CAP" python benchmarks/sampler_bench.py --out "$R/sampler_bench.json" --qk-out "$R/qk_bench.json" \
    > "$R/sampler_bench.log" 2>&1
  echo "micro exit $?"; tail -n 12 "$R/sampler_bench.log"
fi
echo "total $(( $(date +%s) - START )) s"
