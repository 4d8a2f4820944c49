#!/usr/bin/env bash
# Start time of the Llama-3-8B shape (issue 17 item 4), engineer "startup", GPU batch 1 (<= 75 s, one GPU):
# dummy weights cold/warm Triton cache (config now read without transformers), then a 16 GB bf16 safetensors
# checkpoint written to local disk and loaded with the new zero-copy reader; then, as far as 72 s allow, the config
# read by transformers (same batch A/B) and the old get_tensor reader.
# Also keeps the cold run's Triton cache (tar.gz) to see what shipping it with the install would take.
# JSON: $OUT/startup/start.json ; log: $OUT/startup/log.txt
set -u
cd "$(dirname "$0")/../.."
R="$OUT/startup"; mkdir -p "$R"
ST=$(mktemp -d -p "${STARTUP_ST_ROOT:-/tmp}" st8b.XXXX)
trap 'rm -rf "$ST"' EXIT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git rev-parse HEAD; df -h "$ST"; findmnt -T "$ST" -o FSTYPE,SOURCE;
  python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_capability())"; } > "$R/env.txt" 2>&1
timeout -k 3 "${STARTUP_LIMIT:-72}" python benchmarks/gpu_start.py ${STARTUP_VARIANTS:-new_cold new_warm st_warm tfconfig_warm st_old_warm} \
  --timeout 40 --st-dir "$ST/llama8b" --keep-cache "$R/triton_cache_cold.tar.gz" --out "$R/start.json" > "$R/log.txt" 2>&1
echo "exit $?"; cat "$R/env.txt"; head -c 4000 "$R/start.json" 2>/dev/null
