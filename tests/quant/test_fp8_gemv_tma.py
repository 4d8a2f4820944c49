"""The one-row fp8 GEMV with TMA-streamed weight blocks (plugins/quant/fp8_gemv_tma.py, ``OCTAVO_FP8_GEMV_TMA``), and
down_proj's absmax from the SiLU kernel's pieces (fp8_silu_amax.py, ``OCTAVO_FP8_GEMV_TMA_AMAX``): the
same output bits as fp8_gemv's kernel (``torch.equal``) for in-kernel quantization (the unrolled absmax and the loop)
and prequantized input, with and without the first block read before the PDL wait, at 2-4 stages; weights with every
e4m3 magnitude class. CPU: TRITON_INTERPRET=1 in a subprocess (the interpreter runs the descriptor loads); GPU
(``gpu`` marker): the 8B o_proj / down shapes with the engine's launch (table tile 16x1024 w8, PDL, one block
before the wait, amax in flight, two blocks a trip for the plain kernel), eager and replayed from a CUDA graph. Also:
which launches it takes (``applies``), and the sm_90 PTX (Triton's compiler on the CPU): the bulk tensor copies with
their mbarriers, the first block's plain load before ``griddepcontrol.wait``.
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import needs_cuda

CHECK = r"""
import torch
from octavo.plugins.quant import fp8_gemv_tma, fp8_triton
from octavo.plugins.quant.fp8_gemv import fp8_gemv, fp8_gemv_reference


def weights(n, k, dev, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448)
    w[0, :8] = torch.tensor([2.0 ** -9, -(2.0 ** -9), 3 * 2.0 ** -9, 7 * 2.0 ** -9, 0.0, -0.0, 448.0, -448.0])
    w[1] *= 1e-4  # a row of subnormals and zeros
    return w.to(torch.float8_e4m3fn).to(dev), (torch.rand(n, generator=g) * 0.01 + 1e-3).float().to(dev)


def inputs(k, dev, seed):
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16).to(dev)
    x[0, :3] = torch.tensor([1e-6, -3e-5, 40.0])  # activations that quantize to e4m3 subnormals
    return x, *fp8_triton.quantize_per_token(x)
"""

INTERPRETED = CHECK + r"""
n_done = 0
for n, k, seed in ((64, 256, 0), (32, 448, 1)):
    wq, ws = weights(n, k, "cpu", seed)
    x, xq, xs = inputs(k, "cpu", seed)
    base = {"own": fp8_gemv(x, wq, ws), "pre": fp8_gemv(xq, wq, ws, x_scale=xs, out_dtype=torch.bfloat16)}
    want = fp8_gemv_reference(x, wq, ws)
    for kind, amax in (("own", 2048), ("pre", 0)):
        for stages in (2, 3, 4):
            for pdl_w in (0, 1):
                y = torch.empty(1, n, dtype=torch.bfloat16)
                fp8_gemv_tma.launch(xq if kind == "pre" else x, xs if kind == "pre" else None, wq, ws, y,
                                    dict(QUANT_X=kind == "own", PRE_Q=kind == "pre", PDL_W=pdl_w),
                                    {"ACC_SPLIT": 16, "AMAX_KP": amax}, (16, 64, 4), True, stages=stages)
                assert torch.equal(y, base[kind]), (n, k, kind, amax, stages, pdl_w)
                n_done += 1
    y = torch.empty(1, n, dtype=torch.bfloat16)  # the absmax from a producer's pieces (fp8_silu_amax.py)
    parts = torch.stack([x[0, i:i + 96].float().abs().max() for i in range(0, k, 96)])
    fp8_gemv_tma.AMAX_FROM_PRODUCER = True
    fp8_gemv_tma.launch(x, None, wq, ws, y, dict(QUANT_X=True, PRE_Q=False, PDL_W=1), {"ACC_SPLIT": 16},
                        (16, 64, 4), True, stages=3, x_amax=parts)
    fp8_gemv_tma.AMAX_FROM_PRODUCER = False
    assert torch.equal(y, base["own"]), (n, k, "producer amax")
    n_done += 1
    assert float((base["own"].double() - want).abs().max() / want.abs().max()) < 1e-2
# the SiLU kernel with the absmax pieces: cuda_fusions.silu_and_mul's bits, each piece the max of its columns
from octavo.plugins.platforms.cuda_fusions import silu_and_mul
from octavo.plugins.quant.fp8_silu_amax import silu_and_mul_amax

