#!/usr/bin/env bash
# The whole GPU test suite: tests/gpu plus every test marked `gpu` elsewhere (and the CUDA-only files that are not
# marked), run as gpu_suite_share.sh's shares one after another in this lane. Argument: a (shares a1 a2 a3: tests/gpu),
# b (b1 b2 b3: the rest) or all (default). Bound: GPU_SUITE_LIMIT s for the whole call (default 380); each share
# gets what is left. Logs: $OUT/gpu_suite/pytest_<share>*.txt. GPU_SUITE_K: a pytest -k filter, default
# "not flashinfer" (flashinfer JIT-compiles its kernels on first use: minutes; its contract runs on its own).
# For parallel lanes, queue the shares themselves (gpu_suite_share.sh+a1 ... +b3, ~170 s each).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-all} in a) shares="a1 a2 a3" ;; b) shares="b1 b2 b3" ;; *) shares="a1 a2 a3 b1 b2 b3" ;; esac
end=$(( $(date +%s) + ${GPU_SUITE_LIMIT:-380} ))
for s in $shares; do
  left=$(( end - $(date +%s) ))
  [ "$left" -le 5 ] && { echo "share $s: not run (bound reached)"; continue; }
  GPU_SUITE_LIMIT=$left bash "$here/gpu_suite_share.sh" "$s"
done
