#!/usr/bin/env bash
# Issue 9 (engineer "fp8"), sessions 9-14, fp815 session 15, fp816 session 16, fp817 session 17. One GPU, HARD bound ${FP89_LIMIT:-110} s for the whole call (every part
# under `timeout`, each gets what is left minus the later parts' reserves; `s11`, `s12`, `s12b2`: 150 s; `s14`: 190 s). JSON + logs: $OUT/fp89/
#   bash benchmarks/device/fp89.sh [PART ...]      (default: bs1 tests, session 10 batch 2; batch 1: bs1 head tests, and tail)
#   s11         session 11 batch 1 = parts bs1 tests with the in-graph tile sweep (BS1_SWEEP=24 s,
#               benchmarks/fp8_bs1_tiles.py) and BS1_VARIANTS=silu_rope,swept,default_again,silu_rope_swept,
#               silu_rope_again,swept_again,rope,silu (silu: gate_up GEMV + SiLU-and-mul in one kernel, now PDL + split
#               accumulator; rope: qkv GEMV + rotary in one kernel, fp8_rope_gemv.py); every bs1
#               measure reports the strict roofline (no embedding table, fp8 KV at 1 byte) and GEMV us by shape
#   s11b2       session 11 batch 2 (freeze tree, 140 s) = bs1 tests, BS1_VARIANTS=notable,self,pf32,default_again,
#               notable_again,self_again,pf32_again,silu_rope,nopdl (notable: autotuned tiles, not fp8_gemv_tiles.TILES,
#               the H100 default since batch 1; self: each GEMV program's rows asked of L2 before its PDL wait; pf32:
#               each GEMV's last programs ask L2 for the next linear's first 32 MiB, over the small kernels between;
#               nopdl: a kernel table without overlap, each GEMV's own streaming time)
#   s12         session 12 batch 1 (150 s) = tests bs1, BS1_VARIANTS = loop4, default_again, loop2, normpdl, ...
#               (in the order below; the budget skips the last ones) (pwN: the GEMV reads N weight blocks before its
#               PDL wait instead of 1; pw4_<shapes>: 4 only for those weights; pw4_<shape><n>: pw4 with another tile
#               for that weight; amax1: down's in-kernel absmax with all loads in flight; normpdl: the quantizing
#               norms launched under PDL, waiting in the kernel; loop2/loop4: two/four weight blocks a loop trip;
#               all2/all4(_loop4): the four together; loop4_<tiles>: loop4 with other tiles; benchmarks/fp8_bs1.py),
#               tests = FP89_TESTS (prefetch / PDL / pdl_w bit identity incl. 1-4 blocks on the table tiles, the
#               table launch, the GEMV bits incl. amax_one and loop2/4, the norm under PDL after a GEMV)
#   s12b2       session 12 batch 2 (final tree, 150 s) = bs1 tests: the new default (o / down with two weight blocks a
#               loop trip, fp8_gemv_tiles.LOOPS) vs s11 (one block a trip) alternating, amax1 (fixed: batch 1's compile
#               error), pw4_o, loop2 on all four, o/down on 8x1024 w8, qkv 16x1024 w8 + loop2, normpdl; then (data for
#               the next session, the budget may skip them) silu_rope, attention splits (one_s8, one_s32_n32), norm4
#   s14         session 14 (cap 190 s) = tests, then bs1: FP89_TESTS = tests/quant/test_fp8_gemv_norm.py (the GEMV with
#               the norm in its last program: GEMV bits, norm within two bf16 steps of the norm kernel,
#               e4m3 copy exact, graph replays; prints how many elements differ) + test_fp8_fused.py; BS1_VARIANTS =
#               gnorm,default_again,gnorm_again,default_again2,gnorm_again2,gnorm_silu,gnorm_pw2 after the first default
#               measure (gnorm: OCTAVO_FP8_GEMV_NORM's lever, fp8_gemv_norm.STATE; one engine, graph recaptured per
#               variant; the last two for the next session, the budget may skip them)
#   s15a        session 15 call 1 (engineer fp815, cap 200 s) = tests, then bs1: FP89_TESTS = test_fp8_norm_wfirst.py (the
#               norm weight read first: the 8B chain's bits and graph replays equal to the default's, incl. under PDL)
#               + test_fp8_decode_one.py (EARLY_IO: same output bits, PDL, graph) + tests/kernels/test_rope_early.py
#               (rotary after a PDL GEMV: same bits, graph) + test_fp8_fused.py; BS1_VARIANTS = s15_all (nwf1 + eio +
#               re1) / nwf1 / eio / re1 / re2 / nwf2 / ... alternating with default_again* (all the same bits: tokens
#               must equal the first measure's; fp8_bs1_variants.py says what each sets); last, if the budget
#               allows, att_s8 / att_s8_pw4o / att_s32_n32 (the attention's split count, really changed this time)
#   s15b        session 15 call 2 (fp815, cap 200 s): the norm's weight-first read is the default now (s15a: -13 us);
#               GPU tests (test_fp8_decode_one.py incl. the rotary inside, test_fp8_norm_wfirst.py), then one engine:
#               arope (the rotary inside the one-launch attention, fp8_attn_rope.py; GPU test first: the kernel with
#               unrotated q / k = the rotary kernel + the plain launch, output and cache bytes), nwf0 (sessions 6-14's
#               norm), the norm under PDL (nwf1_pdl: -22 us in s15a, n=1) with the attention's EARLY_IO, x3 alternating
#   s15c        session 15's last call (fp815, cap 200 s): the new defaults (norm weight first + under PDL, the rotary
#               inside the attention + its EARLY_IO, amax1) vs session 14's ("s14") and the package without each of
#               its parts, x3 alternating; GPU tests first (attention incl. rotary, norm chains, PDL, GEMV bits, fused);
#               last, if the budget allows, x2d (session 7's same-bits x layout for qkv / gate_up) on the package
#   s16a        session 16 call 1 (engineer fp816, cap 200 s) = tests, then bs1: FP89_TESTS = test_fp8_decode_spin.py (the
#               attention's splits merged by polling their partials, modes 1 / 2: output + cache bits equal to the ticket
#               merge launch after launch, sentinels back, CUDA graphs) + test_fp8_gemv_tma.py (o_proj / down with TMA
#               weight streams: bits equal to the plain GEMV at the 8B shapes, 2-4 stages, PDL, graph) +
#               test_fp8_decode_one.py; BS1_VARIANTS = spin1 / spin2 / tma2-4 / tmaN_l2 (first blocks to L2 before the
#               wait, not into registers) / _pa (down's absmax from the SiLU kernel's pieces) / spin2_tma3_l2_pa ...
#               alternating with
#               default_again* x3 (all the same bits: tokens must equal the first measure's), then norm8, att_w2 (data)
#   s16b        session 16 call 2 (fp816, cap 200 s): s16a lost everywhere (the polling merge is removed); GPU tests
#               (test_fp8_decode_one.py incl. the 8-split 128-key launch with the rotary inside; test_fp8_gemv_tma.py with
#               the L2 prefetch asked once a row), then one engine: att_s8_n128 (8 splits of one 128-key tile: every past
#               key read before the PDL wait, half the merge; other sums), norm32 (the quantizing norms on 32 warps),
#               tma3_l2 (s16a's prefetch bug fixed), o8w4 (o_proj's programs fit beside the attention), self (each GEMV
#               program asks L2 for its rows before its wait: SELF_PF, with the same bug fixed: one request a row, not
#               16-32), x2-3 alternating; test_fp8_prefetch.py (the GEMV bits with self-prefetch / PDL in a graph)
#   s17a        prepared in session 16 (fp816), cap 120 s: GPU test of the norm in the consuming
#               GEMV's prologue (test_fp8_norm_gemv.py: residual exact, output vs float64, the elements that differ from
#               norm + GEMV counted, graph), then normgemv = benchmarks/fp8_norm_gemv_bench.py (chains of o_proj GEMV ->
#               norm -> qkv / gate_up GEMV vs o_proj GEMV -> norm_gemv in CUDA graphs, us a link)
#   s17h        session 17 call 1 (engineer fp817, ONE H200, cap 215 s) = tests (test_fp8_silu_down.py: down's GEMV
#               with SiLU-and-mul inside = the SiLU kernel + GEMV bits, 8B shape, PDL, graph; test_fp8_gemv_early.py:
#               o / down with 1-2 blocks right after the wait = without, eager + graph), then bs1: the default
#               forward on this card (no fp8_gemv_tiles row for "NVIDIA H200": the autotuner's tiles) with its critical
#               path, the TABLE sweep (BS1_TSWEEP=70 s, fp8_bs1_tiles.sweep_table: each shape's tile x loop depth in turn
#               as this card's table row, graph recaptured, replays timed, x2 rounds), then one engine alternating
#               tsweep (the swept rows) / h100rows (the H100 rows on this card) / default_again (autotuner) x3, with
#               tsweep_sd (SiLU-and-mul inside down's GEMV: fp8_silu_down.py) x3, tsweep_ew1 / _ew2 (o_proj / down ask
#               for their next 1 / 2 weight blocks right after the PDL wait: fp8_gemv.EARLY_W) and tsweep_sd_ew1 (all
#               the same bits: tokens must equal), tma3_h100rows last (session 16's TMA GEMV, deleted after this call);
#               since then only the sweep and the rows variants (EARLY_W and SiLU-in-down were deleted after s17h / s17j)
#   s17i        session 17 call 2 (fp817, ONE H200, cap 200 s): the GPU tests of the table launch on this card's new rows
#               (test_fp8_gemv_tiles.py: = the config launch, vs float64, vs the autotuner's tile within a bf16 step),
#               SiLU-in-down and EARLY_W, then one engine: the new default (the H200 rows s17h swept) vs notable (the
#               autotuner) / sd (SiLU-and-mul inside down's GEMV) / h100rows x3-4; each measure then 48 untimed greedy
#               tokens with top-2 log-probabilities (BS1_PROBE): where tokens part from the default's, the top-2 gap
#   s17j        session 17 call 3 (fp817, ONE H200, cap 150 s): s17i's sd took the fused path in 1 of 32 layers (the
#               other downs were paired with gnorm's tail, which is off: fixed); the SiLU-in-down GPU test, then one
#               engine: the default (the H200 rows) vs sd x4 alternating, then h100rows_sd / h100rows (data)
#   bs1         benchmarks/fp8_bs1.py --ab s6: 8B fp8 + fp8 KV batch 1, one engine: ms/token vs the roofline, the
#               captured forward alone vs the rest (LM head, sampler, host), the graph's kernel table; then the
#               variants ${BS1_VARIANTS:-nopdl,default_again,nopdl_again}, graph recaptured for each (nopdl: the GEMV
#               without PDL / pdl_w, the default until session 10; batch 1: pdlw,default_again,pdlw_again,pdl)
#   head        benchmarks/graph_head_ab.py --dtype fp8 --gemv-ab: LM head + sampler in the CUDA graphs on/off
#               (OCTAVO_GRAPH_HEAD) x the head's one-row GEMM Triton GEMV / cuBLAS, alternating, one engine
#   tests       GPU tests: the small-M tiles of fp8_configs/smallm.json vs _scaled_mm on the 8B shapes at 2-64 rows
#               (tests/quant/test_fp8_smallm.py), the tensor-core GEMV's GPU tests (tests/quant/test_fp8_gemv_tc.py),
#               prefetch / PDL / pdl_w bit identity in a graph after an early trigger (tests/quant/test_fp8_prefetch.py),
#               the one-row GEMV's bit-identity and graph tests (test_fp8_gemv_bits.py, test_fp8_silu_gemv.py)
#   smallm      benchmarks/fp8_smallm_bench.py: the fp8 projections at ${SMALLM_ROWS:-2,8,24,32} rows (the run's
#               second-wave steps): _scaled_mm vs the tensor-core GEMV on BLOCK_M <= ${SMALLM_MAX_BM:-32}
#   mem_fp8 / mem_bf16  benchmarks/kv_sizing_probe.py: the 8B e2e engine (gpu_e2e.py's settings, CUDA graphs) with
#               the KV sizing of core/profiling.py: its readings (what the ~4.8 GB beyond weights + KV was), the KV
#               blocks, the graph pool; then gpu_e2e's warm-up (8192-token mixed steps) and 512 rows decoding with
#               sampling: the largest step shapes, so an OOM shows here; device memory after each phase
#   e2e_fp8     gpu_e2e.py decode_bs1 --throughput with fp8 + fp8 KV (as e2e_fp8.sh; needs ~150 s alone)
#   tail        benchmarks/fp8_tail_ab.py: the e2e_fp8 engine and workload, timed runs ${TAIL_ORDER:-off,on} of the
#               last-wave overcommit (kv_admission_overcommit 0.05 vs 0) in one engine (~130 s alone)
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/fp89"
mkdir -p "$R"
if [ "${1:-}" = s11 ]; then
  shift; set -- bs1 tests "$@"
  : "${FP89_LIMIT:=150}" "${BS1_SWEEP:=24}" \
    "${BS1_VARIANTS:=silu_rope,swept,default_again,silu_rope_swept,silu_rope_again,swept_again,rope,silu}"