for d in (4096 + 64, 2048, 300):
    xg = (torch.randn(1, 2 * d, generator=torch.Generator().manual_seed(d)) * 3).to(torch.bfloat16)
    out, amax = silu_and_mul_amax(xg)
    assert torch.equal(out, silu_and_mul(xg)), d
    block = min(2048, 1 << (d - 1).bit_length())
    assert torch.equal(amax[0], torch.stack([out[0, i:i + block].float().abs().max() for i in range(0, d, block)])), d
    n_done += 1
print("checked", n_done)
print("ok")
"""

ON_CUDA = CHECK + r"""
from octavo.plugins.quant import fp8_gemv as fp8_gemv_module

TILE = (16, 1024, 8, 3)
for (n, k), seed in (((4096, 4096), 0), ((4096, 14336), 1)):
    wq, ws = weights(n, k, "cuda", seed)
    x, xq, xs = inputs(k, "cuda", seed)
    x2 = (x.float() * 3).to(torch.bfloat16)
    for kind in ("own", "pre"):
        args = (x, wq, ws) if kind == "own" else (xq, wq, ws)
        kw = dict(config=TILE, pdl=True, pdl_w=1, loop2=2) | ({"x_scale": xs, "out_dtype": torch.bfloat16}
                                                             if kind == "pre" else {})
        fp8_gemv_tma.STAGES = 0
        base = fp8_gemv(*args, **kw)
        for stages, l2 in ((3, 0), (3, 2), (4, 3), (2, 1)):
            fp8_gemv_tma.STAGES, fp8_gemv_tma.L2_BLOCKS = stages, l2
            assert fp8_gemv_tma.applies(1, n, k, {"PDL_W": 1}, {"ACC_SPLIT": 16}, TILE, None, None, 0, False)
            got = fp8_gemv(*args, **kw)
            assert torch.equal(got, base), (n, k, kind, stages, l2, int((got != base).sum()))
            if kind == "own" and l2 == 2:  # a CUDA graph replayed on new input: the same bits as eager
                xin = x.clone()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = fp8_gemv(xin, wq, ws, **kw)
                xin.copy_(x2)
                g.replay()
                fp8_gemv_tma.STAGES = 0
                want = fp8_gemv(x2, wq, ws, **kw)
                fp8_gemv_tma.STAGES = stages
                torch.cuda.synchronize()
                assert torch.equal(out, want), (n, k, "graph", stages)
            print("ok", n, k, kind, stages, l2, flush=True)
fp8_gemv_tma.STAGES, fp8_gemv_tma.L2_BLOCKS = 0, 0
# down's absmax from the SiLU kernel's pieces: the SiLU output bits of the platform kernel, the GEMV bits of the plain
from octavo.plugins.platforms.cuda_fusions import silu_and_mul
from octavo.plugins.quant.fp8_silu_amax import silu_and_mul_amax

