"""The fused Triton sampler and the fused Qwen3 q/k norm + rope kernel on the CPU: ``fused_sampler_cases.py`` and
``qk_norm_rope_cases.py`` under Triton's interpreter, in one child pytest (``TRITON_INTERPRET=1`` must be set
before any kernel is defined). Small vocabulary and few draws; the GPU run of the same files
(`NANO_PART=s5a bash benchmarks/device/nano7.sh`) uses the real vocabulary and many draws."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_fused_sampler_and_qk_norm_rope_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("OCTAVO_FUSED_SAMPLER", None)
    env.pop("OCTAVO_FUSE_QK_NORM_ROPE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-W", "ignore",
                           str(HERE / "fused_sampler_cases.py"), str(HERE / "qk_norm_rope_cases.py")], env=env, capture_output=True, text=True,
                          timeout=900, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout and "failed" not in proc.stdout
