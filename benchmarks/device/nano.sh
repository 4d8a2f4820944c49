#!/usr/bin/env bash
# nano-vllm workload on the Qwen3-0.6B shape, async scheduling off then on (issue 17). JSON under $OUT/nano_{sync,async}/
set -u
cd "$(dirname "$0")/../.."
for mode in ${NANO_MODES:-sync async}; do  # NANO_MODES=async: the async run only
  R="$OUT/nano_$mode"; mkdir -p "$R"
  export OCTAVO_ASYNC_SCHEDULING=$([ $mode = async ] && echo true || echo false)  # default is on on CUDA now
  timeout -k 5 "${NANO_LIMIT:-120}" python benchmarks/gpu_e2e.py qwen3_nanovllm ${NANO_ARGS:-} --out-dir "$R"
  echo "$mode exit $?"; cat "$R"/*.json 2>/dev/null | head -c 1500; echo
done
