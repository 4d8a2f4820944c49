#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), one GPU, HARD bound 75 s for the whole call. JSON + logs: $OUT/fp8/
#   bash benchmarks/device/fp8_6.sh [PART ...]      (default: bs1 step; parts run in the order given)
# Parts (each gets what is left of the 75 s, minus what the later parts reserve):
#   bs1    benchmarks/fp8_bs1.py --ab s6: full Llama-3-8B shape, quantization=fp8 + kv_cache_dtype=fp8, batch-1
#          decode ms/token vs the fp8-bytes roofline (gpu_e2e.py's formula), captured forward, kernel table; then
#          per S6_VARIANTS (quantizing-norm warps, the GEMVs' L2 prefetch chain, PDL) the graph recaptured in the
#          same engine and the same numbers (before/after in one call); FP8_BS1_VARIANTS picks them.
#   tc     benchmarks/fp8_bs1.py --ab tc: every fp8 linear on the tensor-core GEMV (tiles from gemv.json if there).
#   gemv   benchmarks/fp8_gemv_bench.py: one-row GEMV per 8B shape, kernels x tiles (us, fraction of 3.35e12 B/s).
#   attn   benchmarks/fp8_attn_bench.py --set s5: decode attention, 200 requests x U[1000, 2000], fp8 / bf16 cache.
#   mm     benchmarks/fp8_attn_bench.py --set linears: one 8B layer's projections at 256 / 512 / 8192 rows, bf16 vs fp8
#          _scaled_mm, and fp8 with use_fast_accum (time, error vs float64).
#   step   benchmarks/fp8_step_profile.py --variant fp8: 8B shape, 8 layers, 512 x 1000/80 (per-step GPU / host
#          split, kernel tables of decode steps at the full batch).
#   tests  GPU-marked tests: prefetch / PDL (test_fp8_prefetch.py), fused producers incl. the one-row norm launch
#          (test_fp8_fused.py), fast accumulation's error (test_fp8_gemv.py); FP8_TESTS_MORE adds files.
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp8"
mkdir -p "$R"
T0=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(bs1 step)
reserve() {  # seconds the parts after $1 keep for themselves
  local after=0 r=0 p
  for p in "${PARTS[@]}"; do
    if [ "$after" = 1 ]; then case $p in tests) r=$((r + 22));; bs1|tc|step) r=$((r + 26));; mm) r=$((r + 8));; *) r=$((r + 12));; esac; fi
    [ "$p" = "$1" ] && after=1
  done
  echo $r
}
for P in "${PARTS[@]}"; do
  B=$(( $(left) - $(reserve "$P") ))
  echo "== $P $(date -u +%T) (${B} s for it, $(left) s left)"
  if [ "$B" -lt 8 ]; then echo "skipped: no time"; continue; fi
  case $P in
    bs1) timeout -k 2 "$B" python benchmarks/fp8_bs1.py --ab s6 --budget $(( B - 8 )) --out "$R/bs1.json" \
           --variants "${FP8_BS1_VARIANTS:-nosilu,pdl,platform_pdl_off,default_again}" > "$R/bs1.log" 2>&1
         echo "exit $?"; grep -v " INFO \| WARNING " "$R/bs1.log" | grep -v "^ .*us  x" | tail -30
         grep -A12 "^default {" "$R/bs1.log" | head -13;;
    tc) timeout -k 2 "$B" python benchmarks/fp8_bs1.py --ab tc --tiles "$R/gemv.json" --out "$R/bs1_tc.json" \
          > "$R/bs1_tc.log" 2>&1
        echo "exit $?"; grep -v " INFO \| WARNING " "$R/bs1_tc.log" | tail -30;;
    gemv) timeout -k 2 "$B" python benchmarks/fp8_gemv_bench.py --budget $(( B - 4 )) --out "$R/gemv.json" \
            > "$R/gemv.log" 2>&1
          echo "exit $?"; tail -40 "$R/gemv.log";;
    attn) timeout -k 1 "$B" python benchmarks/fp8_attn_bench.py --set s5 --budget $(( B - 3 )) --batch 200 \
            --ctx-lo 1000 --ctx-hi 2000 --out "$R/attn.json" > "$R/attn.log" 2>&1
          echo "exit $?"; tail -12 "$R/attn.log";;
    mm) timeout -k 1 "$B" python benchmarks/fp8_attn_bench.py --set linears --rows 256,512,8192 \
          --budget $(( B - 3 )) --out "$R/mm.json" > "$R/mm.log" 2>&1
        echo "exit $?"; tail -12 "$R/mm.log";;
    step) OCTAVO_FP8_GEMV_MAX_M=0 timeout -k 2 "$B" python benchmarks/fp8_step_profile.py --variant fp8 \
            --out-len 80 --out "$R/step_fp8.json" > "$R/step_fp8.log" 2>&1
          echo "exit $?"; grep -v " INFO \| WARNING " "$R/step_fp8.log" | tail -50;;
    tests) timeout -k 2 "$B" python -m pytest -q -m gpu -p no:cacheprovider tests/quant/test_fp8_prefetch.py \
             tests/quant/test_fp8_fused.py tests/quant/test_fp8_gemv.py::test_fast_accum_switch_stays_within_the_fp8_error \
             ${FP8_TESTS_MORE:-} > "$R/tests.log" 2>&1
           echo "exit $?"; grep -E "passed|failed|FAILED|Error" "$R/tests.log" | tail -15;;
    *) echo "unknown part $P (bs1 tc gemv attn mm step tests)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
