"""The ``triton`` backend's decode launch table and longest-first order on the CPU: ``triton_decode_cases.py``
under Triton's interpreter in one child pytest (``TRITON_INTERPRET=1`` must be set before any kernel is defined).
Small head sizes and contexts; the GPU run of the same file (`NANO_PART=cases bash benchmarks/device/nano7.sh`) uses the served shapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_triton_decode_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    for name in ("OCTAVO_TRITON_DECODE_KERNEL", "OCTAVO_TRITON_DECODE_LAUNCH", "OCTAVO_TRITON_DECODE_PACK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-W", "ignore",
                           str(HERE / "triton_decode_cases.py")], env=env, capture_output=True, text=True,
                          timeout=900, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
