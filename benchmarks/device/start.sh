#!/usr/bin/env bash
# LLM(...) start time on the Llama-3-8B shape, dummy weights, fresh processes (issue 17 item 4). JSON: $OUT/start/start.json
set -u
cd "$(dirname "$0")/../.."
R="$OUT/start"; mkdir -p "$R"
timeout -k 5 "${START_LIMIT:-230}" python benchmarks/gpu_start.py ${START_VARIANTS:-new_cold new_warm} --out "$R/start.json"
echo "exit $?"; cat "$R/start.json" 2>/dev/null | head -c 3000
