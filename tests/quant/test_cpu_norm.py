"""The per-op path's C RMSNorm (plugins/platforms/cpu_norm.py), whose row arithmetic the fused batch-1 stack
shares (its bitwise agreement with the stack: tests/quant/test_cpu_fused_decode*.py).

Checked here: equal to ``RMSNorm``'s torch forward to rounding (float32: within a few ulps of the float64
reference like torch's; bfloat16: one bf16 rounding step at most), the residual sum returned with the same
bits as torch's add, every row the same bits alone and inside a batch at 1 and 2 threads (batch invariance),
inputs it does not cover (float16, a weight of another dtype) fall back to the module's forward, and the
switch ``OCTAVO_CPU_C_NORM=0``.
"""

from __future__ import annotations

import pytest
import torch

from octavo.nn.layernorm import RMSNorm
from octavo.plugins.platforms import cpu_norm

pytestmark = pytest.mark.skipif(cpu_norm.library() is None, reason="no C compiler for the CPU norm")


def _norm(dtype: torch.dtype, n: int = 576) -> RMSNorm:
    g = torch.Generator().manual_seed(1)
    m = RMSNorm(n, 1e-5)
    m.weight.data = (torch.randn(n, generator=g) * 0.5 + 1).to(dtype)
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_to_rounding_and_residual_bitwise(dtype):
    m = _norm(dtype)
    g = torch.Generator().manual_seed(2)
    x, r = ((torch.randn(37, 576, generator=g) * s).to(dtype) for s in (3.0, 20.0))
    want, want_res = m(x, r)
    assert cpu_norm.installed(m) is False
    got, got_res = cpu_norm.rms_norm(x, m.weight, m.eps, r)
    assert torch.equal(got_res, want_res)
    ref = (want_res.double() * torch.rsqrt(want_res.double().pow(2).mean(-1, keepdim=True) + m.eps)
           * m.weight.double())
    err = (got.double() - ref).abs().max() / ref.abs().max()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2), err
    assert (got.float() - want.float()).abs().max() / want.float().abs().max() < (1e-6 if dtype == torch.float32
                                                                                   else 1e-2)
    assert torch.equal(cpu_norm.rms_norm(x, m.weight, m.eps), cpu_norm.rms_norm(x + 0, m.weight, m.eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_row_alone_equals_it_in_a_batch_at_1_and_2_threads(dtype):
    m = _norm(dtype)
    x = (torch.randn(64, 576, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    old = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(cpu_norm.rms_norm(x, m.weight, m.eps))
        alone = torch.cat([cpu_norm.rms_norm(x[i:i + 1], m.weight, m.eps) for i in range(64)])
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], alone)


def test_install_fallbacks_and_switch(monkeypatch):
    model = torch.nn.Sequential(_norm(torch.float32), _norm(torch.float32))
    assert cpu_norm.install_norm(model, torch.float32) == 2 and all(cpu_norm.installed(m) for m in model)
    x16 = torch.randn(3, 576).half()
    m = model[0]
    assert cpu_norm.rms_norm(x16, m.weight, m.eps) is None
    assert torch.equal(m(x16), type(m).forward(m, x16))  # float16 input: the module's own forward
    monkeypatch.setenv("OCTAVO_CPU_C_NORM", "0")
    assert cpu_norm.install_norm(torch.nn.Sequential(_norm(torch.float32)), torch.float32) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_groups_keep_the_row_bits_with_residual_and_special_values(dtype):
    """Groups of 8 rows run the AVX-512 path (sum of squares of 8 rows in 8 lanes, vector rounding to bf16); a
    row alone runs ``norm_row``: both must give the same bits, NaN / inf / subnormal / rounding ties included."""
    m = _norm(dtype)
    g = torch.Generator().manual_seed(4)
    x, r = ((torch.randn(69, 576, generator=g) * s) for s in (3.0, 20.0))
    x[3, 7], x[9, 0], x[17, 100], r[18, 5] = float("nan"), float("inf"), 1e-40, -float("inf")
    x[20, :16] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3e-39] * 4)  # bf16 ties / subnormal widening
    x, r = x.to(dtype), r.to(dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    got, got_res = cpu_norm.rms_norm(x, m.weight, m.eps, r)
    alone = [cpu_norm.rms_norm(x[i:i + 1], m.weight, m.eps, r[i:i + 1]) for i in range(69)]
    assert torch.equal(got.view(bits), torch.cat([a[0] for a in alone]).view(bits))
    assert torch.equal(got_res.view(bits), torch.cat([a[1] for a in alone]).view(bits))
    plain = cpu_norm.rms_norm(x, m.weight, m.eps)
    assert torch.equal(plain.view(bits), torch.cat([cpu_norm.rms_norm(x[i:i + 1], m.weight, m.eps)
                                                    for i in range(69)]).view(bits))