elif [ "${1:-}" = s12 ]; then
  shift; set -- tests bs1 "$@"  # the tests first: a default flips only with them
  : "${FP89_LIMIT:=150}" "${BS1_VARIANTS:=loop4,default_again,loop2,normpdl,loop4_od8w8,amax1,all4_loop4,default_again2,loop4_od4w4,loop4_again,all2,pw4,loop2_again,normpdl_again,loop4_all8w8,amax1_again,all4,pw2,loop4_pw4,pw4_o,pw4_noup}"
  : "${FP89_TESTS:=tests/quant/test_fp8_prefetch.py tests/quant/test_fp8_gemv_tiles.py tests/quant/test_fp8_gemv_bits.py}"
elif [ "${1:-}" = s12b2 ]; then
  shift; set -- bs1 tests "$@"  # nothing flips after the freeze: the A/B first
  : "${FP89_LIMIT:=150}" "${BS1_VARIANTS:=s11,amax1,default_again,s11_again,od_r128,pw4_o,amax1_again,od8w8,loop2,default_again2,s11_again2,loop2_qkv16,pw4_o_amax1,normpdl,silu_rope,one_s8,norm4,one_s32_n32}"
  : "${FP89_TESTS:=tests/quant/test_fp8_gemv_tiles.py tests/quant/test_fp8_prefetch.py tests/quant/test_fp8_gemv_bits.py}"
