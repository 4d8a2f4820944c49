#!/usr/bin/env bash
# Issue 17 items 1-3 (engineer "asyncgpu"): where the GPU still waits with async scheduling ON (now the default
# on CUDA). One GPU, hard bound 75 s. JSON + logs under $OUT/asyncgpu/.
#   1. benchmarks/gpu_async_diag.py nano: nano-vllm workload (Qwen3-0.6B shape, b0 settings) with async on:
#      tok/s, time per step kind (decode-only / mixed / prefill-only), step-thread host ms per step, preemptions.
#   2. benchmarks/gpu_async_diag.py bs1: Llama-3-8B shape batch-1 decode, async on vs off in one engine
#      (interleaved), lm_head + argmax inside the graph vs eager, synchronizing calls, GPU idle gaps (profiler).
# ASYNCGPU_DRY=1: CPU dry run on a tiny random model. ASYNCGPU_PART=nano|bs1|both (default both).
# Batch 2 (session 4): ASYNCGPU_PART=nano ASYNCGPU_NANO_CAP=58 ASYNCGPU_NANO_ARGS="--switch-intervals 0.005 0.001"
#   (batch 1's nano part timed out in its 30 s cap at engine start, before printing anything).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/asyncgpu"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( ${1:-75} - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
EXTRA=(); [ "${ASYNCGPU_DRY:-0}" = 1 ] && EXTRA=(--device cpu --tiny)
NANO=(--requests 256); [ "${ASYNCGPU_DRY:-0}" = 1 ] && NANO=(--requests 16 --hi 64)
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}

PART=${ASYNCGPU_PART:-both}  # batch 2 (session 4): ASYNCGPU_PART=nano ASYNCGPU_NANO_CAP=58
if [ "$PART" != bs1 ]; then
  CAP=${ASYNCGPU_NANO_CAP:-30}
  echo "== nano (cap $CAP s) $(date -u +%T)"
  timeout -k 2 "$CAP" python benchmarks/gpu_async_diag.py nano "${NANO[@]}" "${EXTRA[@]}" ${ASYNCGPU_NANO_ARGS:-} \
    --out "$R/nano.json" > "$R/nano.log" 2>&1
  echo "nano exit $?"; grep -v "^\[transformers\]" "$R/nano.log" | head -c 6000; echo
fi
[ "$PART" = nano ] && { echo "total $(( $(date +%s) - START )) s"; exit 0; }
L=$(left 73)
echo "== bs1 (cap ${L} s) $(date -u +%T)"
timeout -k 2 "$L" python benchmarks/gpu_async_diag.py bs1 --tokens 192 "${EXTRA[@]}" --out "$R/bs1.json" \
  > "$R/bs1.log" 2>&1
echo "bs1 exit $?"; grep -v "^\[transformers\]" "$R/bs1.log" | head -c 6000; echo
echo "total $(( $(date +%s) - START )) s"
