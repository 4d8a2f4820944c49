"""The ``triton`` backend's decode launch table and longest-first order on the CPU: ``triton_decode_cases.py``
under Triton's interpreter in one child pytest (``TRITON_INTERPRET=1`` must be set before any kernel is defined).
Small head sizes and contexts; the GPU run of the same file (`NANO_PART=cases bash benchmarks/device/nano7.sh`) uses the served shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils import run_cases_interpreted

HERE = Path(__file__).parent


def test_triton_decode_cases_under_triton_interpreter():
    pytest.importorskip("triton")
    run_cases_interpreted(HERE / "triton_decode_cases.py", timeout=900,
                          unset=("OCTAVO_TRITON_DECODE_KERNEL", "OCTAVO_TRITON_DECODE_LAUNCH", "OCTAVO_TRITON_DECODE_PACK"))
