#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), ONE device script with parts (sessions 6-8; replaces fp8_6.sh and fp8_7.sh, whose parts
# keep their names here). One GPU, HARD bound 75 s for the whole call. JSON + logs: $OUT/fp8/
#   bash benchmarks/device/fp8_8.sh [PART ...]      (default: one bs1; parts run in the order given)
# Each part gets what is left of the 75 s minus what the later parts reserve (RESERVE below: pick parts whose
# reserves add up to <= 73, or the early ones are cut; session 8 batch 1 asked for 88 and every part was cut).
#   attn        benchmarks/fp8_attn7.py --set ${FP8_ATTN_SET:-b2}: decode attention on the e4m3 cache, 512 requests x
#               U[1000, 2000]: the table launch, the engine's fp8 launch, the bf16 cache's rate, register caps;
#               FP8_ATTN_SET=b1 is session 7's batch-1 set, FP8_ATTN_VARIANTS picks names
#   probe       benchmarks/fp8_jit_probe.py: the e2e 512 x 1000/1000 schedule on a ${FP8_PROBE_LAYERS:-2}-layer
#               Llama-3-8B shape with the real run's KV blocks: Triton kernels built INSIDE the timed run after
#               gpu_e2e's warm-up (FP8_PROBE_WARM=e2e|extra), with their specialization keys; probe_bf16: bf16 run
#   bs1         benchmarks/fp8_bs1.py --ab s6: 8B fp8 + fp8 KV batch-1 decode (ms/token, roofline fraction, kernel
#               table), then FP8_BS1_VARIANTS (default one,one_w8,one_s8,default_again: the one-launch batch-1 fp8
#               attention, _fp8_kv_decode_bs1.py, then the defaults again) recaptured in the same engine
#   tests       GPU tests: fp8-KV decode kernel vs float64 (incl. the TABLE launch), GEMV bit identity, SiLU GEMV graph;
#               tests6: prefetch / PDL, fused producers, fast accumulation's error; FP8_TESTS_MORE adds node ids
#   one         GPU test of the one-launch batch-1 fp8 attention (tests/quant/test_fp8_decode_one.py -m gpu)
#   tc          benchmarks/fp8_bs1.py --ab tc: every fp8 linear on the tensor-core GEMV
#   gemv        benchmarks/fp8_gemv_bench.py: one-row GEMV per 8B shape, kernels x tiles
#   attn5       benchmarks/fp8_attn_bench.py --set s5: decode attention, 200 requests x U[1000, 2000]
#   mm          benchmarks/fp8_attn_bench.py --set linears: one 8B layer's projections at 256/512/8192 rows
#   step        benchmarks/fp8_step_profile.py --variant fp8: 8 layers, 512 x 1000/80, per-step GPU/host split
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
[ ${#PARTS[@]} -eq 0 ] && PARTS=(one bs1)
declare -A RESERVE=([one]=18 [attn]=14 [probe]=45 [probe_bf16]=40 [bs1]=45 [tests]=30 [tests6]=22 [tc]=26 [gemv]=12
                    [attn5]=12 [mm]=8 [step]=26)
reserve() {  # seconds the parts after $1 keep for themselves
  local after=0 r=0 p
  for p in "${PARTS[@]}"; do
    [ "$after" = 1 ] && r=$((r + ${RESERVE[$p]:-10}))
    [ "$p" = "$1" ] && after=1
  done
  echo $r
}
quiet() { grep -v " INFO \| WARNING " "$1" | cut -c1-700 | tail -"${2:-20}"; }
for P in "${PARTS[@]}"; do
  B=$(( $(left) - $(reserve "$P") ))
  echo "== $P $(date -u +%T) (${B} s for it, $(left) s left)"
  if [ "$B" -lt 8 ]; then echo "skipped: no time"; continue; fi
  T="timeout -k 2 $B"
  case $P in
    attn) $T python benchmarks/fp8_attn7.py --set "${FP8_ATTN_SET:-b2}" --budget $(( B - 4 )) --out "$R/attn8.json" \
            ${FP8_ATTN_VARIANTS:+--variants "$FP8_ATTN_VARIANTS"} > "$R/attn8.log" 2>&1
          echo "exit $?"; quiet "$R/attn8.log";;
    probe|probe_bf16) V=${FP8_PROBE_VARIANT:-fp8}; [ "$P" = probe_bf16 ] && V=bf16
          $T python benchmarks/fp8_jit_probe.py --variant "$V" --layers "${FP8_PROBE_LAYERS:-2}" \
            --warm "${FP8_PROBE_WARM:-e2e}" --out "$R/probe_$V.json" > "$R/probe_$V.log" 2>&1
          echo "exit $?"; grep -v "^BUILD" "$R/probe_$V.log" > "$R/probe_$V.short"; quiet "$R/probe_$V.short" 12
          grep -A1000 "TIMED RUN STARTS" "$R/probe_$V.log" | grep "^BUILD" | cut -c1-400 | head -8;;
    bs1) $T python benchmarks/fp8_bs1.py --budget $(( B - 8 )) --out "$R/bs1.json" --ab s6 \
           --variants "${FP8_BS1_VARIANTS:-one,one_w8,one_s8,default_again}" > "$R/bs1.log" 2>&1
         echo "exit $?"; quiet "$R/bs1.log" 40;;
    tests|tests6) [ "$P" = tests ] && F="tests/quant/test_fp8_kv_decode.py::test_fp8_kv_decode_on_cuda
            tests/quant/test_fp8_gemv_bits.py::test_fp8_gemv_bits_on_cuda_bit_identical
            tests/quant/test_fp8_silu_gemv.py::test_fp8_gemv_silu_on_cuda_in_a_graph"
          [ "$P" = tests6 ] && F="tests/quant/test_fp8_prefetch.py tests/quant/test_fp8_fused.py
            tests/quant/test_fp8_gemv.py::test_fast_accum_switch_stays_within_the_fp8_error"
          # shellcheck disable=SC2086
          $T python -m pytest -v -rA -m gpu -p no:cacheprovider $F ${FP8_TESTS_MORE:-} > "$R/$P.log" 2>&1
          echo "exit $?"; grep -E "PASSED|FAILED|passed|failed|Error|assert" "$R/$P.log" | tail -20;;
    one) $T python -m pytest -v -rA -m gpu -p no:cacheprovider tests/quant/test_fp8_decode_one.py > "$R/one.log" 2>&1
         echo "exit $?"; grep -E "PASSED|FAILED|passed|failed|Error|assert" "$R/one.log" | tail -12;;
    tc) $T python benchmarks/fp8_bs1.py --ab tc --tiles "$R/gemv.json" --out "$R/bs1_tc.json" > "$R/bs1_tc.log" 2>&1
        echo "exit $?"; quiet "$R/bs1_tc.log" 30;;
    gemv) $T python benchmarks/fp8_gemv_bench.py --budget $(( B - 4 )) --out "$R/gemv.json" > "$R/gemv.log" 2>&1
          echo "exit $?"; tail -40 "$R/gemv.log";;
    attn5) $T python benchmarks/fp8_attn_bench.py --set s5 --budget $(( B - 3 )) --batch 200 --ctx-lo 1000 \
             --ctx-hi 2000 --out "$R/attn.json" > "$R/attn.log" 2>&1
           echo "exit $?"; tail -12 "$R/attn.log";;
    mm) $T python benchmarks/fp8_attn_bench.py --set linears --rows 256,512,8192 --budget $(( B - 3 )) \
          --out "$R/mm.json" > "$R/mm.log" 2>&1
        echo "exit $?"; tail -12 "$R/mm.log";;
    step) OCTAVO_FP8_GEMV_MAX_M=0 $T python benchmarks/fp8_step_profile.py --variant fp8 --out-len 80 \
            --out "$R/step_fp8.json" > "$R/step_fp8.log" 2>&1
          echo "exit $?"; quiet "$R/step_fp8.log" 50;;
    *) echo "unknown part $P (attn probe probe_bf16 bs1 one tests tests6 tc gemv attn5 mm step)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
