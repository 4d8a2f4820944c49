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

from tests.utils import run_cases_interpreted

HERE = Path(__file__).parent


def test_pdl_paths_and_silu_gemv_under_triton_interpreter():
    pytest.importorskip("triton")
    run_cases_interpreted(HERE / "pdl_cases.py", HERE / "mlp_fusion_cases.py", unset=("OCTAVO_PDL",),
                          forbid=("skipped", "failed"), OCTAVO_FUSE_SILU_GEMV="1")


@pytest.mark.parametrize("value,expect", [(None, "off"), ("0", "off"), ("1", "RuntimeError: OCTAVO_PDL=1 needs"),
                                          ("yes", "ValueError: OCTAVO_PDL='yes'")])
def test_pdl_switch_on_a_machine_without_hopper(value, expect):
    """Unset (or 0): off where PDL cannot run; an explicit 1 there is refused naming the variable; any other
    value is refused at import (env_switch)."""
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    env = {k: v for k, v in os.environ.items() if k not in ("OCTAVO_PDL", "TRITON_INTERPRET")}
    if value is not None:
        env["OCTAVO_PDL"] = value
    code = ("from octavo.plugins.platforms import cuda_pdl as c\n"
            "try:\n    print('on' if c.pdl_on() else 'off')\n"
            "except Exception as e:\n    print(type(e).__name__ + ': ' + str(e))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:  # pragma: no cover
        out = "timeout"
    assert expect in out, out[-2000:]
