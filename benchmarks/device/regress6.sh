#!/usr/bin/env bash
# Session 6 regression hunt (lead): the nano-vllm workload (Qwen3-0.6B shape) fell from 18,002 (session 5) to
# 16,065 tok/s. One fresh process per variant, each switch off alone: which default costs the throughput?
# JSON per variant under $OUT/regress/<variant>/; summary at the end. REGRESS_CAP seconds per variant;
# REGRESS_VARIANTS: the names to run (default all; the warm second pass of session 6 was
# `REGRESS_VARIANTS="default pdl_off" REGRESS_CAP=35`, twice).
set -u
cd "$(dirname "$0")/../.."
R="$OUT/regress"; mkdir -p "$R"
CAP=${REGRESS_CAP:-55}
run() {  # name, env assignments...
  local name=$1; shift
  [[ " ${REGRESS_VARIANTS:-$name} " == *" $name "* ]] || return 0
  mkdir -p "$R/$name"
  echo "== $name ($*) $(date -u +%T)"
  env "$@" timeout -k 2 "$CAP" python benchmarks/gpu_e2e.py qwen3_nanovllm --out-dir "$R/$name" > "$R/$name.log" 2>&1
  echo "$name exit $?"; grep -ho '"throughput_qwen3_0p6b_nanovllm_tok_s": [0-9.]*' "$R/$name.log" | tail -1
}
run default OCTAVO_LOG_LEVEL=warning
run pdl_off OCTAVO_LOG_LEVEL=warning OCTAVO_PDL=0
run silu_off OCTAVO_LOG_LEVEL=warning OCTAVO_FUSE_SILU_GEMV=0
run decode_old OCTAVO_LOG_LEVEL=warning OCTAVO_TRITON_DECODE_KERNEL=0
run sampler_torch OCTAVO_LOG_LEVEL=warning OCTAVO_FUSED_SAMPLER=0
run all_off OCTAVO_LOG_LEVEL=warning OCTAVO_PDL=0 OCTAVO_FUSE_SILU_GEMV=0 OCTAVO_TRITON_DECODE_KERNEL=0
