"""The PDL code paths (``OCTAVO_PDL=1``, plugins/platforms/cuda_pdl.py) of the decode-step kernels and the
gate/up + SiLU GEMV (``OCTAVO_FUSE_SILU_GEMV=1``, cuda_mlp_fusion.py) on the CPU: ``pdl_cases.py`` and
``mlp_fusion_cases.py`` under Triton's interpreter in one child pytest (``TRITON_INTERPRET=1`` must be set before
any kernel is defined); the one-shot all-reduce's PDL path runs in tests/distributed/test_oneshot_allreduce.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_pdl_paths_and_silu_gemv_under_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OCTAVO_FUSE_SILU_GEMV="1")
    env.pop("OCTAVO_PDL", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-W", "ignore",
                           str(HERE / "pdl_cases.py"), str(HERE / "mlp_fusion_cases.py")], env=env, capture_output=True, text=True, timeout=600,
                          cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout and "failed" not in proc.stdout
