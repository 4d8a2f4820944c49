"""The Triton GEMM of decode-step projections on the CPU: ``cuda_gemm_cases.py`` under Triton's interpreter in one
child pytest (``TRITON_INTERPRET=1`` must be set before any kernel is defined); small fp16/fp32 shapes. The GPU
run of the same file (``benchmarks/device/nano8.sh``) uses bf16 and the served shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils import run_cases_interpreted

HERE = Path(__file__).parent


def test_cuda_gemm_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    run_cases_interpreted(HERE / "cuda_gemm_cases.py", unset=("OCTAVO_TRITON_GEMM",))
