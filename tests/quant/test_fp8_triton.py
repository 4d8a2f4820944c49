"""The fused fp8 activation-quantization kernel against its torch reference, on CPU via TRITON_INTERPRET=1.

The GPU run (and its speed) is benchmarks/device/fp8perf.sh; here the interpreter checks the kernel's logic:
scales and e4m3 bytes bit-identical (the interpreter rounds to e4m3 in fp32 arithmetic; the hardware cast is
checked on the device), rows longer than one block, zero rows, odd widths.
"""

from __future__ import annotations

import pytest

from tests.utils import run_triton_interpreted

pytest.importorskip("triton")

SCRIPT = r"""
import torch
from octavo.plugins.quant.fp8_triton import quantize_per_token, quantize_per_token_torch
gen = torch.Generator().manual_seed(0)
for m, k in [(1, 64), (3, 100), (2, 5000)]:
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]).bfloat16()
    if m > 2:
        x[1] = 0
    q32, s = quantize_per_token(x, torch.float32)  # unpacked: e4m3-rounded values in fp32
    rq, rs = quantize_per_token_torch(x)
    assert torch.equal(s, rs), (m, k)
    assert torch.equal(q32, rq.float()), (m, k)
    q8, s8 = quantize_per_token(x)  # packed e4m3
    assert torch.equal(s8, rs) and torch.equal(q8.view(torch.uint8), rq.view(torch.uint8)), (m, k)
print("ok")
"""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="the interpreter check is for CPU machines (triton 3.6's interpreter fails on "
                    "this script); on a GPU the compiled kernel is checked by test_fused_fp8_quant_on_cuda")
def test_fused_fp8_quant_matches_torch_reference_interpreted():
    run_triton_interpreted(SCRIPT)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_fused_fp8_quant_on_cuda():
    """The compiled kernel on the GPU: scales equal the torch reference, and the fp8 bytes equal it (the
    hardware's e4m3 cast on both sides)."""
    import torch

    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator().manual_seed(0)
    for m, k in [(1, 64), (3, 100), (2, 5000), (64, 4096)]:
        x = (torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]).bfloat16().cuda()
        if m > 2:
            x[1] = 0
        q, s = quantize_per_token(x)
        # the exact IEEE quotient, rounded once: torch's CUDA `tensor / python_scalar` multiplies by the reciprocal,
        # which is 1 ulp off for some rows (H100, session 5), so quantize_per_token_torch is not the bitwise reference
        rs = (x.abs().amax(-1, keepdim=True).double() / 448.0).clamp(min=1e-12).float()
        rq = (x.float() / rs).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        assert torch.equal(s, rs), (m, k)
        mismatched = (q.view(torch.uint8) != rq.view(torch.uint8)).sum().item()
        assert mismatched <= max(1, q.numel() // 1_000_000), (m, k, mismatched)  # a rounding tie at most
