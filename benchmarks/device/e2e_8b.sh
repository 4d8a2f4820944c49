#!/usr/bin/env bash
# Llama-3-8B shape (dummy weights) batch-1 decode vs roofline + 512 x 1000/1000 throughput, one variant per call.
# E2E_VARIANT=bf16 | fp8 (quantization=fp8 + kv_cache_dtype=fp8, issue 9) ; E2E_LIMIT seconds; JSON under $OUT/e2e_<variant>/
set -u
cd "$(dirname "$0")/../.."
v=${E2E_VARIANT:-bf16}; R="$OUT/e2e_$v"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv"; git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then  # s9 batch 1: the package was not installed
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
fi
if [ "$v" = fp8 ]; then export OCTAVO_QUANTIZATION=fp8 OCTAVO_KV_CACHE_DTYPE=fp8; fi
timeout -k 5 "${E2E_LIMIT:-280}" python benchmarks/gpu_e2e.py decode_bs1 --throughput ${E2E_ARGS:-} --max-num-seqs 512 --out-dir "$R"
echo "exit $?"; cat "$R"/*.json 2>/dev/null | head -c 3000
