#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), session 7, one GPU, HARD bound 75 s for the whole call. JSON + logs: $OUT/fp8/
#   bash benchmarks/device/fp8_7.sh [PART ...]      (default: tests bs1 attn; parts run in the order given)
# Parts (each gets what is left of the 75 s, minus what the later parts reserve):
#   tests  GPU tests, verbose (one line per test as it ends): the fp8-KV decode kernel vs float64 incl. the
#          engine's TABLE launch (tests/quant/test_fp8_kv_decode.py), the GEMV's W_BITS/REG_PF bit identity and
#          the split accumulator (default since batch 2) within a bf16 step (test_fp8_gemv_bits.py), the SiLU-GEMV
#          graph test that failed in session 6 batch 2; FP8_TESTS_MORE adds node ids.
#   bs1    benchmarks/fp8_bs1.py: 8B fp8 + fp8 KV batch-1 decode with the committed defaults, then in the same engine
#          (graph recaptured) FP8_BS1_VARIANTS (default x2d,acc0: prequantized x in the tile layout; the full accumulator, the batch-1 default).
#   attn   benchmarks/fp8_attn7.py --set ${FP8_ATTN_SET:-b2}: decode attention on the e4m3 cache at 512 requests:
#          the table launch vs the fp8 kernel's TABLE launch (the engine's now) and register caps / tiles around
#          it, and the bf16 cache's rate; FP8_ATTN_VARIANTS picks names.
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
[ ${#PARTS[@]} -eq 0 ] && PARTS=(tests bs1 attn)
reserve() {  # seconds the parts after $1 keep for themselves
  local after=0 r=0 p
  for p in "${PARTS[@]}"; do
    if [ "$after" = 1 ]; then case $p in tests) r=$((r + 30));; bs1) r=$((r + 28));; attn) r=$((r + 15));; *) r=$((r + 12));; esac; fi
    [ "$p" = "$1" ] && after=1
  done
  echo $r
}
for P in "${PARTS[@]}"; do
  B=$(( $(left) - $(reserve "$P") ))
  echo "== $P $(date -u +%T) (${B} s for it, $(left) s left)"
  if [ "$B" -lt 8 ]; then echo "skipped: no time"; continue; fi
  case $P in
    attn) timeout -k 2 "$B" python benchmarks/fp8_attn7.py --set "${FP8_ATTN_SET:-b2}" --budget $(( B - 4 )) \
            --out "$R/attn7.json" \
            ${FP8_ATTN_VARIANTS:+--variants "$FP8_ATTN_VARIANTS"} > "$R/attn7.log" 2>&1
          echo "exit $?"; cat "$R/attn7.log" | cut -c1-260 | tail -30;;
    tests) timeout -k 2 "$B" python -m pytest -v -rA -m gpu -p no:cacheprovider \
             tests/quant/test_fp8_kv_decode.py::test_fp8_kv_decode_on_cuda \
             tests/quant/test_fp8_gemv_bits.py::test_fp8_gemv_bits_on_cuda_bit_identical \
             tests/quant/test_fp8_silu_gemv.py::test_fp8_gemv_silu_on_cuda_in_a_graph ${FP8_TESTS_MORE:-} \
             > "$R/tests.log" 2>&1
           echo "exit $?"; grep -E "PASSED|FAILED|passed|failed|Error|assert" "$R/tests.log" | tail -20
           tail -c 1500 "$R/tests.log";;
    bs1) timeout -k 2 "$B" python benchmarks/fp8_bs1.py --budget $(( B - 8 )) --out "$R/bs1.json" \
           --ab s6 --variants "${FP8_BS1_VARIANTS:-x2d,acc0}" > "$R/bs1.log" 2>&1
         echo "exit $?"; grep -v " INFO \| WARNING " "$R/bs1.log" | tail -40;;
    *) echo "unknown part $P (attn tests bs1)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
