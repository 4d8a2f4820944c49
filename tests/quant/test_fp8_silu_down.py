"""SiLU-and-mul inside down_proj's one-row fp8 GEMV (plugins/quant/fp8_silu_down.py, fp8_gemv's ``silu_in`` /
``SILU_IN``): the GEMV fed gate | up gives the bits of the platform's SiLU-and-mul kernel followed by the GEMV, on the
interpreter's masked path and its unmasked (``EVEN``) kernel with the absmax variants, the blocks before / after the
wait and the two- / four-block loops; the MLP wrapper takes one-row calls only, and takes them through down_proj.
CPU: TRITON_INTERPRET=1 in a subprocess; GPU (``gpu``): the 8B down shape under PDL, eager and in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

INTERPRETED = r"""
import torch
import triton
from octavo.plugins.platforms.cuda_fusions import silu_and_mul
from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel, fp8_gemv

g = torch.Generator().manual_seed(0)


def weights(n, k):
    w = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    return w, torch.rand(n, generator=g) * 0.01 + 1e-3


for n, k in ((48, 256), (16, 2500)):  # the masked kernel (two absmax rounds of 2048 for 2500, the last one masked)
    w, ws = weights(n, k)
    gu = (torch.randn(1, 2 * k, generator=g) * 3).to(torch.bfloat16)
    gu[0, :4] = torch.tensor([0.0, -30.0, 30.0, 1e-3])
    want = fp8_gemv(silu_and_mul(gu), w, ws)
    assert torch.equal(fp8_gemv(gu, w, ws, silu_in=True), want), (n, k)
for bad in (dict(x=torch.zeros(2, 512, dtype=torch.bfloat16)),
            dict(x_scale=torch.ones(1, 1)), dict(quantize_input=False)):
    x = bad.pop("x", torch.zeros(1, 512, dtype=torch.bfloat16))
    try:
        fp8_gemv(x, w[:, :256], ws, silu_in=True, **bad)
    except ValueError as e:
        assert "silu_in" in str(e)
    else:
        raise AssertionError(bad)

# the unmasked kernel: 4 blocks of 128, the absmax in a loop or all loads at once, blocks before / after the wait,
# the pair / four-block loops: SILU_IN on gate | up gives the bits of the kernel on SiLU-and-mul's output
n, k, bn, bk = 32, 512, 16, 128
w, ws = weights(n, k)
gu = (torch.randn(1, 2 * k, generator=g) * 3).to(torch.bfloat16)
x = silu_and_mul(gu)


def run(xin, silu, **flags):
    y = torch.empty(1, n, dtype=torch.bfloat16)
    _fp8_gemv_kernel[(triton.cdiv(n, bn),)](xin, ws, w, ws, None, y, w, 0, 16, 1, n, k, xin.stride(0), w.stride(0),
                                            y.stride(0), QUANT_X=True, PRE_Q=False, HAS_BIAS=False, EVEN=True,
                                            SOFT_FP8=True, BLOCK_N=bn, BLOCK_K=bk, ACC_SPLIT=16, SILU_IN=silu, **flags)
    return y


for flags in ({}, {"AMAX_KP": 2048}, {"PDL_W": 1, "LOOP2": 2}, {"PDL_W": 1, "EARLY_W": 2, "AMAX_KP": 2048},
              {"LOOP2": 4, "AMAX_KP": 2048}):
    assert torch.equal(run(gu, True, **flags), run(x, False, **flags)), flags

# the MLP wrapper on a loader-built fp8 Llama: one row through down_proj's fused GEMV, two rows through the layer's own
from octavo.plugins.quant import fp8_gemv as fg
from octavo.plugins.quant import fp8_silu_down
from tests.quant.fp8_tiny_llama import tiny_fp8_llama

model = tiny_fp8_llama(num_layers=1, one_row_gemv=True)
mlp = model.model.layers[0].mlp
fp8_silu_down.ON = True
assert fp8_silu_down.install(model) == 1 and fp8_silu_down.install(model) == 1  # once
calls = []
plain = fg.fp8_gemv


def spy(*a, **kw):
    calls.append(kw.get("silu_in", False))
    return plain(*a, **kw)


fg.fp8_gemv = spy
with torch.inference_mode():
    x1 = torch.randn(1, 64, generator=g).to(torch.bfloat16)
    got = mlp(x1)
    assert calls == [False, True], calls  # gate_up, then down with SiLU-and-mul inside
    want = mlp.down_proj(silu_and_mul(mlp.gate_up_proj(x1)))
    assert torch.equal(got, want), float((got.float() - want.float()).abs().max())
    # paired with the next norm by fp8_fused's discovery (it pairs whether or not that tail is on): the fused GEMV
    # while the tail is off (s17i's engine paired 31 of 32 downs and fused only the last), the tail's path when on
    from octavo.plugins.quant import fp8_gemv_norm

    mlp.down_proj._octavo_norm_tail = "RMSNorm"
    calls.clear()
    assert torch.equal(mlp(x1), want) and calls[-1] is True, calls
    fp8_gemv_norm.STATE["on"] = True
    assert not fp8_silu_down._takes(mlp.down_proj, x1)
    fp8_gemv_norm.STATE["on"] = False
    del mlp.down_proj._octavo_norm_tail
    calls.clear()
    mlp(torch.randn(2, 64, generator=g).to(torch.bfloat16))
    assert True not in calls, calls
    fp8_silu_down.ON = False
    calls.clear()
    mlp(x1)
    assert calls == [False, False], calls
fg.fp8_gemv = plain
print("ok")
"""


def test_silu_down_interpreted_bit_identical():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(INTERPRETED, timeout=600)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_silu_down_on_cuda_bit_identical():
    """The 8B down shape: this card's table tile (or the H100's), PDL with one block before the wait, two blocks a
    trip, 0-2 blocks right after the wait; eager and replayed from a graph, bits equal to SiLU-and-mul + GEMV."""
    from octavo.plugins.platforms.cuda_fusions import silu_and_mul
    from octavo.plugins.quant import fp8_gemv_tiles
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv

    dev = torch.device("cuda")
    n, k = 4096, 14336
    torch.manual_seed(0)
    w, ws = quantize_fp8_rows(torch.randn(n, k, device=dev) * 0.05)
    gu = torch.randn(1, 2 * k, device=dev).to(torch.bfloat16) * 3
    tile = fp8_gemv_tiles.table_tile(dev, n, k, 16) or (16, 1024, 8, 3)
    for early in (0, 1, 2):
        kw = dict(config=tile, pdl=True, pdl_w=1, loop2=2, early_w=early)
        want = fp8_gemv(silu_and_mul(gu), w, ws, **kw)
        assert torch.equal(fp8_gemv(gu, w, ws, silu_in=True, **kw), want), (tile, early)
        y = torch.empty_like(want)
        fp8_gemv(gu, w, ws, silu_in=True, **kw)  # compiled outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y.copy_(fp8_gemv(gu, w, ws, silu_in=True, **kw))
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, want), (tile, early, "graph")
