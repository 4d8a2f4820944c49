"""The Triton GEMM of decode-step projections on the CPU: ``cuda_gemm_cases.py`` under Triton's interpreter in one
child pytest (``TRITON_INTERPRET=1`` must be set before any kernel is defined); small fp16/fp32 shapes. The GPU
run of the same file (``benchmarks/device/nano8.sh``) uses bf16 and the served shapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_cuda_gemm_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("OCTAVO_TRITON_GEMM", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-W", "ignore",
                           str(HERE / "cuda_gemm_cases.py")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
