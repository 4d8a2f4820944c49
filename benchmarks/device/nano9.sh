#!/usr/bin/env bash
# Issue 17, engineer "nano", sessions 9-10: ONE GPU, hard bound 150 s a call (b10f: 120 s) (+ up to 100 s for an install of the package
# if it is not importable). JSON + logs under $OUT/nano9/. One part
# per call, NANO_PART=<part> (or the first argument):
#   b1  (batch 1) the fused sampler's GPU cases with the base-2 / lg2.approx noise (tests/kernels/fused_sampler_cases.py:
#       KS + chi-square of the noise, kernel == Gumbel-max over its noise, exact greedy argmax, end-to-end
#       chi-square, seeds); head.json: LM head (float32 one pass / bf16) + sampler (fp32 / bf16 logits, fast /
#       exact noise) in CUDA graphs (benchmarks/nano_head_bench.py); gap.json: the warmed nano-vllm run in one
#       engine: defaults, probe (CUDA events a step: GPU idle between steps; host phase timers; GC pauses),
#       no_freeze (OCTAVO_GC_FREEZE=0: the GC walks the whole heap, as before), defaults, no_freeze, si_500 as the
#       budget allows (si_500: GIL switch interval 0.5 ms), then one 8k-token prefill step's kernel table
#       (benchmarks/nano_host_gap.py).
#   b2  (batch 2) gap.json again on the final tree: defaults (full GC collections deferred inside the run +
#       start-up heap frozen, core/gc_heap.py), probe (GPU idle between steps, GC pauses), then no_freeze
#       (OCTAVO_GC_FREEZE=0: the GC as before) / defaults alternating (NANO_RUNS overrides the list); then the
#       sampler cases for the time left.
#   b10 (session 10 batch 1, the first H100 run of session 9's tree) gap.json: defaults first (the headline's first
#       timed run of a warmed engine), probe (GPU idle between steps by step kind, host phases, the host time before
#       the first and after the last step, GC pauses), no_freeze / defaults alternating (GC deferral on an H100);
#       then the step thread's eager forward of one 8k-token prefill step: wall times and a cProfile
#       (--prefill-host), and that step's kernel table (--prefill-profile).
#   b10f (session 10 batch 2, the freeze tree; bound 120 s) gap.json: defaults first, probe, prefill_prof (cProfile
#       of the step thread's in-run 8k prefill forwards), defaults / no_freeze / defaults; every run records the
#       caching allocator's device calls; then --prefill-host.
#   m11 (session 11, engineer margin; bound 146 s) gap.json: defaults first (the headline's first timed run), core_prof
#       (cProfile of the engine's stepping thread in the prefill phase: what shares the GIL with the 8k-token
#       forwards' launches), probe, prefill_prof (the step thread's in-run 8k forwards), defaults x2; --prefill-host.
#       (Batch 1 also alternated 'evblock', the core waiting on a blocking-sync event: no gain, the knob was removed.)
#   base (session 11, engineer margin; bound 146 s) A/B of two TREES in one lane: the current tree and .base/ (a `git
#       archive` of session 10's final tree 3a185d4 that the lead carries), alternating fresh processes cur, base, cur,
#       base (as long as ~32 s are left), each nano_host_gap.py --runs defaults defaults (the first = the headline's
#       first timed run of a warmed engine); the base runs through benchmarks/tree_run.py (octavo's editable mapping
#       pointed at .base, no reinstall). gap_<tree><i>.json.
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano9"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 146 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
# (s9 batch 1: the package was not importable in the lanes; install it here then, as the harness should have)
if ! timeout 20 python -c "import octavo" > /dev/null 2>&1; then
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
  timeout 20 python -c "import octavo; print('octavo', octavo.__file__)" 2>&1 | tee -a "$R/install.txt"
  START=$(date +%s)  # the bound below is for the measurements
fi
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
unset OCTAVO_TRITON_DECODE_KERNEL OCTAVO_TRITON_DECODE_LAUNCH OCTAVO_TRITON_GEMM OCTAVO_FUSED_SAMPLER
PART="${NANO_PART:-${1:-b1}}"
echo "== part $PART $(date -u +%T)"

cases() {  # cap seconds, log name, pytest files and args...
  local cap=$1 log=$2; shift 2
  echo "== cases $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" python -m pytest -q -p no:cacheprovider -W ignore "$@" > "$R/$log" 2>&1
  echo "cases exit $?"; tail -n 15 "$R/$log"
}
run() {  # cap seconds, log name, command...
  local cap=$1 log=$2; shift 2
  echo "== $* (cap $cap s) $(date -u +%T)"
  timeout -k 2 "$cap" "$@" > "$R/$log" 2>&1
  echo "exit $?"; grep -v "^\[transformers\]\|^USDT" "$R/$log" | tail -n "${TAIL:-40}" | cut -c1-1500
}

case "$PART" in
  b1)
    cases 30 sampler_cases.log tests/kernels/fused_sampler_cases.py
    run 28 head.log python benchmarks/nano_head_bench.py --out "$R/head.json"
    run "$(left)" gap.log python benchmarks/nano_host_gap.py --out "$R/gap.json" --budget-s "$(( $(left) - 4 ))" \
      --runs defaults probe no_freeze defaults no_freeze si_500 --prefill-profile ;;
  b2)
    run 118 gap.log python benchmarks/nano_host_gap.py --out "$R/gap.json" --budget-s 114 \
      --runs ${NANO_RUNS:-defaults probe no_freeze defaults no_freeze defaults no_freeze}
    cases "$(left)" sampler_cases.log tests/kernels/fused_sampler_cases.py ;;
  b10)
    run 140 gap.log python benchmarks/nano_host_gap.py --out "$R/gap.json" --budget-s 136 --prefill-host \
      --prefill-profile --runs ${NANO_RUNS:-defaults probe no_freeze defaults no_freeze defaults no_freeze defaults} ;;
  b10f)
    run 112 gap.log python benchmarks/nano_host_gap.py --out "$R/gap.json" --budget-s 108 --prefill-host \
      --runs ${NANO_RUNS:-defaults probe prefill_prof defaults no_freeze defaults} ;;
  m11)
    run 142 gap.log python benchmarks/nano_host_gap.py --out "$R/gap.json" --budget-s 136 --prefill-host \
      --runs ${NANO_RUNS:-defaults core_prof probe prefill_prof defaults defaults} ;;
  base)
    [ -d .base/core ] && [ -d .base/sdk ] && [ -d .base/plugins ] || { echo "no .base/ tree (git archive 3a185d4)"; exit 2; }
    i=0
    for tree in ${NANO_TREES:-cur base cur base}; do
      [ "$(left)" -lt 32 ] && { echo "skip $tree: $(left) s left"; continue; }
      i=$((i + 1))
      if [ "$tree" = base ]; then
        run $(( $(left) - 2 )) "gap_base$i.log" python benchmarks/tree_run.py .base .base/benchmarks/nano_host_gap.py \
          --out "$R/gap_base$i.json" --budget-s 40 --runs defaults defaults
      else
        run $(( $(left) - 2 )) "gap_cur$i.log" python benchmarks/nano_host_gap.py --out "$R/gap_cur$i.json" \
          --budget-s 40 --runs defaults defaults
      fi
    done
    python - "$R" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "gap_*.json"))):
    runs = json.load(open(f)).get("runs", [])
    print(os.path.basename(f), [round(r["throughput_qwen3_0p6b_nanovllm_tok_s"]) for r in runs if "seconds" in r])
PY
    ;;
  *) echo "unknown NANO_PART=$PART"; exit 2 ;;
esac
echo "total $(( $(date +%s) - START )) s"