elif [ "${1:-}" = s14 ]; then
  shift; set -- tests bs1 "$@"  # the tests first: a default flips only with them
  : "${FP89_LIMIT:=190}" "${BS1_VARIANTS:=gnorm,default_again,gnorm_again,default_again2,gnorm_again2,gnorm_silu,gnorm_pw2}"
  : "${FP89_TESTS:=tests/quant/test_fp8_gemv_norm.py tests/quant/test_fp8_fused.py}"
elif [ "${1:-}" = s15a ]; then
  shift; set -- tests bs1 "$@"  # the tests first: a default flips only with them
  : "${FP89_LIMIT:=200}" "${BS1_VARIANTS:=s15_all,nwf1,eio,re1,default_again,s15_all_again,re2,nwf2,s15_all_amax1,default_again2,s15_all_again2,nwf1_again,eio_again,re1_again,default_again3,s15_all_amax1_again,re2_again,s15_all_re2,nwf1_pdl,default_again4,nwf1_again2,eio_again2,re1_again2,amax1,att_s8,att_s8_pw4o,nwf2_again,nwf1_eio,att_s32_n32}"
  : "${FP89_TESTS:=tests/quant/test_fp8_norm_wfirst.py tests/quant/test_fp8_decode_one.py tests/kernels/test_rope_early.py tests/quant/test_fp8_fused.py}"
