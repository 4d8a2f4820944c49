#!/usr/bin/env bash
# LLM(...) start time on the Llama-3-8B shape, fresh processes (issue 17 item 4). JSON: $OUT/start/start.json
# Default variants (session 5): noship_cold (Triton compiles everything: a GPU/Triton with no shipped kernels),
# new_cold (fresh machine: only the kernels shipped with the install, plugins/platforms/cuda_kernel_cache.py), new_warm (the cache of
# the previous cold run), st_warm (a 16 GB bf16 safetensors checkpoint written to local disk first, then loaded).
set -u
cd "$(dirname "$0")/../.."
R="$OUT/start"; mkdir -p "$R"
ST=$(mktemp -d -p "${START_ST_ROOT:-/tmp}" st8b.XXXX)
trap 'rm -rf "$ST"' EXIT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git rev-parse HEAD; df -h "$ST"; findmnt -T "$ST" -o FSTYPE,SOURCE; } > "$R/env.txt" 2>&1
timeout -k 5 "${START_LIMIT:-230}" python benchmarks/gpu_start.py ${START_VARIANTS:-noship_cold new_cold new_warm st_warm} \
  --st-dir "$ST/llama8b" --out "$R/start.json"
echo "exit $?"; cat "$R/env.txt"; cat "$R/start.json" 2>/dev/null | head -c 3000
