"""The Triton GEMM of decode-step projections on CUDA (``plugins/platforms/cuda_gemm.py``): runs
``tests/kernels/cuda_gemm_cases.py`` in a child pytest on the GPU: every launch and shape of the committed tables
against float64, split-K bit-for-bit repeatable, PDL launches equal to plain ones, the float32 LM-head output, the
first-use check dropping a wrong launch. (The same file runs under Triton's interpreter on CPUs:
``tests/kernels/test_cuda_gemm_cpu.py``.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_cuda_gemm_cases_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OCTAVO_TRITON_GEMM")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-W", "ignore",
                           str(root / "tests" / "kernels" / "cuda_gemm_cases.py")], env=env, capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
