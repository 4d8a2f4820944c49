"""The batch-1 GEMV that loads its first K-blocks before the PDL wait (plugins/platforms/cuda_moe_oproj.py), used for
the MoE attention's o_proj (``o_early``) and qkv (``q_early``), on a CUDA GPU (skips without one).

At Qwen3-30B-A3B's o_proj (2048 x 4096) and qkv (5120 x 2048), bf16: ``cuda_fusions._gemv_kernel``'s bits for a tile
of the same BLOCK_K, eager and graph-replayed with new inputs. The engine's tile may differ in BLOCK_N and warps
(``moe_attention`` takes only the engine's BLOCK_K), so pairs with other BLOCK_N / warps are checked too: each row's
sum is over the same K-blocks in the same order whatever the rows per program.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

O_PROJ, QKV = (2048, 4096), (5120, 2048)
CASES = [  # (shape, PRE, early tile (BLOCK_N, BLOCK_K, warps), engine tile)
    (O_PROJ, 8, (4, 512, 4), (4, 512, 4)), (O_PROJ, 4, (8, 512, 4), (8, 512, 4)), (O_PROJ, 8, (8, 512, 8), (8, 512, 8)),
    (O_PROJ, 8, (8, 512, 8), (16, 512, 4)), (QKV, 4, (8, 512, 4), (8, 512, 4)), (QKV, 4, (16, 512, 8), (32, 512, 8)),
    (QKV, 2, (8, 1024, 4), (16, 1024, 8)), (QKV, 8, (16, 256, 8), (16, 256, 4)),
]


@pytest.mark.parametrize("shape,pre,tile,engine", CASES)
def test_early_gemv_gives_the_gemv_bits_eager_and_in_a_graph(shape, pre, tile, engine):
    from octavo.plugins.platforms.cuda_fusions import _gemv_kernel
    from octavo.plugins.platforms.cuda_moe_oproj import gemv_early
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    n, k = shape
    bn, bk, warps = tile
    gen = torch.Generator(device="cuda").manual_seed(pre)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).bfloat16()
    x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()

    def both():
        want = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        _gemv_kernel[(n // engine[0],)](x, w, None, want, n, k, w.stride(0), HAS_BIAS=False, EVEN=True,
                                        BLOCK_N=engine[0], BLOCK_K=engine[1], num_warps=engine[2], **launch_opts())
        return want, gemv_early(x, w, pre, bn, bk, warps)

    want, got = both()
    assert torch.equal(want, got)
    ref = x.double() @ w.double().t()
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap_want, cap_got = both()
    for seed in range(3):
        x.copy_(torch.randn(1, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
                .bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(cap_want, cap_got), seed
    del graph
