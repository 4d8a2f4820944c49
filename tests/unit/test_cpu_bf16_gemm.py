"""The AVX512-BF16 GEMM (plugins/platforms/cpu_bf16_gemm.py) gives oneDNN's bits, row by row and at any thread count.

Runs where the kernel is wanted (AVX512-BF16 without AMX; elsewhere oneDNN keeps every call and this skips):
SmolLM2's linear shapes, the LM head and a K = 4,096 shape at 1 .. 2,048 rows (6-row tiles and every tail),
strided and 3-D inputs, against ``F.linear`` and oneDNN's packed linear bit for bit; two rows alone == the same
rows in a batch; float32 output (an LM head's logits) == the bf16 output widened; 1 thread ==
2 threads; the packed-linear method routes through it; layouts it cannot read fall back to ``F.linear``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo.plugins.platforms import cpu_bf16_gemm as g
from octavo.plugins.platforms import cpu_packed_linear as cpl

pytestmark = pytest.mark.skipif(not (cpl.available() and g.wanted() and g.library() is not None),
                                reason="needs AVX512-BF16 without AMX and a C compiler")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("n,k", [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (128, 4096)])
def test_same_bits_as_onednn_and_f_linear(n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).bfloat16()
    wp, onednn = g.pack(w), torch.ops.mkldnn._reorder_linear_weight(w, 64)
    for rows in ((1, 6, 7, 64, 67) if n == 49152 else (1, 2, 5, 6, 7, 13, 64, 67, 300, 2048)):
        x = (torch.randn(rows, k, generator=gen) * 3).bfloat16()
        got = g.linear(x, wp)
        assert torch.equal(_bits(got), _bits(torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""))), rows
        assert torch.equal(_bits(got), _bits(F.linear(x, w))), rows
        wide = g.linear(x, wp, out_f32=True)  # an LM head's float32 logits: the same bf16 values, widened
        assert wide.dtype == torch.float32 and torch.equal(wide.view(torch.int32), got.float().view(torch.int32)), rows
        if rows > 2:  # two rows of the batch alone: their bits in the batch (one row alone: oneDNN's K block)
            assert torch.equal(_bits(g.linear(x[rows // 2:rows // 2 + 2], wp)), _bits(got[rows // 2:rows // 2 + 2]))


def test_threads_strided_three_d_and_fallback():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(960, 576, generator=gen).bfloat16()
    wp = g.pack(w)
    x = torch.randn(64, 576, generator=gen).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = g.linear(x, wp)
        torch.set_num_threads(2)
        assert torch.equal(_bits(g.linear(x, wp)), _bits(one))
    finally:
        torch.set_num_threads(threads)
    strided = torch.randn(64, 2 * 576, generator=gen).bfloat16()[:, 576:]  # a view, as q/k/v of a fused output
    assert torch.equal(_bits(g.linear(strided, wp)), _bits(F.linear(strided, w)))
    three_d = torch.randn(2, 5, 576, generator=gen).bfloat16()
    assert torch.equal(_bits(g.linear(three_d, wp)), _bits(F.linear(three_d, w)))
    odd = torch.randn(8, 577, generator=gen).bfloat16()[:, 1:]  # odd row stride: pairs not 4-byte aligned
    assert g.linear(odd, wp) is None
    assert g.pack(torch.randn(100, 576).bfloat16()) is None  # not a multiple of 64 outputs: oneDNN keeps it


def test_packed_method_uses_it_and_keeps_bits():
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(576, 1536).bfloat16(), requires_grad=False)
    method = cpl.PackedLinearMethod(layer.weight, 64)
    assert method._packed.gemm is not None and method._packed.packed is None
    x = torch.randn(64, 1536).bfloat16()
    assert torch.equal(_bits(method.apply(layer, x)), _bits(F.linear(x, layer.weight)))
    bias = torch.randn(576).bfloat16()
    assert torch.equal(_bits(method.apply(layer, x, bias)), _bits(F.linear(x, layer.weight, bias)))
    head = cpl.PackedLogitsMethod(layer.weight, 64)  # float32 out (compute_logits' .float() then copies nothing)
    logits = head.apply(layer, x)
    assert logits.dtype == torch.float32 and torch.equal(logits, F.linear(x, layer.weight).float())
