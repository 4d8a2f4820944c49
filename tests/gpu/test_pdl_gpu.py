"""Programmatic dependent launch (``OCTAVO_PDL=1``, plugins/platforms/cuda_pdl.py) on one GPU: a decode layer's
chain of Triton kernels (RMSNorm with residual -> GEMV -> rotary; RMSNorm -> gate/up GEMV -> SiLU-and-mul -> down
GEMV; the gate/up + SiLU GEMV of cuda_mlp_fusion.py), captured in a CUDA graph with PDL launches and replayed with new inputs, equals the same chain captured
without PDL bit for bit (PDL only moves when a kernel starts, never what it computes; a missing ``gdc_wait``
would read a half-written input). The GEMV runs both its aligned (EVEN) and masked paths. Needs an sm_90+ GPU."""

import pytest

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif("not _hopper()", reason="needs an sm_90+ GPU")
def test_pdl_chain_in_a_graph_equals_plain_launches():
    import torch

    from octavo.plugins.platforms import cuda_fusions as cf
    from octavo.plugins.platforms import cuda_mlp_fusion as cmf
    from octavo.plugins.platforms.cuda_pdl import set_pdl

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(torch.bfloat16)

    class Rope:  # the fields cuda_fusions.rotary reads
        head_size, rotary_dim, is_neox_style = 128, 128, True
        inv = 1.0 / (500000 ** (torch.arange(0, 128, 2, device=dev).float() / 128))
        freqs = torch.outer(torch.arange(4096, device=dev).float(), inv)
        cos_cache, sin_cache = freqs.cos(), freqs.sin()

    d, inter = 4096, 7168
    w_norm = rnd(d) + 1
    w_qkv, w_gu, w_down, w_odd = rnd(3072, d, scale=0.02), rnd(2 * inter, d, scale=0.02), rnd(d, inter, scale=0.02), \
        rnd(1000, 333)
    x, res, pos, x_odd = rnd(1, d), rnd(1, d), torch.tensor([7], device=dev), rnd(1, 333)

    def chain():
        h, r = cf.rms_norm(x, w_norm, 1e-5, res)
        qkv = cf.gemv(h, w_qkv)
        q, k = cf.rotary(Rope, pos, qkv[:, :2048], qkv[:, 2048:2560])
        h2 = cf.rms_norm(r, w_norm, 1e-5)
        y = cf.gemv(cf.silu_and_mul(cf.gemv(h2, w_gu)), w_down)
        return q, k, y, r, cf.gemv(x_odd, w_odd), cmf.gemv_silu(h2, w_gu), cf.silu_and_mul(cf.gemv(h2, w_gu))

    outs = {}
    for pdl in (False, True):
        set_pdl(pdl)
        try:
            chain()  # autotune / compile outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = chain()
            res_list = []
            for trial in range(3):
                for t in (x, res, x_odd):
                    t.copy_(torch.randn(t.shape, generator=torch.Generator(device=dev).manual_seed(trial),
                                        device=dev))
                g.replay()
                res_list.append([t.clone() for t in got])
            torch.cuda.synchronize()
            outs[pdl] = res_list
        finally:
            set_pdl(False)
    for trial, (a, b) in enumerate(zip(outs[False], outs[True])):
        for i, (u, v) in enumerate(zip(a, b)):
            assert torch.equal(u, v), f"trial {trial} output {i}: PDL changed the result"
    eager = chain()  # and both equal the eager chain of the last inputs
    assert all(torch.equal(u, v) for u, v in zip(eager, outs[False][-1]))
    fused, unfused = eager[-2].float(), eager[-1].float()  # gate/up + SiLU GEMV: tuned on its own, one rounding
    assert ((fused - unfused).abs() <= 1.6e-2 * unfused.abs() + 1e-3).all()
