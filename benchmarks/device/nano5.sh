#!/usr/bin/env bash
# Issue 17, engineer "nano" (session 5): the fused sampler / Qwen3 q-k norm + rope on one GPU, hard bound 75 s.
# JSON + logs under $OUT/nano5/. NANO5_PART=b1 reruns batch 1's set; default (b2):
#   1. cases.log: tests/kernels/fused_sampler_cases.py + qk_norm_rope_cases.py on CUDA (vocab 151,936): kernel ==
#      Gumbel-max over its own noise, greedy == argmax, KS / chi-square, seeds (CUDA generators), processors,
#      min-p/top-k/top-p thresholds == the torch path's kept tokens; fused q/k norm + rope vs the eager layers.
#   2. attn.json: decode attention of the Qwen3-0.6B shape (batch 139, ctx 100-1600): backend launch vs the decode
#      kernel and a few launch configs (benchmarks/qwen3_attn_bench.py).
#   3. nano_sampler.json: nano-vllm workload (fused sampler) + decode-step kernel table; with
#      OCTAVO_TRITON_DECODE_KERNEL=1 if step 2 measured the decode kernel >= 3 % faster (the lead's nano.sh in the
#      same batch is then the A/B), else the default config.
# Batch 1 (NANO5_PART=b1): cases, nano-vllm fused vs torch sampler in one engine + kernel table, sampler and q/k
# microbenches (benchmarks/sampler_bench.py --qk-out).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/nano5"; mkdir -p "$R"
START=$(date +%s)
left() { echo $(( 73 - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}

echo "== cases $(date -u +%T)"
timeout -k 2 16 python -m pytest -q -x -p no:cacheprovider tests/kernels/fused_sampler_cases.py \
  tests/kernels/qk_norm_rope_cases.py > "$R/cases.log" 2>&1
echo "cases exit $?"; tail -n 15 "$R/cases.log"

if [ "${NANO5_PART:-b2}" = b1 ]; then
  CAP=$(( $(left) - 8 ))
  echo "== nano-vllm fused vs torch sampler (cap $CAP s) $(date -u +%T)"
  timeout -k 2 "$CAP" python benchmarks/nano_sampler.py --out "$R/nano_sampler.json" --budget-s $(( CAP - 2 )) \
    > "$R/nano_sampler.log" 2>&1
  echo "nano exit $?"; grep -v "^\[transformers\]" "$R/nano_sampler.log" | tail -n 45
  CAP=$(( $(left) ))
  echo "== sampler microbench, then qk norm + rope bench (cap $CAP s) $(date -u +%T)"
  timeout -k 2 "$CAP" python benchmarks/sampler_bench.py --out "$R/sampler_bench.json" --qk-out "$R/qk_bench.json" \
    > "$R/sampler_bench.log" 2>&1
  echo "micro exit $?"; tail -n 12 "$R/sampler_bench.log"
  echo "total $(( $(date +%s) - START )) s"; exit 0
fi

echo "== qwen3 decode attention (cap 14 s) $(date -u +%T)"
timeout -k 2 14 python benchmarks/qwen3_attn_bench.py --out "$R/attn.json" --budget 9 > "$R/attn.log" 2>&1
echo "attn exit $?"; tail -n 12 "$R/attn.log"
DK=$(python - "$R/attn.json" <<'PY' 2>/dev/null
import json, sys
v = json.load(open(sys.argv[1]))["variants"]
g = v["general_n64_w4_s2 (the backend today)"]["kv_TBps"]
d = v["decode_heads_n64_w4_s2 (OCTAVO_TRITON_DECODE_KERNEL=1)"]["kv_TBps"]
print(1 if d >= 1.03 * g else 0)
PY
)
[ "$DK" = 1 ] && export OCTAVO_TRITON_DECODE_KERNEL=1
CAP=$(( $(left) ))
echo "== nano-vllm, fused sampler, OCTAVO_TRITON_DECODE_KERNEL=${OCTAVO_TRITON_DECODE_KERNEL:-unset} (cap $CAP s) $(date -u +%T)"
timeout -k 2 "$CAP" python benchmarks/nano_sampler.py --out "$R/nano_sampler.json" --budget-s $(( CAP - 2 )) \
  --runs fused > "$R/nano_sampler.log" 2>&1
echo "nano exit $?"; grep -v "^\[transformers\]" "$R/nano_sampler.log" | tail -n 30
echo "total $(( $(date +%s) - START )) s"
