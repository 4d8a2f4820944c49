"""Run under TRITON_INTERPRET=1 by test_pdl_paths_cpu.py: the PDL code paths (plugins/platforms/cuda_pdl.py) of
cuda_fusions' kernels compute exactly what their plain paths do. The GEMV's PDL path peels the first K tile (its
weight load moves before ``gdc_wait``), so its arithmetic is checked on aligned, ragged and single-tile shapes;
the interpreter's gdc intrinsics are no-ops (the overlap itself is checked on a GPU: tests/gpu/test_pdl_gpu.py)."""

import pytest
import torch
import triton

from octavo.plugins.platforms import cuda_fusions as cf


@pytest.mark.parametrize("n,k,even,bn,bk", [(64, 2048, True, 16, 512), (100, 333, False, 16, 64),
                                            (64, 100, False, 16, 512), (48, 1024, True, 16, 1024)])
def test_gemv_pdl_path_equals_plain(n, k, even, bn, bk):
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    outs = []
    for pdl in (False, True):
        y = torch.empty(1, n, dtype=torch.bfloat16)
        cf._gemv_kernel[(triton.cdiv(n, bn),)](x, w, b, y, n, k, w.stride(0), HAS_BIAS=True, EVEN=even,
                                               BLOCK_N=bn, BLOCK_K=bk, PDL=pdl)
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    ref = x.double() @ w.double().T + b.double()
    assert (outs[0].double() - ref).abs().max().item() < 0.05 * ref.abs().max().item()


def test_norm_silu_rope_pdl_paths_equal_plain():
    g = torch.Generator().manual_seed(0)
    d = 96
    x, r, w = (torch.randn(3, d, generator=g).to(torch.bfloat16) for _ in range(3))
    pos = torch.tensor([0, 5, 9])
    cos, sin = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
    q, kk = torch.randn(3, 2 * 16, generator=g), torch.randn(3, 16, generator=g)
    outs = {}
    for pdl in (False, True):
        out, res_out = torch.empty(3, d, dtype=torch.bfloat16), torch.empty(3, d, dtype=torch.bfloat16)
        cf._rms_norm_kernel[(3,)](x, r, w, out, res_out, d, d, d, 1e-5, HAS_RES=True, BLOCK=128, PDL=pdl)
        s = torch.empty(3, d // 2, dtype=torch.bfloat16)
        cf._silu_and_mul_kernel[(3, 1)](x, s, d, d // 2, BLOCK=64, PDL=pdl)
        qo, ko = torch.empty_like(q), torch.empty_like(kk)
        cf._rope_kernel[(3, 2)](pos, cos, sin, q, kk, qo, ko, q.stride(0), kk.stride(0), 2, 1, cos.stride(0), HEAD=16,
                                ROT=16, HALF_P=8, PASS_P=0, BLOCK_H=2, NEOX=True, PDL=pdl)
        outs[pdl] = (out, res_out, s, qo, ko)
    assert all(torch.equal(a, b) for a, b in zip(outs[False], outs[True]))
