"""The batch-1 input norm + qkv GEMV launch (plugins/platforms/moe_norm_qkv.py) on a CUDA GPU (skips without one),
at the Qwen3-30B-A3B shape (H 2048, qkv rows 5120), bf16: the normalised row and the new residual bit-equal to the
fused RMSNorm kernel's, the qkv row bit-equal to cuda_fusions' GEMV kernel on that row at the same BLOCK_K (1, 2 or 4
K-blocks loaded before the wait; session 10), eager and replayed from a CUDA graph with new inputs right after a
producer (the PDL wait must hold)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("block_n,block_k,pre", [(16, 512, 1), (8, 1024, 1), (32, 256, 1), (16, 512, 2),
                                                 (8, 512, 4), (16, 1024, 2)])
def test_norm_qkv_at_the_qwen3_30b_shape_in_a_graph(block_n, block_k, pre):
    from octavo.plugins.platforms.cuda_fusions import _gemv_kernel, rms_norm
    from octavo.plugins.platforms.cuda_pdl import launch_opts
    from octavo.plugins.platforms.moe_norm_qkv import norm_qkv

    h, n = 2048, 5120
    gen = torch.Generator(device="cuda").manual_seed(block_n)
    nw = (1 + 0.2 * torch.randn(h, device="cuda", generator=gen)).bfloat16()
    w = (torch.randn(n, h, device="cuda", generator=gen) * h ** -0.5).bfloat16()
    src = torch.zeros(1, h, device="cuda", dtype=torch.bfloat16)
    res = torch.zeros(1, h, device="cuda", dtype=torch.bfloat16)

    def both():
        x = src * 1.0  # a producer kernel right before the fused launch
        return norm_qkv(x, res, nw, 1e-6, w, block_n, block_k, pre), rms_norm(x, nw, 1e-6, res)

    def engine_gemv(row):  # the engine GEMV's kernel at another BLOCK_N, the same BLOCK_K
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        _gemv_kernel[(n // 32,)](row, w, None, y, n, h, w.stride(0), HAS_BIAS=False, EVEN=True, BLOCK_N=32,
                                 BLOCK_K=block_k, num_warps=8, **launch_opts())
        return y

    def check(got, want, tag):
        (out, res_out, y), (want_out, want_res) = got, want
        assert torch.equal(out, want_out) and torch.equal(res_out, want_res), tag
        assert torch.equal(y, engine_gemv(want_out)), tag
        ref = want_out.double() @ w.double().t()
        assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-2, tag

    def fill(seed):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        src.copy_((torch.randn(1, h, device="cuda", generator=g) * 3).bfloat16())
        res.copy_(torch.randn(1, h, device="cuda", generator=g).bfloat16())

    fill(0)
    check(*both(), "eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = both()
    for seed in range(1, 4):
        fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        check(*captured, f"replay {seed}")
    del graph
