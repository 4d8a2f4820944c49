"""The one-row fp8 GEMV's integer weight conversion (``W_BITS``, plugins/quant/fp8_gemv.py): e4m3 bytes become
fp32 (value * 2**-120) by integer ops and the activations are scaled by 2**64, so every product and partial sum is
the conversion path's times an exact power of two: the output must be bit-for-bit the same (``torch.equal``),
for in-kernel activation quantization and for prequantized (norm-made) e4m3 input, with weights that hold every
e4m3 magnitude class (subnormals, +-0, the largest finite +-448). Also against the float64 reference. The register
prefetch of the next weight block (``REG_PF``) keeps the sums and their order: bit-identical too, as is the absmax with
all its loads in flight at once (``amax_one``) and the loop that loads two or four weight blocks a trip (``LOOP2``). CPU:
TRITON_INTERPRET=1 in a subprocess (~10 s); GPU (``gpu`` marker): the compiled kernel at the Llama-3-8B shapes
with one tile of the autotune set (the autotuned launch runs in benchmarks/fp8_bs1.py's "bits" variant, whose
greedy tokens must equal the conversion path's).
"""

from __future__ import annotations

import pytest
import torch

CHECK = r"""
import torch
from octavo.plugins.quant import fp8_triton
from octavo.plugins.quant import fp8_gemv as fp8_gemv_module
from octavo.plugins.quant.fp8_gemv import fp8_gemv, fp8_gemv_reference


def weights(n, k, dev, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448)
    w[0, :8] = torch.tensor([2.0 ** -9, -(2.0 ** -9), 3 * 2.0 ** -9, 7 * 2.0 ** -9, 0.0, -0.0, 448.0, -448.0])
    w[1] *= 1e-4  # a row of subnormals and zeros
    wq = w.to(torch.float8_e4m3fn).to(dev)
    return wq, (torch.rand(n, generator=g) * 0.01 + 1e-3).float().to(dev)


def check(n, k, dev, configs, seed=0):
    wq, ws = weights(n, k, dev, seed)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16).to(dev)
    x[0, :3] = torch.tensor([1e-6, -3e-5, 40.0])  # activations that quantize to e4m3 subnormals
    xq, xs = fp8_triton.quantize_per_token(x)
    want = fp8_gemv_reference(x, wq, ws).cpu()
    for cfg in configs:
        for pre in (False, True):
            kw = dict(x_scale=xs, out_dtype=torch.bfloat16) if pre else {}
            xin = xq if pre else x
            a = fp8_gemv(xin, wq, ws, config=cfg, w_bits=False, reg_pf=False, acc_split=0, **kw)
            b = fp8_gemv(xin, wq, ws, config=cfg, w_bits=True, acc_split=0, **kw)
            if pre:  # x read in the weight tile's layout: the same bits as the broadcast
                assert torch.equal(fp8_gemv(xin, wq, ws, config=cfg, x2d=True, **kw),
                                   fp8_gemv(xin, wq, ws, config=cfg, x2d=False, **kw)), (n, k, cfg)
            elif not fp8_gemv_module.REG_PF:  # the absmax with every load in flight at once: the same bits
                assert torch.equal(fp8_gemv(xin, wq, ws, config=cfg, amax_one=True),
                                   fp8_gemv(xin, wq, ws, config=cfg, amax_one=False)), (n, k, cfg)
            # two weight blocks a trip: the same bits (compiled, EVEN shapes only; the interpreter checks it below)
            for trip in (2, 4) if not fp8_gemv_module.REG_PF else ():
                assert torch.equal(fp8_gemv(xin, wq, ws, config=cfg, loop2=trip, **kw),
                                   fp8_gemv(xin, wq, ws, config=cfg, loop2=0, **kw)), (n, k, cfg, trip)
            c = fp8_gemv(xin, wq, ws, config=cfg, **kw)  # the defaults (the split accumulator): within a bf16 step
            assert bool(((c.float() - a.float()).abs() <= a.float().abs() * 2.0 ** -7 + 1e-6).all()), (n, k, cfg)
            assert torch.equal(a, b), (n, k, cfg, pre, float((a.float() - b.float()).abs().max()))
            err = float((b.cpu().double() - want).abs().max() / want.abs().max())
            assert err < 1e-2, (n, k, cfg, pre, err)
            print("equal", n, k, cfg, "pre" if pre else "quant", f"{err:.1e}")
"""

