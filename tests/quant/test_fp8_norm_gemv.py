"""The quantizing RMSNorm in the prologue of a persistent one-row fp8 GEMV (plugins/quant/fp8_norm_gemv.py): against
the two kernels it would replace, ``rms_norm_quant`` then ``fp8_gemv`` on the norm's e4m3 copy. Under the interpreter
(both sum the squares alike) the output and the new residual are bit-equal, for 1-5 programs (one or several tiles
each), with and without a residual, 1-4 blocks a row; on the GPU (``gpu`` marker, the 8B qkv / gate_up shapes, the
table's 4x1024 tile, PDL, a replayed graph) the residual is exact and the output within the float64 reference's
tolerance, the elements that differ from the two-kernel path counted (another fp32 order for the sum of squares).
Also: the refusals, and the sm_90 PTX (the norm weight and the first weight block before ``griddepcontrol.wait``).
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import needs_cuda

CHECK = r"""
import torch
from octavo.plugins.quant.fp8_fused import rms_norm_quant
from octavo.plugins.quant.fp8_gemv import fp8_gemv, fp8_gemv_reference
from octavo.plugins.quant.fp8_norm_gemv import norm_gemv


def case(n, k, res, dev, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=g) * 3).to(torch.bfloat16).to(dev)
    r = torch.randn(1, k, generator=g).to(torch.bfloat16).to(dev) if res else None
    nw = (torch.rand(k, generator=g) + 0.5).to(torch.bfloat16).to(dev)
    w = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).to(dev)
    ws = (torch.rand(n, generator=g) * 0.01 + 1e-3).to(dev)
    return x, r, nw, w, ws
"""

INTERPRETED = CHECK + r"""
done = 0
for n, k, res, seed in ((96, 256, True, 0), (64, 256, False, 1), (48, 128, True, 2), (32, 64, True, 3)):
    x, r, nw, w, ws = case(n, k, res, "cpu", seed)
    out, ro, q, s = rms_norm_quant(x, nw, 1e-5, r, q_dtype=torch.float32)  # the interpreter's fp8 cast: see fp8_e4m3
    want = fp8_gemv(q.to(torch.float8_e4m3fn), w, ws, x_scale=s, out_dtype=torch.bfloat16)
    for progs in (1, 3, 5):
        y, ro2 = norm_gemv(x, r, nw, 1e-5, w, ws, tile=(16, 64, 4), programs=progs)
        assert torch.equal(y, want), (n, k, res, progs, float((y.float() - want.float()).abs().max()))
        assert (ro2 is None) == (r is None) and (r is None or torch.equal(ro2, ro)), (n, k, "residual")
        done += 1
for bad in (dict(k=96), dict(k=512)):  # not a power of two / five blocks of 64
    x, r, nw, w, ws = case(16, bad["k"], True, "cpu", 9)
    try:
        norm_gemv(x, r, nw, 1e-5, w, ws, tile=(16, 64, 4))
        raise AssertionError(f"accepted {bad}")
    except ValueError as e:
        assert "norm_gemv" in str(e)
print("checked", done)
print("ok")
"""

ON_CUDA = CHECK + r"""
from octavo.plugins.quant.fp8_gemv import fp8_gemv_reference

TILE = (4, 1024, 4, 3)
for (n, k), seed in (((6144, 4096), 0), ((28672, 4096), 1)):
    x, r, nw, w, ws = case(n, k, True, "cuda", seed)
    out, ro, q, s = rms_norm_quant(x, nw, 1e-5, r)
    want = fp8_gemv(q, w, ws, x_scale=s, out_dtype=torch.bfloat16, config=TILE, pdl=True, pdl_w=1)
    ref = fp8_gemv_reference(out, w, ws)  # float64 of the GEMV of the norm kernel's row
    for pdl in (False, True):
        y, ro2 = norm_gemv(x, r, nw, 1e-5, w, ws, pdl=pdl)
        assert torch.equal(ro2, ro), (n, "residual")
        err = float((y.double().cpu() - ref.cpu()).abs().max() / ref.abs().max())
        assert err < 2e-2, (n, pdl, err)
        print("ok", n, k, "pdl" if pdl else "plain", "differ", int((y != want).sum()), "of", n, f"{err:.2e}",
              flush=True)
    xin, rin = x.clone(), r.clone()  # a graph replayed on new input gives eager's bits
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg, rog = norm_gemv(xin, rin, nw, 1e-5, w, ws, pdl=True)
    x2, r2, *_ = case(n, k, True, "cuda", seed + 10)
    xin.copy_(x2)
    rin.copy_(r2)
    g.replay()
    y2, ro2 = norm_gemv(x2, r2, nw, 1e-5, w, ws, pdl=True)
    torch.cuda.synchronize()
    assert torch.equal(yg, y2) and torch.equal(rog, ro2), (n, "graph")
    print("ok graph", n, flush=True)
print("PASS")
"""


def test_norm_gemv_interpreted_bit_equal_to_norm_then_gemv():
    from tests.utils import run_triton_interpreted

    out = run_triton_interpreted(INTERPRETED)
    assert "checked 12" in out.stdout


@pytest.mark.gpu
@needs_cuda
def test_norm_gemv_on_cuda():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", ON_CUDA], capture_output=True, text=True, timeout=600, cwd=root)
    print(r.stdout[-3000:])
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_sm90_ptx_norm_weight_and_first_block_before_the_wait():
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_norm_gemv import _norm_gemv_kernel

    sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "nw_ptr": "*bf16", "ro_ptr": "*bf16", "w_ptr": "*fp8e4nv",
           "ws_ptr": "*fp32", "y_ptr": "*bf16", "N": "i32", "K": "i32", "stride_wn": "i32", "eps": "fp32"}
    consts = dict(HAS_RES=True, SOFT_FP8=False, KP=4096, NB=4, BLOCK_N=4, BLOCK_K=1024, ACC_SPLIT=16, USE_PDL=True)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(10)}
    src = triton.compiler.ASTSource(fn=_norm_gemv_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    # norm weight 8 KB + the first 4x1024 weight block: 128 threads x (64 + 32) bytes, 16-byte loads
    assert ptx[:wait].count("ld.global.v4") == 6, ptx[:wait].count("ld.global.v4")
    assert "launch_dependents" in ptx[wait:] and "st.global" not in ptx[:wait]


def test_refuses_what_it_cannot_run():
    from octavo.plugins.quant.fp8_norm_gemv import norm_gemv

    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    w = torch.zeros(64, 256).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="norm_gemv"):
        norm_gemv(x, None, torch.ones(256, dtype=torch.bfloat16), 1e-5, w, torch.ones(64), tile=(16, 64, 4))
    with pytest.raises(ValueError, match="norm_gemv"):
        norm_gemv(x[:1], None, torch.ones(256, dtype=torch.bfloat16), 1e-5, w.to(torch.bfloat16), torch.ones(64),
                  tile=(16, 64, 4))
