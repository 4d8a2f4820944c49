"""The rotary kernel's ``EARLY`` (plugins/platforms/cuda_fusions.py, ``OCTAVO_ROPE_EARLY``; session 15, engineer fp815).

Why: at batch 1 the kernel waits (PDL) for the qkv GEMV, then reads the position, then cos / sin at it: two dependent
round trips on the critical path for values no kernel of the step writes (positions are copied in before the graph
replays, as the attention's lengths that it already reads before its wait). ``EARLY`` 1 reads them before the wait; 2
also lets the next kernel (the batch-1 attention) launch before the wait. Only load order and the trigger move.

CPU (Triton interpreter, child process): EARLY 1 / 2 with PDL give the bytes of the plain kernel (neox, interleaved,
partial rotary, several tokens). sm_90 compile: where the loads, the wait and the trigger sit. GPU-marked: after a
GEMV that writes q / k under PDL (as the qkv GEMV), the rotary output equals EARLY 0's bit for bit, eager and replayed
from a CUDA graph at other positions.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

KERNEL = r"""
import torch
from octavo.plugins.platforms import cuda_fusions as cf

g = torch.Generator().manual_seed(0)
for head, rot, neox in ((16, 16, True), (16, 16, False), (32, 16, True)):
    hq, hk, n = 4, 2, 3
    pos = torch.tensor([0, 5, 9])
    cos, sin = torch.randn(16, rot // 2, generator=g), torch.randn(16, rot // 2, generator=g)
    q = torch.randn(n, hq * head, generator=g).to(torch.bfloat16)
    k = torch.randn(n, hk * head, generator=g).to(torch.bfloat16)
    outs = {}
    for early in (0, 1, 2):
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        cf._rope_kernel[(n, 2)](pos, cos, sin, q, k, qo, ko, q.stride(0), k.stride(0), hq, hk, cos.stride(0),
                                HEAD=head, ROT=rot, HALF_P=rot // 2, PASS_P=head - rot if head > rot else 0,
                                BLOCK_H=4, NEOX=neox, PDL=True, EARLY=early)
        outs[early] = (qo, ko)
    for early in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(outs[early], outs[0])), (head, rot, neox, early)
    # float64: the first pair of the first head of token 1 (position 5), rotated
    a, b = (q[1, 0].double(), q[1, rot // 2].double()) if neox else (q[1, 0].double(), q[1, 1].double())
    c, s = cos[5, 0].double(), sin[5, 0].double()
    assert abs(outs[1][0][1, 0].double() - (a * c - b * s)) <= 2 ** -7 * (abs(a * c) + abs(b * s)) + 1e-6
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
def test_rope_early_same_bytes_interpreted():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(KERNEL)


@pytest.mark.parametrize("early", [0, 1, 2])
def test_sm90_rope_early_loads_and_trigger(early):
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.platforms.cuda_fusions import _rope_kernel

    sig = {"pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_ptr": "*bf16", "k_ptr": "*bf16",
           "q_out_ptr": "*bf16", "k_out_ptr": "*bf16", "stride_qt": "i32", "stride_kt": "i32", "num_q_heads": "i32",
           "num_k_heads": "i32", "stride_cos": "i32"}
    consts = dict(HEAD=128, ROT=128, HALF_P=64, PASS_P=0, BLOCK_H=32, NEOX=True, PDL=True, EARLY=early)
    src = triton.compiler.ASTSource(fn=_rope_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64)).asm["ptx"]
    wait, trig = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    before = len(re.findall(r"ld\.global", ptx[:wait]))
    assert (before >= 3) == bool(early) and (before == 0) == (not early), before  # position, cos, sin
    assert (trig < wait) == (early == 2)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                    reason="needs a Hopper GPU (PDL)")
@pytest.mark.parametrize("early", [1, 2])
def test_rope_early_after_a_pdl_gemv_on_cuda(early):
    from octavo.nn.rotary import get_rope
    from octavo.plugins.platforms import cuda_fusions as cf
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from tests.quant.fp8_inputs import assert_graph_replays_match

    gen = torch.Generator(device="cuda").manual_seed(2)
    k = 4096
    w, ws = quantize_fp8_rows(torch.randn(6144, k, device="cuda", generator=gen) * 0.02)
    nw = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16()
    rope = get_rope(128, rotary_dim=128, max_position=8192, base=500000.0, is_neox_style=True).cuda()
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    src = torch.randn(6, 1, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3

    def chain():  # norm -> qkv GEMV (PDL) -> rotary (PDL), as in a layer at batch 1
        _, _, q8, s8 = rms_norm_quant(x, nw, 1e-5)
        y = fp8_gemv(q8, w, ws, x_scale=s8, out_dtype=torch.bfloat16, config=(4, 1024, 4, 3), pdl=True, pdl_w=True)
        qo, ko = cf.rotary(rope, pos, y[:, :4096], y[:, 4096:5120])
        return y, qo, ko

    def plain():
        cf.ROPE_EARLY = 0
        try:
            return chain()
        finally:
            cf.ROPE_EARLY = early

    old = cf.ROPE_EARLY
    try:
        with torch.inference_mode():
            for p in (7, 3000):
                x.copy_(src[0])
                pos.fill_(p)
                want = plain()
                cf.ROPE_EARLY = early
                assert all(torch.equal(a, b) for a, b in zip(chain(), want)), p
            assert_graph_replays_match(chain, plain, x, src)
    finally:
        cf.ROPE_EARLY = old