wq, ws = weights(4096, 14336, "cuda", 5)
xg = (torch.randn(1, 2 * 14336, generator=torch.Generator().manual_seed(7)) * 3).to(torch.bfloat16).cuda()
out, amax = silu_and_mul_amax(xg)
assert torch.equal(out, silu_and_mul(xg)) and amax.shape == (1, 7)
assert float(amax.max()) == float(out.float().abs().max())
kw = dict(config=TILE, pdl=True, pdl_w=1, loop2=2)
base = fp8_gemv(out, wq, ws, **kw)
fp8_gemv_tma.STAGES, fp8_gemv_tma.L2_BLOCKS, fp8_gemv_tma.AMAX_FROM_PRODUCER = 3, 2, True
got = fp8_gemv(out, wq, ws, alt={"x_amax": amax.view(-1)}, **kw)
fp8_gemv_tma.STAGES, fp8_gemv_tma.L2_BLOCKS, fp8_gemv_tma.AMAX_FROM_PRODUCER = 0, 0, False
assert torch.equal(got, base), int((got != base).sum())
print("ok silu amax", flush=True)
print("PASS")
"""


def test_fp8_gemv_tma_interpreted_bit_identical():
    from tests.utils import run_triton_interpreted

    out = run_triton_interpreted(INTERPRETED)
    assert "checked 29" in out.stdout


@pytest.mark.gpu
@needs_cuda
def test_fp8_gemv_tma_on_cuda_bit_identical():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", ON_CUDA], capture_output=True, text=True, timeout=600, cwd=root)
    print(r.stdout[-3000:])
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_applies_only_to_the_plain_one_row_launch():
    from octavo.plugins.quant import fp8_gemv_tma as t

    tile, one = (16, 1024, 8, 3), {"ACC_SPLIT": 16}
    ok = dict(m=1, n=4096, k=14336, flags={"PDL_W": 1, "USE_PDL": True}, one_row=one, config=tile, bias=None,
              tail=None, pf_total=0, self_pf=False, stages=3)
    assert t.applies(**ok)
    assert not t.applies(**{**ok, "stages": 0})
    for change in ({"m": 2}, {"n": 6144, "k": 4096}, {"bias": torch.zeros(1)}, {"tail": {}}, {"pf_total": 1},
                   {"self_pf": True}, {"config": None}, {"flags": {"PDL_W": 2}}, {"one_row": {"ACC_SPLIT": 0}},
                   {"one_row": {"ACC_SPLIT": 16, "REG_PF": True}}, {"one_row": {"ACC_SPLIT": 16, "X2D": True}}):
        assert not t.applies(**{**ok, **change}), change


@pytest.mark.parametrize("stages", [2, 4])
def test_sm90_ptx_bulk_copies_and_the_first_block_before_the_wait(stages):
    """With the first block in registers (``PDL_W`` 1): its plain load before ``griddepcontrol.wait``, the bulk
    tensor copies after it, ``stages - 1`` of them before the first mbarrier wait."""
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_gemv_tma import _fp8_gemv_tma_kernel

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_desc": "tensordesc<fp8e4nv[16, 1024]>", "w_ptr": "*fp8e4nv",
           "ws_ptr": "*fp32", "y_ptr": "*bf16", "K": "i32", "stride_wn": "i32", "n_parts": "i32"}
    consts = dict(QUANT_X=True, PRE_Q=False, SOFT_FP8=False, BLOCK_N=16, BLOCK_K=1024, ACC_SPLIT=16, AMAX_KP=16384,
                  USE_PDL=True, PDL_W=1, STAGES_=stages, L2PF=0, PARTS_P=0)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 3, 4, 5, 6, 7)}
    src = triton.compiler.ASTSource(fn=_fp8_gemv_tma_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 8}).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "ld.global" in ptx[:wait]  # the first weight block (and the scales) before the wait
    assert "cp.async.bulk.tensor" not in ptx[:wait] and "cp.async.bulk.tensor" in ptx[wait:]
    assert "mbarrier.try_wait" in ptx[wait:]
    # stages - 1 copies issued before the loop's first wait on a buffer (the pipeline's prologue), none of the first
    # block's math (its quantizing divisions) before them
    first_wait = ptx.index("mbarrier.try_wait", wait)
    assert ptx[wait:first_wait].count("cp.async.bulk.tensor") == stages - 1, ptx[wait:first_wait].count("cp.async")
    assert "div.rn.f32" not in ptx[wait:ptx.index("cp.async.bulk.tensor", wait)]


def test_sm90_ptx_l2_prefetch_then_copies_right_after_the_absmax():
    """``L2PF`` (no register block): one bulk L2 prefetch a row, from one thread, before the wait; after it the absmax's loads and the
    pipeline's copies, with no reduction and no math between them (the scale is taken in the loop's first trip)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_gemv_tma import _fp8_gemv_tma_kernel

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_desc": "tensordesc<fp8e4nv[16, 1024]>", "w_ptr": "*fp8e4nv",
           "ws_ptr": "*fp32", "y_ptr": "*bf16", "K": "i32", "stride_wn": "i32", "n_parts": "i32"}
    consts = dict(QUANT_X=True, PRE_Q=False, SOFT_FP8=False, BLOCK_N=16, BLOCK_K=1024, ACC_SPLIT=16, AMAX_KP=16384,
                  USE_PDL=True, PDL_W=0, STAGES_=3, L2PF=2, PARTS_P=0)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 3, 4, 5, 6, 7)}
    src = triton.compiler.ASTSource(fn=_fp8_gemv_tma_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 8}).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "launch_dependents" in ptx[wait:]
    # one request a row (16 rows), each from thread 0 only (s16a's version asked for every row from 16 threads)
    assert ptx[:wait].count("cp.async.bulk.prefetch.L2") == 16
    assert ptx[:wait].count("setp.eq.u32 p, t, 0") == 16
    first_copy = ptx.index("cp.async.bulk.tensor", wait)
    # the absmax's loads are only asked for: no max over them and no division before the copies
    assert ptx[wait:first_copy].count("ld.global") >= 8
    assert "div.rn.f32" not in ptx[wait:first_copy] and "max.f32" not in ptx[wait:first_copy]