INTERPRETED = CHECK + r"""
check(48, 256, "cpu", [None])
check(33, 200, "cpu", [None], seed=3)
check(16, 2500, "cpu", [None], seed=4)  # two absmax rounds of 2048 (amax_one), the last one masked

# the EVEN kernel (K a multiple of BLOCK_K, every row real) with each of W_BITS / REG_PF: all four bit-identical
import triton
from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel
n, k, bn, bk = 32, 512, 16, 128
wq, ws = weights(n, k, "cpu", 5)
x = torch.randn(1, k, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
want = fp8_gemv_reference(x, wq, ws)
outs = []
for bits in (False, True):
    for reg_pf in (False, True):
        y = torch.empty(1, n, dtype=torch.bfloat16)
        _fp8_gemv_kernel[(triton.cdiv(n, bn),)](x, ws, wq, ws, None, y, wq, 0, 16, 1, n, k, x.stride(0),
                                                wq.stride(0), y.stride(0), QUANT_X=True, PRE_Q=False,
                                                HAS_BIAS=False, EVEN=True, SOFT_FP8=True, BLOCK_N=bn, BLOCK_K=bk,
                                                W_BITS=bits, REG_PF=reg_pf)
        outs.append(y)
        err = float((y.double() - want).abs().max() / want.abs().max())
        assert err < 1e-2, (bits, reg_pf, err)
assert all(torch.equal(outs[0], o) for o in outs[1:]), [float((o.float() - outs[0].float()).abs().max()) for o in outs]
# blocks read before the (absent) wait and the two-blocks-a-trip loop, with an odd block left for the plain loop:
# the same sums in the same order
def run(block_k, pdl_w, loop2):
    y = torch.empty(1, n, dtype=torch.bfloat16)
    _fp8_gemv_kernel[(triton.cdiv(n, bn),)](x, ws, wq, ws, None, y, wq, 0, 16, 1, n, k, x.stride(0),
                                            wq.stride(0), y.stride(0), QUANT_X=True, PRE_Q=False,
                                            HAS_BIAS=False, EVEN=True, SOFT_FP8=True, BLOCK_N=bn, BLOCK_K=block_k,
                                            PDL_W=pdl_w, LOOP2=loop2)
    return y


for pdl_w, loop2 in ((0, 2), (1, 2), (2, 2), (3, 0), (1, 0), (0, 4), (1, 4)):  # 4 blocks of 128
    assert torch.equal(run(bk, pdl_w, loop2), outs[0]), (pdl_w, loop2)
base = run(64, 0, 0)  # 8 blocks of 64: a trip of four, a pair and an odd block after one block before the wait
for pdl_w, loop2 in ((1, 4), (0, 4), (3, 4), (1, 2)):
    assert torch.equal(run(64, pdl_w, loop2), base), (pdl_w, loop2)
# the split accumulator (ACC_SPLIT): the same exact products summed in another fp32 order: within a bf16 step
for split in (8, 16):
    for reg_pf in (False, True):
        y = torch.empty(1, n, dtype=torch.bfloat16)
        _fp8_gemv_kernel[(triton.cdiv(n, bn),)](x, ws, wq, ws, None, y, wq, 0, 16, 1, n, k, x.stride(0),
                                                wq.stride(0), y.stride(0), QUANT_X=True, PRE_Q=False,
                                                HAS_BIAS=False, EVEN=True, SOFT_FP8=True, BLOCK_N=bn, BLOCK_K=bk,
                                                REG_PF=reg_pf, ACC_SPLIT=split)
        err = float((y.double() - want).abs().max() / want.abs().max())
        step = float(((y.float() - outs[0].float()).abs() - outs[0].float().abs() * 2.0 ** -7).max())
        assert err < 1e-2 and step <= 0, (split, reg_pf, err, step)
# prequantized input read in the weight tile's layout (X2D): bit-identical to the broadcast, with either accumulator
xq, xs = fp8_triton.quantize_per_token(x)
for split in (0, 16):
    pair = []
    for x2d in (False, True):
        y = torch.empty(1, n, dtype=torch.bfloat16)
        _fp8_gemv_kernel[(triton.cdiv(n, bn),)](xq, xs.reshape(-1), wq, ws, None, y, wq, 0, 16, 1, n, k, xq.stride(0),
                                                wq.stride(0), y.stride(0), QUANT_X=False, PRE_Q=True,
                                                HAS_BIAS=False, EVEN=True, SOFT_FP8=True, BLOCK_N=bn, BLOCK_K=bk,
                                                ACC_SPLIT=split, X2D=x2d)
        pair.append(y)
    assert torch.equal(pair[0], pair[1]), split
    assert float((pair[1].double() - want).abs().max() / want.abs().max()) < 1e-2
print("ok")
"""


def test_fp8_gemv_bits_interpreted_bit_identical():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(INTERPRETED)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_gemv_bits_on_cuda_bit_identical():
    scope: dict = {}
    exec(CHECK, scope)  # noqa: S102 - the check shared with the interpreter test
    from octavo.plugins.quant import fp8_gemv as fg

    old = fg.REG_PF
    try:
        for reg_pf in (False, True):  # one tile: 8 compiles in all
            fg.REG_PF = reg_pf
            for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
                scope["check"](n, k, "cuda", [(8, 1024, 4)])
    finally:
        fg.REG_PF = old
    # the split accumulator: another fp32 order, within a bf16 step of the conversion path, and vs float64
    from octavo.plugins.quant.fp8_gemv import fp8_gemv, fp8_gemv_reference

    for n, k in ((6144, 4096), (4096, 14336)):
        wq, ws = scope["weights"](n, k, "cuda", 7)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        base = fp8_gemv(x, wq, ws, config=(8, 1024, 4), acc_split=0).float()
        want = fp8_gemv_reference(x, wq, ws).float()
        for split in (8, 16):
            y = fp8_gemv(x, wq, ws, config=(8, 1024, 4), acc_split=split).float()
            assert bool(((y - base).abs() <= base.abs() * 2.0 ** -7 + 1e-6).all()), (n, k, split)
            assert float((y - want).abs().max() / want.abs().max()) < 1e-2
