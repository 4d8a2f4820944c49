"""The one-row fp8 GEMV's measured tile table (plugins/quant/fp8_gemv_tiles.py): off the table's cards and with
``OCTAVO_FP8_GEMV_TABLE=0`` the autotuner decides; a bad value is refused by name; on a GPU the table's launch is the
explicit-config launch bit for bit, and the fused GEMVs take the same tile."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.quant.fp8_inputs import needs_cuda

pytest.importorskip("triton")


def test_table_off_the_gpu_and_switched_off(monkeypatch):
    from octavo.plugins.quant import fp8_gemv_tiles as t

    assert t.table_tile(torch.device("cpu"), 6144, 4096, 16) is None
    assert all(len(v) == 4 and v[0] * 2 <= 64 and 1024 % v[1] == 0 for v in t.TILES.values())
    monkeypatch.setenv("OCTAVO_FP8_GEMV_TABLE", "0")
    assert importlib.reload(t).TABLE_ON is False
    monkeypatch.setenv("OCTAVO_FP8_GEMV_TABLE", "yes")
    with pytest.raises(ValueError, match="OCTAVO_FP8_GEMV_TABLE"):
        importlib.reload(t)
    monkeypatch.delenv("OCTAVO_FP8_GEMV_TABLE")
    assert importlib.reload(t).TABLE_ON is True


def test_loop_table_per_card_and_shape(monkeypatch):
    from octavo.plugins.quant import fp8_gemv_tiles as t

    assert all(v in (2, 4) and key in t.TILES for key, v in t.LOOPS.items())  # only with the table's tiles
    card, n, k = next(iter(t.LOOPS))
    monkeypatch.setattr(t, "_card", lambda index: card)
    cuda = torch.device("cuda", 0)  # a device object only: _card is patched, nothing touches a GPU
    assert t.table_loop(cuda, n, k) == t.LOOPS[(card, n, k)]
    assert t.table_loop(cuda, 6144, 4096) == t.LOOPS.get((card, 6144, 4096), 0)
    assert t.table_loop(torch.device("cpu"), n, k) == 0
    monkeypatch.setattr(t, "TABLE_ON", False)
    assert t.table_loop(cuda, n, k) == 0
    monkeypatch.setattr(t, "_card", lambda index: "another card")
    monkeypatch.setattr(t, "TABLE_ON", True)
    assert t.table_loop(cuda, n, k) == 0


@pytest.mark.gpu
@needs_cuda
def test_table_launch_is_the_config_launch():
    from octavo.plugins.quant import fp8_gemv_tiles as t
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from octavo.plugins.quant.fp8_silu_gemv import gemv_tile

    dev = torch.device("cuda")
    shapes = [(n, k) for (card, n, k) in t.TILES if card == torch.cuda.get_device_name()]
    if not shapes:
        pytest.skip(f"no table entry for {torch.cuda.get_device_name()}")
    torch.manual_seed(0)
    for n, k in shapes:
        w, ws = quantize_fp8_rows(torch.randn(n, k, device="cuda") * 0.05)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        tile = t.table_tile(dev, n, k, 16)
        assert gemv_tile(n, k, False, 16, dev) == tile
        got = fp8_gemv(x, w, ws, acc_split=16)  # the table's tile and main loop (t.table_loop)
        assert torch.equal(got, fp8_gemv(x, w, ws, acc_split=16, config=tile)), (n, k, tile)
        assert torch.equal(got, fp8_gemv(x, w, ws, acc_split=16, config=tile, loop2=t.table_loop(dev, n, k)))
        assert torch.equal(got, fp8_gemv(x, w, ws, acc_split=16, config=tile[:3])), "stages change no bits"
        # the table's tile against the float64 product and the autotuner's tile (another fp32 summation order: the
        # two may differ, by a rounding step of the bf16 output at most), for in-kernel and the norm's quantization
        from octavo.plugins.quant import fp8_triton
        from octavo.plugins.quant.fp8_gemv import fp8_gemv_reference

        xq, xs = fp8_triton.quantize_per_token(x)
        want = fp8_gemv_reference(x, w, ws).float()
        for kw, xin in (({}, x), ({"x_scale": xs, "out_dtype": torch.bfloat16}, xq)):
            table = fp8_gemv(xin, w, ws, acc_split=16, **kw).float()
            assert float((table - want).abs().max() / want.abs().max()) < 1e-2, (n, k, tile, kw)
            try:
                t.TABLE_ON = False
                auto = fp8_gemv(xin, w, ws, acc_split=16, **kw).float()
            finally:
                t.TABLE_ON = True
            step = (table - auto).abs() - table.abs().maximum(auto.abs()) * 2.0 ** -7
            assert float(step.max()) <= 1e-6, (n, k, tile, kw, float(step.max()))
            print("table vs autotuner", n, k, tile, "pre" if kw else "quant",
                  int((table != auto).sum()), "of", table.numel(), "elements differ")
