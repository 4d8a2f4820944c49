#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), session 8, one GPU, HARD bound 75 s for the whole call. JSON + logs: $OUT/fp8/
#   bash benchmarks/device/fp8_8.sh [PART ...]      (default: attn probe; parts run in the order given)
# Parts (each gets what is left of the 75 s, minus what the later parts reserve):
#   attn   benchmarks/fp8_attn7.py --set ${FP8_ATTN_SET:-s8}: decode attention on the e4m3 cache at 512 requests x
#          U[1000, 2000]: the engine's fp8 launch, the bf16 cache's rate, the e4m3 dots on the stored tiles (qk8/pv8)
#   probe  benchmarks/fp8_jit_probe.py --variant ${FP8_PROBE_VARIANT:-fp8}: the e2e 512 x 1000/1000 schedule on a
#          2-layer Llama-3-8B shape with the real run's KV blocks: which Triton kernels build inside the timed run
#          after gpu_e2e's warm-up, with their specialization keys
#   probe_bf16  the same for the bf16 run (26,420 blocks)
#   tests  GPU tests of the fp8-KV decode kernel (tests/quant/test_fp8_kv_decode.py -m gpu)
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
T0=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short > "$R/tree_status.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(attn probe probe_bf16)
reserve() {  # seconds the parts after $1 keep for themselves
  local after=0 r=0 p
  for p in "${PARTS[@]}"; do
    if [ "$after" = 1 ]; then case $p in probe) r=$((r + 34));; probe_bf16) r=$((r + 12));; attn) r=$((r + 18));; tests) r=$((r + 20));; *) r=$((r + 10));; esac; fi
    [ "$p" = "$1" ] && after=1
  done
  echo $r
}
for P in "${PARTS[@]}"; do
  B=$(( $(left) - $(reserve "$P") ))
  echo "== $P $(date -u +%T) (${B} s for it, $(left) s left)"
  if [ "$B" -lt 8 ]; then echo "skipped: no time"; continue; fi
  case $P in
    attn) timeout -k 2 "$B" python benchmarks/fp8_attn7.py --set "${FP8_ATTN_SET:-s8}" --budget $(( B - 4 )) \
            --out "$R/attn8.json" ${FP8_ATTN_VARIANTS:+--variants "$FP8_ATTN_VARIANTS"} > "$R/attn8.log" 2>&1
          echo "exit $?"; cut -c1-300 "$R/attn8.log" | tail -20;;
    probe|probe_bf16) V=${FP8_PROBE_VARIANT:-fp8}; [ "$P" = probe_bf16 ] && V=bf16
           timeout -k 2 "$B" python benchmarks/fp8_jit_probe.py --variant "$V" --layers "${FP8_PROBE_LAYERS:-2}" \
             --warm "${FP8_PROBE_WARM:-e2e}" --out "$R/probe_$V.json" > "$R/probe_$V.log" 2>&1
           echo "exit $?"; grep -v " INFO \| WARNING " "$R/probe_$V.log" | grep -v "^BUILD" | cut -c1-700 | tail -12; grep -A1000 "TIMED RUN STARTS" "$R/probe_$V.log" | grep "^BUILD" | cut -c1-400 | head -8;;
    tests) timeout -k 2 "$B" python -m pytest -v -rA -m gpu -p no:cacheprovider tests/quant/test_fp8_kv_decode.py \
             ${FP8_TESTS_MORE:-} > "$R/tests.log" 2>&1
           echo "exit $?"; grep -E "PASSED|FAILED|passed|failed|Error|assert" "$R/tests.log" | tail -20;;
    *) echo "unknown part $P (attn probe tests)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
