"""The quantizing RMSNorm reading its weight first (plugins/quant/fp8_fused.py, ``W_FIRST`` / ``OCTAVO_FP8_NORM_WFIRST``).

Why the lever: in sm_90 SASS of the default kernel the norm weight's load sits after the sum of squares' block reduction,
so at batch 1 it is a dependent round trip, and it goes to DRAM behind the first weight blocks of the GEMV the norm let
launch at its start. ``W_FIRST`` 1 reads it first (before a PDL wait) and triggers after x / residual are asked for; 2
triggers after the sum of squares. Only load order and trigger position move: the same bits.

CPU (Triton interpreter, child process): 1 and 2 give the bytes of 0 (out, residual, e4m3, scale) with and without a
residual, at one row, and the normed row within its two bf16 roundings of float64. sm_90 compile (Triton's own compiler,
the engine's launch flags): where the loads, the trigger and the wait sit in the PTX. GPU-marked: the 8B chain (norm ->
o-like GEMV -> residual norm -> qkv-like GEMV, under PDL as the engine launches them, the norm also under PDL) gives
the bits of ``W_FIRST`` 0, eager and replayed from a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import needs_cuda

pytest.importorskip("triton")

KERNEL = r"""
import torch
from octavo.plugins.quant import fp8_fused, fp8_triton
from octavo.plugins.quant.fp8_fused import rms_norm_quant

gen = torch.Generator().manual_seed(0)
for d in (256, 200):  # 200: the block (256) masked
    x = (torch.randn(1, d, generator=gen) * 2).bfloat16()
    res = (torch.randn(1, d, generator=gen) * 3).bfloat16()
    nw = (1 + 0.1 * torch.randn(d, generator=gen)).bfloat16()
    for r in (None, res):
        got = {}
        for at in (0, 1, 2):
            fp8_fused.W_FIRST_AT = at
            got[at] = rms_norm_quant(x, nw, 1e-5, r, q_dtype=torch.float32)
        for at in (1, 2):
            for a, b in zip(got[at], got[0]):
                assert (a is None and b is None) or torch.equal(a, b), (d, at, r is None)
        out, ro = got[1][0], (got[1][1] if r is not None else x)
        want = ro.double() * torch.rsqrt(ro.double().pow(2).mean() + 1e-5) * nw.double()
        assert ((out.double() - want).abs() <= want.abs() * 2 ** -6 + 1e-30).all(), d  # two truncating roundings
        rq, rs = fp8_triton.quantize_per_token_torch(out)
        assert torch.equal(got[1][3], rs) and torch.equal(got[1][2], rq.float()), d
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
def test_weight_first_same_bytes_interpreted():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(KERNEL)


def _ptx(**flags) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_fused import _rms_norm_quant_kernel

    sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16",
           "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "stride_x": "i32", "stride_r": "i32", "n_cols": "i32", "eps": "fp32"}
    consts = dict(HAS_RES=True, SOFT_FP8=False, BLOCK=4096, TRIGGER=True, **flags)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(10)}  # what the JIT specializes for the engine's tensors
    src = triton.compiler.ASTSource(fn=_rms_norm_quant_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 16}).asm["ptx"]


@pytest.mark.parametrize("w_first,wait", [(0, False), (1, False), (2, False), (1, True), (0, True)])
def test_sm90_loads_trigger_and_wait_sit_where_asked(w_first, wait):
    ptx = _ptx(WAIT=wait, W_FIRST=w_first)
    bar = ptx.index("bar.sync")  # the sum of squares' block reduction
    trig = ptx.index("griddepcontrol.launch_dependents")
    loads_before_bar = ptx[:bar].count("ld.global")
    assert loads_before_bar == (3 if w_first else 2), loads_before_bar  # x, residual (, weight): one round trip
    if w_first == 0:
        assert trig < ptx.index("ld.global")  # sessions 6-14: the trigger first
    elif w_first == 1:
        assert ptx[:trig].count("ld.global") == 3 and trig < bar
    else:  # after the sum of squares' reduction and rstd, before the absmax reduction
        assert ptx.index("rsqrt.approx") < trig < ptx.index("bar.sync", bar + 1)
        assert ptx[:trig].count("ld.global") == 3
    if wait:
        gw = ptx.index("griddepcontrol.wait")
        assert ptx[:gw].count("ld.global") == (1 if w_first else 0)  # only the weight, which no kernel writes


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("w_first,norm_pdl", [(1, False), (2, False), (1, True)])
def test_weight_first_chain_same_bits_on_cuda(w_first, norm_pdl):
    from octavo.plugins.quant import fp8_fused, fp8_prefetch
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from tests.quant.fp8_inputs import assert_graph_replays_match

    dev = torch.device("cuda")
    pdl = fp8_prefetch.hopper(dev)
    gen = torch.Generator(device="cuda").manual_seed(1)
    k = 4096
    w_o, ws_o = quantize_fp8_rows(torch.randn(k, k, device="cuda", generator=gen) * 0.02)
    w_q, ws_q = quantize_fp8_rows(torch.randn(6144, k, device="cuda", generator=gen) * 0.02)
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16()
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(6, 1, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
    launch = dict(pdl=True, pdl_w=True) if pdl else {}

    def chain():  # norm -> o-like GEMV -> residual norm of its output -> qkv-like GEMV, as in a layer
        _, _, q, s = rms_norm_quant(x, norm_w, 1e-5)
        y = fp8_gemv(q, w_o, ws_o, x_scale=s, out_dtype=torch.bfloat16, config=(16, 1024, 8, 3), **launch)
        h, r, q2, s2 = rms_norm_quant(y, norm_w, 1e-5, residual=x)
        z = fp8_gemv(q2, w_q, ws_q, x_scale=s2, out_dtype=torch.bfloat16, config=(4, 1024, 4, 3), **launch)
        return y, h, r, q2, s2, z

    def plain():
        fp8_fused.W_FIRST_AT, fp8_fused.NORM_PDL = 0, False
        try:
            return chain()
        finally:
            fp8_fused.W_FIRST_AT, fp8_fused.NORM_PDL = w_first, norm_pdl and pdl

    old = fp8_fused.W_FIRST_AT, fp8_fused.NORM_PDL
    try:
        with torch.inference_mode():
            x.copy_(src[0])
            want = plain()
            fp8_fused.W_FIRST_AT, fp8_fused.NORM_PDL = w_first, norm_pdl and pdl
            for got, ref in zip(chain(), want):
                assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                                   ref.view(torch.uint8) if ref.dtype == torch.float8_e4m3fn else ref)
            assert_graph_replays_match(chain, plain, x, src)
    finally:
        fp8_fused.W_FIRST_AT, fp8_fused.NORM_PDL = old