elif [ "${1:-}" = s15b ]; then
  shift; set -- tests bs1 "$@"
  : "${FP89_LIMIT:=200}" "${BS1_VARIANTS:=arope,nwf0,nwf1_eio_pdl,arope_eio_pdl,default_again,arope_again,nwf0_again,nwf1_eio_pdl_again,arope_eio_pdl_again,default_again2,arope_eio,nwf1_pdl,arope_again2,nwf0_again2,arope_eio_pdl_again2,nwf1_eio_pdl_again2,default_again3,arope_eio_again,s15_all_pdl,amax1,default_again4}"
  : "${FP89_TESTS:=tests/quant/test_fp8_decode_one.py tests/quant/test_fp8_norm_wfirst.py}"
elif [ "${1:-}" = s15c ]; then
  shift; set -- tests bs1 "$@"
  : "${FP89_LIMIT:=200}" "${BS1_VARIANTS:=s14,pkg_nopdl,pkg_noamax,pkg_noarope,default_again,s14_again,pkg_nopdl_again,pkg_noamax_again,pkg_noarope_again,default_again2,s14_again2,pkg_nopdl_again2,pkg_noamax_again2,pkg_noarope_again2,default_again3,x2d}"
  : "${FP89_TESTS:=tests/quant/test_fp8_decode_one.py tests/quant/test_fp8_norm_wfirst.py tests/quant/test_fp8_prefetch.py tests/quant/test_fp8_gemv_bits.py tests/quant/test_fp8_fused.py}"
