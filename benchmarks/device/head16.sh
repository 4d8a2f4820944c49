#!/usr/bin/env bash
# Session 16 (engineer head16): issue 9's decode_bs1_strict_fraction_of_roofline, the part of a batch-1 fp8 token
# outside the captured forward. One GPU, HARD bound ${HEAD16_LIMIT:-180} s for the whole call (every part under
# `timeout`, each gets what is left minus the later parts' reserves). JSON + logs: $OUT/head16/
#   bash benchmarks/device/head16.sh [PART ...]
#   s16a   call 1 (cap 180 s) = tests ab: the GPU tests of the new levers (tests/gpu/test_decode_const_inputs_gpu.py:
#          the eager greedy argmax in two launches = torch.argmax on 128k rows; a tiny engine's greedy / seeded / top-k
#          tokens equal with the kept decode inputs + that argmax on and off; the one-graph batch-1 step captured and
#          giving the plain path's tokens, async and sync), then ONE engine with the headline's settings (8B fp8 +
#          fp8 KV, max_num_seqs 512, 51 graph sizes, async; head graphs and the one-graph step captured, off unless a
#          variant turns them on) alternating default / step (OCTAVO_GRAPH_STEP: inputs + body + head + argmax in one
#          graph) / step_zc (the same, zero-copy: no copies on the stream) / lean (argmax + const) / head (the LM head
#          + sampler graphs) x3, step_tile (step with the head GEMV
#          tile that won a sweep on the head weight alone, benchmarks/head_tile_sweep.py) x2, then argmax / const / head_const,
#          greedy tokens compared, ms/token, the graph alone, and a CUDA-only trace per variant: GPU busy / idle a step
#          and every op outside the body graph (benchmarks/head16_ab.py)
#   s16b   call 2 (cap 210 s: tests ~93 s, the A/B 115 s) = tests ab: the GPU tests again with the step graph on by default (+ the head graphs'
#          and the graph runner's tests), then the engine as the headline starts it (no head graphs) with the
#          zero-copy step graphs captured too (OCTAVO_GRAPH_STEP_ZERO_COPY=1 for the engine only) alternating default
#          (no step graph: the old default) / step (the new default) / step_zc (zero-copy + the argmax on the 16-bit
#          logits into the id buffer) x4, windows 769..1024 for step and step_zc, traces; then 4 generations with the
#          engine's step intervals and the GC recorded (--stall-diag step, benchmarks/host_stalls.py: call 1's
#          wall-clock windows ran tens of ms over their device steps)
#   s17a   session 17 (engineer head17) call 1 (cap 140 s) = win: gpu_e2e.py decode_bs1's sequence (16-token
#          warm-up, then 1, 1, 257, 257, 513, 513 tokens after a 512-token prompt) in the headline's engine (win:
#          max_num_seqs 512, 51 graph sizes, async) rounds until 20 s before the cap, odd ones with every step recorded on the host's
#          and the device's clocks (benchmarks/head16_window.py + head16_steps.py: host / device intervals, whether
#          the device waited for the host, GC, start / end of a generation, step-graph fallbacks), then a recorded
#          round with the one-graph step off, a 513-token generation with the host's threads sampled every 2 ms, and
#          513-token generations after 2 s idle vs 2 s of device copies
#   s17b   call 2 (cap 200 s) = tests ab: the GPU tests of the one-graph step (its modes off / copy / zero-copy / raw:
#          OCTAVO_GRAPH_STEP_RAW_ARGMAX, the copy graph's argmax of the head's 16-bit logits into the id buffer), then the
#          headline's engine (no head graphs) alternating step / step_raw x4 (raw recaptured at each switch), traces,
#          then the prefill step of 1-token generations profiled (call 1: 26-47 ms of host launch a generation;
#          benchmarks/head16_prefill.py: launch times, cProfile of the step thread, the device's busy time)
#   s17c   call 3 (cap 60 s) = tests: the GPU tests of the step graph in their final form (raw on by default since
#          s17b; the copy mode switched to the cast path, the raw mode back), tests/gpu/test_decode_const_inputs_gpu.py
#   win    benchmarks/head16_window.py --rounds ${HEAD16_WIN_ROUNDS:-12} (the headline's engine); win1: the bs1 engine
#          (--max-num-seqs 1) --rounds 3
#   tests  HEAD16_TESTS (default: tests/gpu/test_decode_const_inputs_gpu.py)
#   ab     benchmarks/head16_ab.py --variants ${HEAD16_VARIANTS} (--windows ${HEAD16_WINDOWS:-default,step}: those
#          also timed at contexts 769..1024, the headline's second half; default: default,step)
# CPU dry run: HEAD16_DRY=1 bash benchmarks/device/head16.sh s16a (tiny model; the GPU tests skip)
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/head16"
mkdir -p "$R"
if [ "${1:-}" = s16a ]; then
  shift; set -- tests ab "$@"  # the tests first: a default flips only with them
  : "${HEAD16_LIMIT:=180}"
  : "${HEAD16_VARIANTS:=default,step,step_zc,lean,head,default_again,step_again,step_zc_again,lean_again,head_again,step_tile,default_again2,step_again2,step_zc_again2,step_tile_again,lean_again2,head_again2,argmax,const,head_const}"
