"""fp8 linear layers at 2-64 rows on the tensor-core GEMV (plugins/quant/fp8_smallm.py): the tile table, the routing
by row count inside the fp8 method, and the product against the float64 reference and ``_scaled_mm``.

CPU: the table's parsing and refusals; the method on CPU tensors picks no tile; with tiles set by hand the method
routes 2..max_rows through the kernel (Triton interpreter, in a child process) and gives what ``_scaled_mm`` gives,
more rows keep ``_scaled_mm``. GPU (marked): the load-time check on the 8B shapes with every tile of the table and
the routed product against ``_scaled_mm`` at 16 / 40 / 64 rows.
"""

from __future__ import annotations

import pytest

from tests.utils import run_triton_interpreted

pytest.importorskip("triton")

INTERPRETED = r"""
import torch
from octavo.plugins.quant import fp8_smallm
from octavo.plugins.quant.fp8_gemv import fp8_gemv_reference
from octavo.plugins.quant.fp8_triton import quantize_per_token_torch
from tests.quant.fp8_inputs import cpu_fp8_linear, fp32_tolerance

gen = torch.Generator().manual_seed(0)
method, layer = cpu_fp8_linear(gen)
assert method.small_m == []  # CPU tensors: _scaled_mm only
method.small_m = [(16, False, (16, 512, 4, 3, 16)), (64, False, (16, 512, 4, 3, 64))]
x = torch.randn(70, 96, generator=gen).bfloat16()
for rows in (2, 16, 40, 64):
    xq, xs = quantize_per_token_torch(x[:rows])
    ref = fp8_gemv_reference(x[:rows], layer.weight, layer.weight_scale.reshape(-1), None)
    y = fp8_smallm.apply(layer, method.small_m, x[:rows], (xq, xs), None)
    assert y is not None and y.shape == (rows, 48), rows
    assert torch.allclose(y.double(), ref, rtol=1.6e-2, atol=1.6e-2 * float(ref.abs().max())), rows
    mm = method._scaled_mm(layer, x[:rows], None, None, True)  # the method's reference path
    got = method.apply(layer, x[:rows])
    assert torch.allclose(got.float(), mm.float(), rtol=1.6e-2, atol=1.6e-2 * float(mm.abs().max())), rows
assert fp8_smallm.apply(layer, method.small_m, x[:65], None, None) is None  # no tile takes 65 rows
assert torch.equal(method.apply(layer, x[:65]), method._scaled_mm(layer, x[:65], None, None))
print("ok")
"""


def test_fp8_smallm_interpreted_matches_float64():
    run_triton_interpreted(INTERPRETED, CUDA_VISIBLE_DEVICES="")  # no device: the interpreter's CPU tensors


def test_tile_table(tmp_path):
    from octavo.plugins.quant import fp8_smallm

    path = tmp_path / "smallm.json"
    path.write_text('{"Card X": {"64x128": [[64, "f16", 32, 256, 4, 3, 64], [16, "fp8", 16, 512, 4, 3, 16]]}}')
    assert fp8_smallm.table_for(64, 128, "Card X", str(path)) == [(16, True, (16, 512, 4, 3, 16)),
                                                                   (64, False, (32, 256, 4, 3, 64))]
    assert fp8_smallm.table_for(64, 128, "Card Y", str(path)) == []
    assert fp8_smallm.table_for(32, 128, "Card X", str(tmp_path / "none.json")) == []
    for bad in ('[[65, "f16", 32, 256, 4, 3, 64]]', '[[8, "int4", 32, 256, 4, 3, 16]]',
                '[[8, "f16", 32, 256, 4, 3, 48]]', '[[1, "f16", 32, 256, 4, 3, 16]]', '[[8, "f16", 32, 256]]'):
        path.write_text('{"Card X": {"64x128": ' + bad + '}}')
        with pytest.raises(ValueError, match="64x128"):
            fp8_smallm.table_for(64, 128, "Card X", str(path))


def test_switch_off_keeps_scaled_mm(monkeypatch):
    import torch

    from octavo.plugins.quant import fp8_smallm

    monkeypatch.setenv("OCTAVO_FP8_SMALL_M", "0")
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
    assert fp8_smallm.choose(layer, None) == []


@pytest.mark.gpu
def test_fp8_smallm_on_cuda_matches_scaled_mm():
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an fp8 GPU")
    from octavo.plugins.quant import fp8_smallm
    from octavo.plugins.quant.fp8 import _FP8Method
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        tiles = [(r, dot, cfg) for r, dot, cfg in fp8_smallm.table_for(n, k, torch.cuda.get_device_name())]
        if not tiles:  # exercise the kernel on this card anyway: the widest tile
            tiles = [(64, False, (32, 256, 4, 3, 64))]
        method = _FP8Method(prequantized=False)
        layer = torch.nn.Module().cuda()
        method.create_weights(layer, k, [n], torch.bfloat16)
        layer.bias = None
        layer.cuda()
        for name, value in method.convert({"weight": torch.randn(n, k, device="cuda", generator=gen)}, "t").items():
            getattr(layer, name).data = value
        method.process_weights_after_loading(layer)
        for rows in (2, 16, 40, 64):
            x = torch.randn(rows, k, device="cuda", generator=gen, dtype=torch.bfloat16)
            pre = quantize_per_token(x)
            want = method._scaled_mm(layer, x, None, pre, True).float()
            got = fp8_smallm.apply(layer, tiles, x, pre, None)
            if got is None:
                continue
            err = float((got.float() - want).abs().max() / want.abs().max())
            assert err < 2e-2, (n, k, rows, err)
