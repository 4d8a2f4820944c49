#!/usr/bin/env bash
# Issue 16 (engineer "surface"): sleep mode on one GPU, ~60-120 s (hard cap 200 s). Kind: nvidia-h100-x1.
# Measures what LLM.sleep(1)/sleep(2) free (torch allocated/reserved and the device's used memory), wake_up time,
# greedy tokens equal before/after, and that sleep is refused while CUDA graphs are captured. A ~1B Llama shape
# with dummy weights (no download); then the real SmolLM2 if $SMOLLM2_GGUF is set. JSON: $OUT/surface/*.json
set -u
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "surface: pip install -e . failed (continuing)"
R="${OUT:-/tmp/out}/surface"
mkdir -p "$R"
echo "== surface: sleep mode, 1B dummy $(date -u +%T)"
timeout -k 5 120 python3 benchmarks/device/surface_sleep.py --device cuda --out "$R/sleep_1b_dummy.json" \
  > "$R/sleep_1b_dummy.log" 2>&1; echo "exit $?"; grep -v " INFO " "$R/sleep_1b_dummy.log" | tail -40
if [ -n "${SMOLLM2_GGUF:-}" ]; then
  echo "== surface: sleep mode, SmolLM2 $(date -u +%T)"
  timeout -k 5 80 python3 benchmarks/device/surface_sleep.py --device cuda --model "$SMOLLM2_GGUF" \
    --out "$R/sleep_smollm2.json" > "$R/sleep_smollm2.log" 2>&1; echo "exit $?"; tail -30 "$R/sleep_smollm2.log"
else
  echo "surface: SMOLLM2_GGUF unset: SmolLM2 run SKIPPED"
fi
