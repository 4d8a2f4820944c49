"""The fused W8A8 CPU kernel (decode rows) is bit-identical to the torch path it replaces: per-token (or static)
int8 quantization of the activations, ``torch._int_mm``, and the fp32 rescale, for 1-16 rows, input sizes that
are not multiples of the 64-byte VNNI step, and both activation modes."""

from __future__ import annotations

import pytest
import torch

from octavo.plugins.quant import int8_cpu_kernel
from octavo.plugins.quant.int8_w8a8 import int8_gemm, quantize_activations

pytestmark = pytest.mark.skipif(int8_cpu_kernel.library() is None,
                                reason=f"no fused W8A8 CPU kernel: {int8_cpu_kernel.unavailable_reason()}")


@pytest.mark.parametrize("m,k,n", [(1, 576, 960), (3, 100, 37), (16, 1536, 64), (7, 64, 8), (2, 4160, 33)])
@pytest.mark.parametrize("static_scale", [0.0, 0.02])
def test_fused_equals_torch_path(m, k, n, static_scale):
    gen = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, m)[:, None]
    wq = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int32).to(torch.int8)
    w_scale = torch.rand(1, n, generator=gen) * 0.01
    if static_scale:
        xq, sx = torch.round(x / static_scale).clamp(-128, 127).to(torch.int8), torch.tensor(static_scale)
    else:
        xq, sx, _ = quantize_activations(x, per_token=True, symmetric=True)
    want = int8_gemm(xq, wq).float() * (sx * w_scale)
    got = int8_cpu_kernel.w8a8_linear(x, wq, w_scale, int8_cpu_kernel.weight_sums_128(wq), static_scale)
    assert torch.equal(got, want)


def test_too_many_rows_is_refused():
    wq = torch.zeros(4, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="16 rows"):
        int8_cpu_kernel.w8a8_linear(torch.zeros(17, 64), wq, torch.ones(1, 4), int8_cpu_kernel.weight_sums_128(wq),
                                    0.0)


def test_traces_as_one_graph_under_torch_compile():
    """Inside the compiled CPU decode step the kernel is the custom op ``octavo::w8a8_linear`` (no graph break)."""
    wq = torch.randint(-128, 128, (48, 96), dtype=torch.int8)
    w_scale, sums = torch.rand(1, 48), int8_cpu_kernel.weight_sums_128(wq)

    def f(x):
        return int8_cpu_kernel.w8a8_linear(x, wq, w_scale, sums, 0.0) * 2

    x = torch.randn(3, 96)
    assert torch.equal(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))


def test_without_the_kernels_layers_use_the_torch_paths(monkeypatch, caplog):
    """OCTAVO_CPU_QUANT_KERNEL=0: W8A8 runs quantize + torch._int_mm (same numbers); 8-bit group weights run
    dequantized with a warning that names why."""
    from octavo.nn import ReplicatedLinear
    from octavo.plugins.quant import cpu_kernel, int8_group
    from octavo.plugins.quant.int8_w8a8 import Int8W8A8Method

    gen = torch.Generator().manual_seed(0)
    wq = torch.randint(-128, 128, (16, 64), generator=gen, dtype=torch.int32).to(torch.int8)
    scale = torch.rand(16, generator=gen) * 0.01
    x = torch.randn(2, 64, generator=gen)

    def w8a8_layer():
        layer = ReplicatedLinear(64, 16, quant_method=Int8W8A8Method())
        layer.qweight.data.copy_(wq)
        layer.weight_scale.data.copy_(scale)
        layer.process_weights_after_loading()
        return layer

    fused = w8a8_layer()
    assert fused.quant_method.fused_static == 0.0
    want_w8a8 = fused(x)
    monkeypatch.setattr(int8_cpu_kernel, "_state", {})
    monkeypatch.setattr(cpu_kernel, "_state", {})
    monkeypatch.setattr(int8_group, "_warned", set())
    monkeypatch.setenv("OCTAVO_CPU_QUANT_KERNEL", "0")
    plain = w8a8_layer()
    assert plain.quant_method.fused_static is None
    assert torch.equal(plain(x), want_w8a8)
    layer = ReplicatedLinear(64, 16, quant_method=int8_group.Int8GroupMethod(32))
    layer.qweight.data.copy_(wq)
    layer.scales.data.copy_(torch.rand(16, 2, generator=gen) * 0.01)
    layer.zeros.data.copy_(torch.randn(16, 2, generator=gen) * 0.01)
    want = x.double() @ int8_group.dequantize_int8_group(wq, layer.scales.data, layer.zeros.data).double().T
    with caplog.at_level("WARNING"):
        layer.process_weights_after_loading()
    assert hasattr(layer, "dense_weight") and "OCTAVO_CPU_QUANT_KERNEL=0" in caplog.text
    assert (layer(x).double() - want).abs().max() < 1e-5 * want.abs().max()