fi
if [ "${1:-}" = s17a ]; then
  shift; set -- win "$@"  # no new engine code yet: the diagnostic only
  : "${HEAD16_LIMIT:=140}"
fi
if [ "${1:-}" = s17b ]; then
  shift; set -- tests ab "$@"
  : "${HEAD16_LIMIT:=200}"
  : "${HEAD16_VARIANTS:=step,step_raw,step_again,step_raw_again,step_again2,step_raw_again2,step_again3,step_raw_again3}"
  : "${HEAD16_AB_ARGS:=--no-head-graphs --prefill-profile}" "${HEAD16_WINDOWS:=none}"
fi
if [ "${1:-}" = s17c ]; then
  shift; set -- tests "$@"
  : "${HEAD16_LIMIT:=60}"
fi
if [ "${1:-}" = s16b ]; then
  shift; set -- tests ab "$@"
  : "${HEAD16_LIMIT:=210}"
  : "${HEAD16_TESTS:=tests/gpu/test_decode_const_inputs_gpu.py tests/gpu/test_cuda_graphs.py tests/gpu/test_graph_head_gpu.py}"
  : "${HEAD16_VARIANTS:=default,step,step_zc,default_again,step_again,step_zc_again,default_again2,step_again2,step_zc_again2,default_again3,step_again3,step_zc_again3}"
  : "${HEAD16_AB_ARGS:=--no-head-graphs --stall-diag step}" "${HEAD16_WINDOWS:=step,step_zc}"
  : "${HEAD16_AB_ENV:=OCTAVO_GRAPH_STEP_ZERO_COPY=1}"
fi
LIMIT=${HEAD16_LIMIT:-180}
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
fi
T0=$(date +%s)
left() { echo $(( LIMIT - 2 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.memory --format=csv > "$R/gpu.csv" 2>/dev/null
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short > "$R/tree_status.txt" 2>/dev/null
export OCTAVO_DISABLE_PROGRESS=1
DRY=()
[ "${HEAD16_DRY:-0}" = 1 ] && DRY=(--dry)
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(tests ab)
declare -A RESERVE=([tests]=60 [ab]=115 [win]=80 [win1]=55)
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
    # shellcheck disable=SC2086  # HEAD16_TESTS: a list of test files
    tests) $T python -m pytest -v -rA -m gpu -p no:cacheprovider ${HEAD16_TESTS:-tests/gpu/test_decode_const_inputs_gpu.py} \
             > "$R/tests.log" 2>&1
           echo "exit $?"; grep -E "PASSED|FAILED|SKIPPED|passed|failed|Error|assert" "$R/tests.log" | tail -12;;
    # shellcheck disable=SC2086  # HEAD16_AB_ARGS: extra flags
    # shellcheck disable=SC2086  # HEAD16_AB_ENV: VAR=value words for the engine only
    ab) $T env ${HEAD16_AB_ENV:-} python benchmarks/head16_ab.py "${DRY[@]}" ${HEAD16_AB_ARGS:-} --variants "${HEAD16_VARIANTS:-default,lean,head,default_again}" \
          --windows "${HEAD16_WINDOWS:-default,step}" --budget $(( B - 14 )) --out "$R/ab.json" > "$R/ab.log" 2>&1
        echo "exit $?"; grep -v " INFO \| WARNING \|UserWarning\|_warn_once" "$R/ab.log" | cut -c1-700 | tail -60;;
    win|win1) A=(--rounds "${HEAD16_WIN_ROUNDS:-12}"); [ "$P" = win1 ] && A=(--rounds 3 --max-num-seqs 1)
        SMI=""  # the card's clocks, power, temperature and throttle reasons every 100 ms while it runs
        if command -v nvidia-smi > /dev/null && [ "${HEAD16_DRY:-0}" != 1 ]; then
          nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
            --format=csv -lms 100 > "$R/smi_$P.csv" 2>&1 &
          SMI=$!
        fi
        $T python benchmarks/head16_window.py "${DRY[@]}" "${A[@]}" --budget $(( B - 20 )) --out "$R/$P.json" \
          > "$R/$P.log" 2>&1
        echo "exit $?"; [ -n "$SMI" ] && kill "$SMI" 2> /dev/null; grep -v " INFO \| WARNING \|UserWarning\|_warn_once" "$R/$P.log" | cut -c1-900 | tail -40;;
    *) echo "unknown part $P (tests ab win win1)";;
  esac
done
echo "== done $(date -u +%T), $(( $(date +%s) - T0 )) s"
