"""The fused batch-1 stack's vectorized SiLU-and-mul (plugins/platforms/cpu_fused_decode_src.py ``silu_mul_row``)
gives the per-op path's bits: cpu_silu's kernel (itself checked against torch's ``SiluAndMul`` on every bf16 value)
on every bf16 gate value and on float32 gates over a wide range, NaN and infinities included, and on a width
that is not a multiple of the vector (the scalar tail)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from octavo.plugins.platforms import cpu_fused_decode, cpu_silu

pytestmark = pytest.mark.skipif(cpu_fused_decode.library() is None or cpu_silu.library() is None,
                                reason="the fused decode / SiLU kernels cannot be built here")


def _fused(gate: torch.Tensor, up: torch.Tensor, bf16: bool) -> torch.Tensor:
    fn = cpu_fused_decode.library().fused_silu_mul
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_void_p], None
    gu = torch.cat([gate.float(), up.float()])
    out = torch.empty_like(gate, dtype=torch.float32)
    fn(gu.data_ptr(), gate.numel(), int(bf16), out.data_ptr())
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_silu_is_cpu_silu_bitwise(dtype):
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bfloat16:
        gate = torch.arange(-32768, 32768, dtype=torch.int16).view(torch.bfloat16)
    else:
        gate = torch.cat([torch.randn(60_000, generator=g) * s for s in (1.0, 8.0, 60.0)]
                         + [torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30, -1e30])])
    gate = gate[: gate.numel() - gate.numel() % 128]
    up = (torch.randn(gate.numel(), generator=g) * 3).to(dtype)
    up[::997] = float("inf")
    want = cpu_silu.silu_mul(torch.cat([gate, up]).view(1, -1))
    assert want is not None
    got = _fused(gate, up, dtype == torch.bfloat16)
    if dtype == torch.bfloat16:
        got = got.to(torch.bfloat16)  # exact: the fused stack's values are bf16 values
        same = (got.view(torch.int16) == want.view(-1).view(torch.int16)) | (got.isnan() & want.view(-1).isnan())
    else:
        same = (got.view(torch.int32) == want.view(-1).view(torch.int32)) | (got.isnan() & want.view(-1).isnan())
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} differ"


def test_scalar_tail_matches_vector_body():
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(1536 + 7, generator=g) * 4, torch.randn(1536 + 7, generator=g)
    full = _fused(gate, up, False)
    head = _fused(gate[:1536], up[:1536], False)
    assert torch.equal(full[:1536], head)
    idx = list(range(64)) + list(range(1536, 1543))  # one element: the scalar code alone
    lane = torch.stack([_fused(gate[i:i + 1], up[i:i + 1], False) for i in idx]).view(-1)
    assert torch.equal(full[idx], lane)
