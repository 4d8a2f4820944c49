"""The one-row fp8 GEMV's ``EARLY_W`` (plugins/quant/fp8_gemv.py, ``OCTAVO_FP8_GEMV_EARLY_W``): the weight blocks after
the one read before the PDL wait are asked for right after the wait, before the absmax's loads and reduction. Its
bits are checked in test_fp8_gemv_bits.py (interpreter: the same sums in the same order; GPU: the 8B shapes under
PDL); here, on the CPU, the sm_90 PTX order it exists for, and the host's refusals and caps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")


def _ptx(early: int, quant: bool = True) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel

    sig = {"x_ptr": "*bf16" if quant else "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32",
           "b_ptr": "*bf16", "y_ptr": "*bf16", "pf_ptr": "*fp8e4nv", "pf_total": "i32", "pf_piece": "i32", "M": "i32",
           "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32"}
    # down_proj's launch on the H100 table's tile: in-kernel quantization, two blocks a trip, one block before the wait
    consts = dict(QUANT_X=quant, PRE_Q=not quant, HAS_BIAS=False, EVEN=True, SOFT_FP8=False, BLOCK_N=16,
                  BLOCK_K=1024, PREFETCH=False, USE_PDL=True, SELF_PF=False, W_BITS=False, REG_PF=False, ACC_SPLIT=16,
                  X2D=False, PDL_W=1, AMAX_KP=16384 if quant else 0, LOOP2=2, EARLY_W=early)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5, 6, 10, 11, 12, 13, 14)}
    src = triton.compiler.ASTSource(fn=_fp8_gemv_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 8, "num_stages": 3}).asm["ptx"]


def _loads_before_first_barrier(ptx: str) -> int:
    wait = ptx.index("griddepcontrol.wait")
    return ptx[wait:ptx.index("bar.sync", wait)].count("ld.global")


def test_sm90_ptx_early_blocks_issued_before_the_absmax_reduction():
    """16x1024 on 8 warps: a block is 4 16-byte loads a thread; with ``EARLY_W`` = e, 4e more loads sit between the
    wait and the absmax's first barrier, and the first block's loads stay before the wait."""
    base = _ptx(0)
    for early in (1, 2):
        ptx = _ptx(early)
        assert _loads_before_first_barrier(ptx) - _loads_before_first_barrier(base) == 4 * early, early
        wait = ptx.index("griddepcontrol.wait")
        assert ptx[:wait].count("ld.global.v4") == base[:base.index("griddepcontrol.wait")].count("ld.global.v4")


def test_early_w_refused_by_name():
    import os
    import subprocess
    import sys

    from octavo.plugins.quant import fp8_gemv as g

    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    w = torch.zeros(16, 64).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="early_w"):
        g.fp8_gemv(x, w, torch.ones(16), early_w=3)
    assert g.EARLY_W == 0 and g.EARLY_W_PRE == 0  # opt-in until measured
    env = {**os.environ, "OCTAVO_FP8_GEMV_EARLY_W": "3"}  # a fresh process: no reload of the shared module here
    run = subprocess.run([sys.executable, "-c", "import octavo.plugins.quant.fp8_gemv"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0 and "OCTAVO_FP8_GEMV_EARLY_W" in run.stderr, run.stderr[-500:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_early_w_on_cuda_bit_identical():
    """o_proj / down of the 8B shape on the engine's launch (this card's table tile, or the H100's; PDL, one block
    before the wait, two blocks a trip): 1-2 blocks right after the wait give the bits of none, eager and replayed."""
    from octavo.plugins.quant import fp8_gemv_tiles
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv

    dev = torch.device("cuda")
    torch.manual_seed(0)
    for n, k in ((4096, 4096), (4096, 14336)):
        w, ws = quantize_fp8_rows(torch.randn(n, k, device=dev) * 0.05)
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        tile = fp8_gemv_tiles.table_tile(dev, n, k, 16) or (16, 1024, 8, 3)
        base = dict(config=tile, pdl=True, pdl_w=1, loop2=fp8_gemv_tiles.table_loop(dev, n, k) or 2)
        want = fp8_gemv(x, w, ws, early_w=0, **base)
        for early in (1, 2):
            assert torch.equal(fp8_gemv(x, w, ws, early_w=early, **base), want), (n, k, tile, early)
            y = torch.empty_like(want)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y.copy_(fp8_gemv(x, w, ws, early_w=early, **base))
            y.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, want), (n, k, tile, early, "graph")
