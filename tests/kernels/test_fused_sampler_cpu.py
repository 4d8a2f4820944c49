"""The fused Triton sampler and the fused Qwen3 q/k norm + rope kernel on the CPU: ``fused_sampler_cases.py`` and
``qk_norm_rope_cases.py`` under Triton's interpreter, in one child pytest (``TRITON_INTERPRET=1`` must be set
before any kernel is defined). Small vocabulary and few draws; the GPU run of the same files
(`NANO_PART=s5a bash benchmarks/device/nano7.sh`) uses the real vocabulary and many draws."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils import run_cases_interpreted

HERE = Path(__file__).parent


def test_fused_sampler_and_qk_norm_rope_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    run_cases_interpreted(HERE / "fused_sampler_cases.py", HERE / "qk_norm_rope_cases.py", timeout=900,
                          unset=("OCTAVO_FUSED_SAMPLER", "OCTAVO_FUSE_QK_NORM_ROPE"), forbid=("skipped", "failed"))
