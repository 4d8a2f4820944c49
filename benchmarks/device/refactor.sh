#!/usr/bin/env bash
# Session 6, engineer "refactor": the GPU tests of the kernels moved from core/ into the CUDA platform plugin
# (plugins/platforms/cuda_sampler.py, cuda_grammar_mask.py, cuda_kernel_cache.py), one GPU, hard bound 60 s.
# One pytest run (one torch import): the fused sampler's cases at the real vocabulary (Gumbel-max == kernel,
# KS / chi-square, seeds, processors, thresholds), the grammar mask apply == host apply (Triton and table),
# the engine wiring (tests/gpu/test_platform_kernels_gpu.py: LLM's runner holds the platform's kernels, random
# rows go through the fused sampler, seeded tokens alone == in a batch), PlatformContract on the CUDA platform
# (its sampler and mask apply against the core's rules) and the shipped Triton cache tests.
# Log + junit XML under $OUT/refactor/.
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/refactor"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
export OCTAVO_LOG_LEVEL=${OCTAVO_LOG_LEVEL:-warning}
echo "== refactor GPU tests (cap 58 s) $(date -u +%T)"
timeout -k 2 58 python -m pytest -v -p no:cacheprovider -W ignore --junitxml="$R/junit.xml" \
  tests/gpu/test_platform_kernels_gpu.py tests/gpu/test_cuda_platform.py tests/structured/test_apply_device.py \
  tests/unit/test_kernel_cache.py tests/kernels/fused_sampler_cases.py > "$R/pytest.log" 2>&1
echo "pytest exit $?" | tee "$R/exit.txt"; tail -n 25 "$R/pytest.log"
echo "total ${SECONDS} s"