elif [ "${1:-}" = s16a ]; then
  shift; set -- tests bs1 "$@"  # the tests first: a default flips only with them
  : "${FP89_LIMIT:=200}" "${BS1_VARIANTS:=spin2,spin1,default_again,spin2_again,spin1_again,tma3_l2,tma3_l2_pa,tma3,default_again2,tma3_l2_again,tma3_l2_pa_again,spin2_tma3_l2_pa,tma4_l2_pa,spin2_again2,default_again3,tma3_l2_again2,tma3_l2_pa_again2,tma3_again,spin2_tma3_l2_pa_again,spin1_again2,tma4_l2_pa_again,default_again4,tma2_l2,tma4,spin2_tma3_l2_pa_again2,norm8,att_w2}"
  : "${FP89_TESTS:=tests/quant/test_fp8_decode_spin.py tests/quant/test_fp8_decode_one.py}"
elif [ "${1:-}" = s16b ]; then
  shift; set -- tests bs1 "$@"
  : "${FP89_LIMIT:=200}" "${BS1_VARIANTS:=att_s8_n128,norm32,self,o8w4,default_again,att_s8_n128_again,norm32_again,self_again,o8w4_again,att_s8_n128_o8w4,default_again2,att_s8_n128_again2,norm32_again2,att_s8_n128_norm32,att_s8_n128_o8w4_again,default_again3,tma3_l2,att_s8_n128_norm32_again,o8w4_again2,att_w2,default_again4}"
  : "${FP89_TESTS:=tests/quant/test_fp8_decode_one.py tests/quant/test_fp8_prefetch.py}"
elif [ "${1:-}" = s17a ]; then
  shift; set -- tests normgemv "$@"  # prepared in session 16 (fp816) for the next one: not run yet
  : "${FP89_LIMIT:=120}" "${FP89_TESTS:=tests/quant/test_fp8_norm_gemv.py}"
elif [ "${1:-}" = s17h ]; then
  shift; set -- tests bs1 "$@"  # the silu-down GPU test, then the measurements (the table rows are pinned after it)
  : "${FP89_LIMIT:=215}" "${BS1_TSWEEP:=70}" "${FP89_TESTS:=tests/quant/test_fp8_gemv_tiles.py --durations=5}"
  : "${BS1_VARIANTS:=tsweep,h100rows,default_again,tsweep_again,h100rows_again,default_again2,tsweep_again2,h100rows_again2,default_again3}"
elif [ "${1:-}" = s17i ]; then
  shift; set -- tests bs1 "$@"  # the table path's GPU tests on this card's rows first, then the A/B
  : "${FP89_LIMIT:=200}" "${BS1_PROBE:=48}"
  : "${FP89_TESTS:=tests/quant/test_fp8_gemv_tiles.py --durations=5}"
  : "${BS1_VARIANTS:=notable,h100rows,default_again,notable_again,h100rows_again,default_again2,notable_again2,h100rows_again2,default_again3,notable_again3}"
elif [ "${1:-}" = s17j ]; then
  shift; set -- bs1 "$@"  # ran (c5) with the SiLU-in-down GPU test first; sd lost and was deleted: now default / h100rows
  : "${FP89_LIMIT:=150}" "${BS1_PROBE:=16}"
  : "${BS1_VARIANTS:=h100rows,default_again,h100rows_again,default_again2}"
elif [ "${1:-}" = s11b2 ]; then
  shift; set -- bs1 tests "$@"
  : "${FP89_LIMIT:=140}" "${BS1_VARIANTS:=notable,self,pf32,default_again,notable_again,self_again,pf32_again,silu_rope,nopdl}"
fi
LIMIT=${FP89_LIMIT:-110}
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then  # s9 batch 1's lanes had no install
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
  timeout 20 python -c "import octavo; print('octavo', octavo.__file__)" 2>&1 | tee -a "$R/install.txt"
