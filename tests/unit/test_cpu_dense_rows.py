"""Many-row CPU int4/int8 products through the kept dense copy (plugins/quant/cpu_dense_rows.py): float32 is the
per-call path's exact result (for bfloat16 inputs too), and the memory budget holds."""

import pytest
import torch

from octavo.plugins.quant import cpu_dense_rows, cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel.library() is None, reason="no C compiler for octavo's CPU kernels")


def _int4(n=96, k=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    s = torch.rand(n, k // 32, generator=g) * 0.02 + 0.001
    z = torch.randn(n, k // 32, generator=g) * 0.01
    dense = (q.float() * s.repeat_interleave(32, 1) + z.repeat_interleave(32, 1))
    return cpu_kernel.pack_int4(q), s.contiguous(), z.contiguous(), dense


def test_int4_many_rows_fp32_is_exact_and_kept():
    w4, s, z, dense = _int4()
    x = torch.randn(40, 128)
    y = cpu_kernel._int4_linear(x, w4, s, z)
    per_call = cpu_kernel._dequant4(cpu_kernel.library(), w4, s, z)  # the C dequantization (FMA-rounded)
    assert torch.allclose(per_call, dense, rtol=0, atol=1e-6)
    assert torch.equal(y, torch.nn.functional.linear(x, per_call))  # the per-call path's values, one fp32 GEMM
    before = cpu_dense_rows.cached_bytes()
    assert before >= dense.nbytes
    assert torch.equal(cpu_kernel._int4_linear(x, w4, s, z), y) and cpu_dense_rows.cached_bytes() == before
    del w4  # the copy goes with its packed weight (on the next miss)
    w4b, s2, z2, _ = _int4(seed=1)
    cpu_kernel._int4_linear(x, w4b, s2, z2)
    assert cpu_dense_rows.cached_bytes() <= before


def test_int4_many_rows_bf16_inputs_use_the_exact_fp32_weight():
    """bf16 inputs still meet the float32 dequantized weight: a bf16 copy would round the weights only for steps of
    more than 16 rows, and a request's greedy tokens would depend on how many others shared its step."""
    w4, s, z, dense = _int4(seed=2)
    x = torch.randn(33, 128).bfloat16()
    y = cpu_kernel._int4_linear(x, w4, s, z)
    assert y.dtype == torch.float32
    per_call = cpu_kernel._dequant4(cpu_kernel.library(), w4, s, z)
    assert torch.equal(y, torch.nn.functional.linear(x.float(), per_call))
    ref = x.double() @ dense.double().t()
    assert (y.double() - ref).abs().max() < 0.02 * ref.abs().max()


def test_int8_many_rows_and_few_rows_unchanged():
    g = torch.Generator().manual_seed(3)
    w8 = torch.randint(-127, 128, (64, 96), dtype=torch.int8, generator=g)
    s = torch.rand(64, 3, generator=g) * 0.01
    dense = w8.float() * s.repeat_interleave(32, 1)
    x = torch.randn(20, 96)
    per_call = cpu_kernel._dequant8(cpu_kernel.library(), w8, s)
    assert torch.equal(per_call, dense)
    assert torch.equal(cpu_kernel._int8_linear(x, w8, s), torch.nn.functional.linear(x, per_call))
    xb = x.bfloat16()  # int8 keeps its exact fp32 copy for bf16 inputs too
    assert torch.equal(cpu_kernel._int8_linear(xb, w8, s), torch.nn.functional.linear(xb.float(), per_call))
    few = cpu_kernel._int8_linear(x[:4], w8, s)  # <= 16 rows: the fused kernel, as before
    assert torch.allclose(few, x[:4] @ dense.t(), atol=1e-4)


def test_budget_falls_back_to_per_call(monkeypatch):
    monkeypatch.setattr(cpu_dense_rows, "MAX_BYTES", 0)
    monkeypatch.setattr(cpu_dense_rows, "_cache", {})
    monkeypatch.setattr(cpu_dense_rows, "_used", [0])
    w4, s, z, dense = _int4(seed=4)
    x = torch.randn(40, 128)
    assert cpu_dense_rows.int4_rows(x, w4, s, z, lambda: dense) is None
    per_call = cpu_kernel._dequant4(cpu_kernel.library(), w4, s, z)
    assert torch.equal(cpu_kernel._int4_linear(x, w4, s, z), torch.nn.functional.linear(x, per_call))
    assert cpu_dense_rows.cached_bytes() == 0
