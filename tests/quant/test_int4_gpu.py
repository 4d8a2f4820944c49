"""int4 group weights on CUDA: shapes torch's tinygemm packs (K a multiple of 128) run packed; others (SmolLM2's
K = 576) run on their dequantized weight instead of failing the load. GPU only."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("k, packed", [(512, True), (576, False)])
def test_int4_layer_on_cuda(k, packed):
    from octavo.nn import ReplicatedLinear
    from octavo.plugins.quant import kernels

    torch.manual_seed(0)
    layer = ReplicatedLinear(k, 64, quant_method=kernels.Int4GroupMethod(32))
    q, s, z = kernels.quantize_int4(torch.randn(64, k), 32)
    layer.qweight.data.copy_(q)
    layer.scales.data.copy_(s)
    layer.zeros.data.copy_(z)
    layer = layer.cuda()
    layer.process_weights_after_loading()
    assert hasattr(layer, "packed_weight") == packed and hasattr(layer, "dense_weight") == (not packed)
    x = torch.randn(3, k, device="cuda", dtype=torch.bfloat16)
    want = x.float() @ kernels.dequantize_int4(q, s, z).cuda().T
    got = layer(x).float()
    assert (got - want).abs().max() < 0.02 * want.abs().max()
