"""Run under TRITON_INTERPRET=1 and OCTAVO_FUSE_SILU_GEMV=1 by test_pdl_paths_cpu.py: the gate/up GEMV with
SiLU-and-mul in its epilogue (plugins/platforms/cuda_mlp_fusion.py) equals the unfused GEMV + SiLU-and-mul
kernels (same fixed tile in the interpreter, so bit for bit), plain and PDL paths; and installed on a real
LlamaMLP it changes a one-row forward by nothing, leaves several rows to the original forward, and is refused
for an MLP whose forward does something else."""

import types

import pytest
import torch

from octavo.plugins.platforms import cuda_fusions as cf
from octavo.plugins.platforms import cuda_mlp_fusion as cmf
from octavo.plugins.platforms.cuda_pdl import set_pdl


@pytest.mark.parametrize("i,k", [(40, 333), (64, 1024), (8, 64)])
@pytest.mark.parametrize("pdl", [False, True])
def test_gemv_silu_equals_gemv_then_silu_and_mul(i, k, pdl):
    g = torch.Generator().manual_seed(i * k)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * i, k, generator=g) * 0.1).to(torch.bfloat16)
    set_pdl(pdl)  # the interpreter's gdc intrinsics are no-ops; launch_opts passes PDL only then
    try:
        got = cmf.gemv_silu(x, w)
    finally:
        set_pdl(False)
    want = cf.silu_and_mul(cf.gemv(x, w))
    assert torch.equal(got, want)


@pytest.mark.parametrize("i,k,even,bn,bk", [(64, 2048, True, 16, 512), (40, 333, False, 16, 64),
                                            (16, 100, False, 16, 512), (16, 1024, True, 16, 1024)])
def test_gemv_silu_pdl_path_equals_plain(i, k, even, bn, bk):
    """The PDL path peels the first K tile (its gate/up weight loads move before ``gdc_wait``): same arithmetic
    on aligned, ragged and single-tile shapes."""
    import triton

    g = torch.Generator().manual_seed(i + k)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * i, k, generator=g) * 0.05).to(torch.bfloat16)
    outs = []
    for pdl in (False, True):
        y = torch.empty(1, i, dtype=torch.bfloat16)
        cmf._gemv_silu_kernel[(triton.cdiv(i, bn),)](x, w, y, i, k, w.stride(0), EVEN=even, BLOCK_N=bn, BLOCK_K=bk,
                                                     PDL=pdl)
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    gate, up = (x.double() @ w.double().T).split(i, dim=1)
    ref = torch.nn.functional.silu(gate) * up
    assert (outs[0].double() - ref).abs().max().item() < 0.05 * ref.abs().max().item() + 1e-3


def _mlp():
    from octavo.plugins.models.llama import LlamaMLP

    cfg = types.SimpleNamespace(hidden_size=64, intermediate_size=48, hidden_act="silu", mlp_bias=False)
    m = LlamaMLP(cfg).to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    for p in m.parameters():
        p.data = (torch.randn(p.shape, generator=g) * 0.1).to(torch.bfloat16)
    m.gate_up_proj.quant_method = cf._gemv_linear_method()  # as cuda_fusions.fuse_model installs them
    m.down_proj.quant_method = cf._gemv_linear_method()
    m.act_fn.forward = types.MethodType(cf._fused_silu_forward, m.act_fn)
    return m


@torch.inference_mode()
def test_installed_on_llama_mlp_changes_nothing():
    m = _mlp()
    x1 = torch.randn(1, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x3 = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    want1, want3 = m(x1), m(x3)
    assert cmf.fuse_silu_gemv(m, torch.bfloat16, torch.device("cpu"), cf._close) == {"MLP(gemv+silu)": 1}
    calls = []
    orig = cmf.gemv_silu
    cmf.gemv_silu = lambda *a: calls.append(1) or orig(*a)
    try:
        assert torch.equal(m(x1), want1) and len(calls) == 1  # the fused kernel ran, same result
        assert torch.equal(m(x3), want3) and len(calls) == 1  # several rows: the original forward
        cmf.set_silu_gemv(False)
        assert torch.equal(m(x1), want1) and len(calls) == 1  # switched off at run time
    finally:
        cmf.gemv_silu = orig
        cmf.set_silu_gemv(True)


def test_other_mlp_forwards_are_not_fused():
    m = _mlp()

    class Scaled(type(m)):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_up_proj(x))) * 2

    m.__class__ = Scaled
    assert cmf.fuse_silu_gemv(m, torch.bfloat16, torch.device("cpu"), cf._close) == {"MLP(gemv+silu)": 0}
