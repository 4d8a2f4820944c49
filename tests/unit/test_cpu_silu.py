"""The CPU SiLU-and-mul kernel (plugins/platforms/cpu_silu.py) gives ``SiluAndMul``'s bits: every bf16 value as the
gate, random float32 gates over a wide range, strided rows; widths torch finishes with libm stay in torch; the
switch turns it off. (Engine level, greedy tokens and logprobs: tests/unit/test_cpu_packed_linear.py.)"""

from __future__ import annotations

import pytest
import torch

from octavo.nn.activation import SiluAndMul
from octavo.plugins.platforms import cpu_silu

pytestmark = pytest.mark.skipif(cpu_silu.library() is None, reason="no C compiler for the SiLU kernel")


def _avx512() -> bool:
    try:
        return "avx512f" in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


@pytest.mark.skipif(not _avx512(), reason="the kernel is AVX-512 only (elsewhere: torch's form)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_same_bits_as_the_module(dtype):
    m = SiluAndMul()
    assert cpu_silu.same_bits(m, dtype, n_random=1_000_000)  # all 65,536 bf16 gates / 3 M float32 gates
    g = torch.Generator().manual_seed(1)
    for rows, width in ((1, 128), (7, 3072), (64, 3072)):
        base = (torch.randn(rows, width + 64, generator=g) * 5).to(dtype)
        x = base[:, :width]  # strided rows, as a view of a wider output
        assert torch.equal(cpu_silu.silu_forward(m, x), m.forward(x)), (rows, width)


def test_uncovered_shapes_and_switch(monkeypatch):
    m = SiluAndMul()
    odd = torch.randn(3, 200).bfloat16()  # 100 wide halves: torch's libm tail -> torch's form
    assert cpu_silu.silu_mul(odd) is None and torch.equal(cpu_silu.silu_forward(m, odd), m.forward(odd))
    three_d = torch.randn(2, 3, 256).bfloat16()
    assert torch.equal(cpu_silu.silu_forward(m, three_d), m.forward(three_d))
    model = torch.nn.Sequential(m)
    monkeypatch.setenv(cpu_silu.SWITCH, "0")
    assert cpu_silu.install_silu(model, torch.bfloat16) == 0 and "forward" not in vars(m)