fi
T0=$(date +%s)  # the bound below is for the measurements
left() { echo $(( LIMIT - 2 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short > "$R/tree_status.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(bs1 tests)
declare -A RESERVE=([tests]=50 [normgemv]=40 [smallm]=30 [mem_fp8]=55 [mem_bf16]=0 [e2e_fp8]=150 [bs1]=45 [head]=50 [tail]=140)
reserve() {  # seconds the parts after $1 keep for themselves
  local after=0 r=0 p
  for p in "${PARTS[@]}"; do
    [ "$after" = 1 ] && r=$((r + ${RESERVE[$p]:-20}))
    [ "$p" = "$1" ] && after=1
  done
  echo $r
}
for P in "${PARTS[@]}"; do
  B=$(( $(left) - $(reserve "$P") ))
  echo "== $P $(date -u +%T) (${B} s for it, $(left) s left)"
  if [ "$B" -lt 15 ]; then echo "skipped: no time"; continue; fi
  T="timeout -k 3 $B"
  case $P in
    # shellcheck disable=SC2086  # FP89_TESTS: a list of test files
    tests) $T python -m pytest -v -rA -m gpu -p no:cacheprovider ${FP89_TESTS:-tests/quant/test_fp8_smallm.py \
             tests/quant/test_fp8_gemv_tc.py tests/quant/test_fp8_prefetch.py \
             tests/quant/test_fp8_gemv_bits.py tests/quant/test_fp8_silu_gemv.py tests/quant/test_fp8_rope_gemv.py \
             tests/quant/test_fp8_gemv_tiles.py} > "$R/tests.log" 2>&1
           echo "exit $?"; grep -E "PASSED|FAILED|SKIPPED|passed|failed|Error|assert" "$R/tests.log" | tail -12;;
    smallm) $T python benchmarks/fp8_smallm_bench.py --budget $(( B - 6 )) --out "$R/smallm.json" \
              --rows "${SMALLM_ROWS:-2,8,24,32}" --max-bm "${SMALLM_MAX_BM:-32}" > "$R/smallm.log" 2>&1
            echo "exit $?"; grep -v " INFO \| WARNING " "$R/smallm.log" | cut -c1-300 | tail -14;;
    mem_fp8|mem_bf16) V=${P#mem_}
          $T python benchmarks/kv_sizing_probe.py --variant "$V" --out "$R/mem_$V.json" > "$R/mem_$V.log" 2>&1
          echo "exit $?"; grep -E "^(sizing|built|e2e_warm_up|rows_512|FAILED)|KV sizing|KV cache:|Error|error" \
            "$R/mem_$V.log" | cut -c1-1500 | tail -12;;
    e2e_fp8) OCTAVO_QUANTIZATION=fp8 OCTAVO_KV_CACHE_DTYPE=fp8 $T python benchmarks/gpu_e2e.py decode_bs1 \
               --throughput --max-num-seqs 512 --out-dir "$R/e2e_fp8" > "$R/e2e_fp8.log" 2>&1
             echo "exit $?"; grep -v " INFO \| WARNING " "$R/e2e_fp8.log" | cut -c1-1500 | tail -8;;
    bs1) $T python benchmarks/fp8_bs1.py --ab s6 --variants "${BS1_VARIANTS:-nopdl,default_again,nopdl_again}" \
           --budget $(( B - 12 )) --sweep "${BS1_SWEEP:-0}" --table-sweep "${BS1_TSWEEP:-0}" --probe-tokens "${BS1_PROBE:-0}" --out "$R/bs1.json" > "$R/bs1.log" 2>&1
         echo "exit $?"; grep -v " INFO \| WARNING \|UserWarning\|_warn_once" "$R/bs1.log" | cut -c1-400 | tail -90;;
    head) OCTAVO_GRAPH_HEAD=1 $T python benchmarks/graph_head_ab.py --dtype fp8 --gemv-ab --out "$R/head.json" \
            > "$R/head.log" 2>&1
          echo "exit $?"; grep -v " INFO \| WARNING " "$R/head.log" | cut -c1-600 | tail -14;;
    normgemv) $T python benchmarks/fp8_norm_gemv_bench.py --layers 12 --rounds 5 --out "$R/norm_gemv.json" \
                > "$R/norm_gemv.log" 2>&1
              echo "exit $?"; grep -v " INFO \| WARNING " "$R/norm_gemv.log" | tail -12;;
    tail) OCTAVO_QUANTIZATION=fp8 OCTAVO_KV_CACHE_DTYPE=fp8 $T python benchmarks/fp8_tail_ab.py \
            --order "${TAIL_ORDER:-off,on}" --budget $(( B - 50 )) --out "$R/tail.json" > "$R/tail.log" 2>&1
          echo "exit $?"; grep -E "^(built|run|done)|Error|error" "$R/tail.log" | cut -c1-600 | tail -8;;
    *) echo "unknown part $P (bs1 head tests smallm mem_fp8 mem_bf16 e2e_fp8 tail normgemv)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
