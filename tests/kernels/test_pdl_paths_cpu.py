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
