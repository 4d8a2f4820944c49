"""The Triton 8-bit group dequant-GEMM (GPTQ 8-bit / W8A16 on CUDA) against a float64 product, on CPU via
TRITON_INTERPRET=1 (the kernel's indexing, masking and per-group scales/zeros, fp32 inputs: triton 3.9's
interpreter returns garbage for any bf16/fp16 ``tl.dot``, even ``dot(a, a)``). On a GPU the compiled kernel, bf16
path included, runs in the QuantizerContract CUDA tests (tests/quant/test_contract_int8.py, marked gpu)."""

from __future__ import annotations

import pytest

from tests.utils import run_triton_interpreted

pytest.importorskip("triton")

SCRIPT = r"""
import torch
from octavo.plugins.quant.int8_triton import int8_group_matmul
gen = torch.Generator().manual_seed(0)
for m, k, n, group, dtype, tol in [(1, 64, 96, 32, torch.float32, 1e-5), (5, 256, 130, 128, torch.float32, 1e-5),
                                   (17, 128, 64, 64, torch.float32, 1e-5), (70, 64, 64, 64, torch.float32, 1e-5)]:
    q = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int32).to(torch.int8)
    s = torch.rand(k // group, n, generator=gen) * 0.01 + 1e-3
    z = torch.randn(k // group, n, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = q.double() * s.double().repeat_interleave(group, 0) + z.double().repeat_interleave(group, 0)
    want = x.double() @ w
    got = int8_group_matmul(x, q, s, z)
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert got.shape == (m, n) and err < tol, (m, k, n, group, dtype, err)
print("ok")
"""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="the interpreter check is for CPU machines; on a GPU the compiled kernel is "
                    "checked by the QuantizerContract CUDA tests")
def test_int8_group_kernel_interpreted():
    run_triton_interpreted(SCRIPT)
