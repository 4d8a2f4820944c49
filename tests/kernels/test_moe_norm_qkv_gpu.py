"""The batch-1 input norm + qkv GEMV launch (plugins/platforms/moe_norm_qkv.py) on a CUDA GPU (skips without one),
at the Qwen3-30B-A3B shape (H 2048, qkv rows 5120), bf16: the normalised row and the new residual bit-equal to the
fused RMSNorm kernel's, the qkv row within bf16 rounding of the GEMV on that row, eager and replayed from a CUDA
graph with new inputs right after a producer (the PDL wait must hold)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("block_n,block_k", [(16, 512), (8, 1024), (32, 256)])
def test_norm_qkv_at_the_qwen3_30b_shape_in_a_graph(block_n, block_k):
    from octavo.plugins.platforms.cuda_fusions import gemv, rms_norm
    from octavo.plugins.platforms.moe_norm_qkv import norm_qkv

    h, n = 2048, 5120
    gen = torch.Generator(device="cuda").manual_seed(block_n)
    nw = (1 + 0.2 * torch.randn(h, device="cuda", generator=gen)).bfloat16()
    w = (torch.randn(n, h, device="cuda", generator=gen) * h ** -0.5).bfloat16()
    src = torch.zeros(1, h, device="cuda", dtype=torch.bfloat16)
    res = torch.zeros(1, h, device="cuda", dtype=torch.bfloat16)

    def both():
        x = src * 1.0  # a producer kernel right before the fused launch
        return norm_qkv(x, res, nw, 1e-6, w, block_n, block_k), rms_norm(x, nw, 1e-6, res)

    def check(got, want, tag):
        (out, res_out, y), (want_out, want_res) = got, want
        assert torch.equal(out, want_out) and torch.equal(res_out, want_res), tag
        ref = gemv(want_out, w).float()
        assert (y.float() - ref).abs().max() <= 2e-2 * ref.abs().max(), tag

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
