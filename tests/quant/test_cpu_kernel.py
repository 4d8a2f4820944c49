"""octavo's fp32 CPU kernels for int4 / int8 group-quantized weights against a float64 product.

The kernels exist for accuracy (fp32 activations, scales, accumulation and output, unlike torch's bf16 int4
kernel), so the bound is fp32 rounding: 1e-5 of the output's range. Shapes cover the decode path (one row,
the four-rows-at-a-time loop and its remainder), the few-rows path, the dequantize-then-GEMM path (> 16
rows), and group sizes above 32 (scales repeated per 32).
"""

from __future__ import annotations

import pytest
import torch

from octavo.plugins.quant import cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel.library() is None,
                                reason=f"no fp32 CPU kernel here: {cpu_kernel.unavailable_reason()}")


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err < 1e-5, err


@pytest.mark.parametrize("n", [7, 64, 130])
@pytest.mark.parametrize("m", [1, 3, 5, 17])
@pytest.mark.parametrize("group", [32, 128])
def test_int4_matches_float64(n, m, group):
    gen = torch.Generator().manual_seed(n * 100 + m)
    k = 256
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s, z = torch.rand(n, k // group, generator=gen), torch.randn(n, k // group, generator=gen)
    x = torch.randn(m, k, generator=gen)
    w = q.double() * s.double().repeat_interleave(group, 1) + z.double().repeat_interleave(group, 1)
    got = cpu_kernel.int4_linear(x, cpu_kernel.pack_int4(q), cpu_kernel.per_32(s, k), cpu_kernel.per_32(z, k))
    assert got.dtype == torch.float32 and got.shape == (m, n)
    _close(got, x.double() @ w.T)


@pytest.mark.parametrize("n", [5, 96])
@pytest.mark.parametrize("m", [1, 2, 20])
def test_int8_matches_float64(n, m):
    gen = torch.Generator().manual_seed(n + m)
    k = 192
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, k // 32, generator=gen)
    x = torch.randn(m, k, generator=gen).bfloat16()  # any float dtype in; fp32 out
    w = q.double() * s.double().repeat_interleave(32, 1)
    _close(cpu_kernel.int8_linear(x, q, s), x.double() @ w.T)


def test_pack_layout():
    """Per group of 32, byte j holds element j (low nibble) and element j + 16 (high nibble)."""
    q = torch.arange(64, dtype=torch.uint8).remainder(16).reshape(1, 64)
    packed = cpu_kernel.pack_int4(q)
    assert packed.shape == (1, 32)
    assert int(packed[0, 3]) == (3 | (3 << 4)) and int(packed[0, 16 + 1]) == (1 | (1 << 4))


@pytest.mark.parametrize("m", [2, 9])
def test_traces_as_one_graph_under_torch_compile(m):
    """The compiled CPU decode step (OCTAVO_CPU_COMPILE) must trace the kernels without a graph break: a few
    rows as tensor ops (``int*_linear_traced``, fp32 sums in another order), more rows as the custom ops."""
    q = torch.randint(0, 16, (64, 128), dtype=torch.uint8)
    s, z = torch.rand(64, 4), torch.randn(64, 4)
    w4 = cpu_kernel.pack_int4(q)
    q8, s8 = torch.randint(-127, 128, (64, 128), dtype=torch.int8), torch.rand(64, 4)

    def f(x):
        return cpu_kernel.int4_linear(x, w4, s, z) + cpu_kernel.int8_linear(x, q8, s8)

    x = torch.randn(m, 128)
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    got, want = compiled(x), f(x)
    if m > cpu_kernel.TRACED_MAX_ROWS:
        assert torch.equal(got, want)
    else:
        _close(got, want.double())


@pytest.mark.parametrize("m", [1, 3])
def test_traced_forms_match_float64(m):
    """The tensor-op forms used inside compiled graphs compute the kernels' product (fp32 rounding)."""
    gen = torch.Generator().manual_seed(m)
    n, k = 40, 576
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s, z = torch.rand(n, k // 32, generator=gen), torch.randn(n, k // 32, generator=gen)
    x = torch.randn(m, k, generator=gen)
    w = q.double() * s.double().repeat_interleave(32, 1) + z.double().repeat_interleave(32, 1)
    _close(cpu_kernel.int4_linear_traced(x, cpu_kernel.pack_int4(q), s, z), x.double() @ w.T)
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    _close(cpu_kernel.int8_linear_traced(x, q8, s), x.double() @ (q8.double() * s.double().repeat_interleave(32, 1)).T)


def test_without_the_kernel_falls_back_to_torch_with_a_warning(monkeypatch, caplog):
    """No compiler (here: OCTAVO_CPU_QUANT_KERNEL=0): torch's bf16 int4 kernel, and a warning that says so."""
    from octavo.nn import ReplicatedLinear
    from octavo.plugins.quant import kernels

    monkeypatch.setattr(cpu_kernel, "_state", {})
    monkeypatch.setattr(kernels, "_warned", [])
    monkeypatch.setenv("OCTAVO_CPU_QUANT_KERNEL", "0")
    assert cpu_kernel.library() is None and "OCTAVO_CPU_QUANT_KERNEL=0" in cpu_kernel.unavailable_reason()
    layer = ReplicatedLinear(64, 16, quant_method=kernels.Int4GroupMethod(32))
    q, s, z = kernels.quantize_int4(torch.randn(16, 64), 32)
    layer.qweight.data.copy_(q)
    layer.scales.data.copy_(s)
    layer.zeros.data.copy_(z)
    with caplog.at_level("WARNING"):
        layer.process_weights_after_loading()
    assert hasattr(layer, "packed_weight") and not hasattr(layer, "w4")
    assert "unavailable" in caplog.text and "less accurate" in caplog.text
    x = torch.randn(3, 64)
    want = x @ kernels.dequantize_int4(q, s, z).T
    assert (layer(x) - want).abs().max() < 0.05 * want.abs().max()
