"""The int8-activation CPU kernels (plugins/quant/cpu_int8act.py) against numpy / float64 references of the same math.

Every build target runs on this machine: ``native`` (AVX512-VNNI here; whatever ``-march=native`` gives on CI),
``avx2`` (x86-64-v3: AVX2 without VNNI, the ``vpmaddubsw`` path) and ``generic`` (portable C). Checked:
the activation quantization bit for bit against numpy (fp32 division, round half to even), the integer dot
bit for bit (unit scales, so the fp32 sums of int32 block sums are exact), and the whole product against
float64 on the dequantized weight and activation (bound: fp32 rounding), for 1..33 rows and block counts
that exercise the chunks of 4, 2 and 1 blocks; bf16 input; the engine routing and its switch. Batch invariance
(a row's output bit for bit the same alone or among others) is tests/quant/test_cpu_int8act_batch_invariance.py.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

from octavo.plugins.quant import cpu_int8act, cpu_int8act_ops, cpu_kernel
from tests.quant.cpu_int8act_inputs import ISAS, UNAVAILABLE, case

pytestmark = pytest.mark.skipif(UNAVAILABLE, reason="no C compiler for the CPU kernels")
KS = [32, 64, 96, 224, 576, 1536]  # 1, 2, 3, 7, 18, 48 blocks: every chunk combination


def _ref_quant(x: torch.Tensor):
    """numpy: d = amax / 127 per block (fp32), xq = rint(x / d) (fp32 division, half to even), 0 where d = 0."""
    xg = x.float().numpy().reshape(x.shape[0], -1, 32)
    d = (np.abs(xg).max(-1) / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    xq = np.where(d[..., None] > 0, np.rint(xg / safe), 0).clip(-127, 127).astype(np.int8)
    return xq.reshape(x.shape), d


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", KS)
def test_activation_quantization_bit_exact(isa, k):
    x = case(5, k, 1, k)[0]
    xq_ref, d_ref = _ref_quant(x)
    xq, d, ds = cpu_int8act.quantize_activation(x, nibble=False, isa=isa)
    assert np.array_equal(xq.numpy(), xq_ref) and np.array_equal(d.numpy(), d_ref)
    sums = xq_ref.reshape(5, -1, 32).astype(np.int64).sum(-1).astype(np.float32)
    assert np.array_equal(ds.numpy(), d_ref * sums)
    xq4, d4, _ = cpu_int8act.quantize_activation(x, nibble=True, isa=isa)
    assert torch.equal(xq4, xq[:, cpu_int8act.nibble_order(k)]) and torch.equal(d4, d)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", [1, 3, 16, 21])
def test_integer_dot_bit_exact(isa, k, m):
    """Unit scales and d = 1: the output is the sum of the exact int32 block dots (exact in fp32 here)."""
    _, q4, q8, _, _ = case(m, k, 37, m * k)
    gen = torch.Generator().manual_seed(k)
    xq = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
    ones, zeros = torch.ones(37, k // 32), torch.zeros(37, k // 32)
    d, ds = torch.ones(m, k // 32), torch.zeros(m, k // 32)
    got4 = cpu_int8act.int4_from_quantized(xq[:, cpu_int8act.nibble_order(k)].contiguous(), d, ds,
                                           cpu_kernel.pack_int4(q4), ones, zeros, isa=isa)
    assert torch.equal(got4.to(torch.int64), xq.to(torch.int64) @ q4.to(torch.int64).T)
    got8 = cpu_int8act.int8_from_quantized(xq, d, q8, ones, isa=isa)
    assert torch.equal(got8.to(torch.int64), xq.to(torch.int64) @ q8.to(torch.int64).T)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err < 2e-6, err


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", [1, 2, 5, 16, 33])
def test_product_matches_float64_of_the_same_math(isa, k, m):
    x, q4, q8, s, z = case(m, k, 45, 7 * m + k)
    xq, d = _ref_quant(x)
    xd = torch.from_numpy(xq).double() * torch.from_numpy(d).double().repeat_interleave(32, 1)
    w4 = q4.double() * s.double().repeat_interleave(32, 1) + z.double().repeat_interleave(32, 1)
    _close(cpu_int8act.int4_linear(x, cpu_kernel.pack_int4(q4), s, z, isa=isa), xd @ w4.T)
    w8 = q8.double() * s.double().repeat_interleave(32, 1)
    _close(cpu_int8act.int8_linear(x, q8, s, isa=isa), xd @ w8.T)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_input_equals_its_fp32_value(isa):
    x, q4, q8, s, z = case(3, 576, 20, 1)
    xb = x.to(torch.bfloat16)
    w4 = cpu_kernel.pack_int4(q4)
    assert torch.equal(cpu_int8act.int4_linear(xb, w4, s, z, isa=isa), cpu_int8act.int4_linear(xb.float(), w4, s, z, isa=isa))
    assert torch.equal(cpu_int8act.int8_linear(xb, q8, s, isa=isa), cpu_int8act.int8_linear(xb.float(), q8, s, isa=isa))


def test_inputs_not_in_blocks_of_32_are_refused():
    x, q4, _, s, z = case(3, 64, 4, 0)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_int8act.int4_linear(x[:, :48].contiguous(), torch.zeros(4, 24, dtype=torch.uint8), s[:, :1], z[:, :1])


def test_paths_compiled_in():
    assert cpu_int8act.kernel_path("generic") == "generic"
    if "avx2" in ISAS:
        assert cpu_int8act.kernel_path("avx2") == "avx2"  # x86-64-v3 has no VNNI: the vpmaddubsw fallback
    flags = set(open("/proc/cpuinfo").read().split()) if platform.system() == "Linux" else set()
    if {"avx512_vnni", "avx512bw", "avx512vl"} <= flags:
        assert cpu_int8act.kernel_path("native") == "avx512vnni"


def test_routing_and_switch(monkeypatch):
    """act8 callers get the integer kernel for every row count when OCTAVO_CPU_INT8_ACT is unset (the default) or 1;
    0 gives the exact fp32 kernels; a value other than 0/1 is refused."""
    x, q4, _, s, z = case(2, 96, 8, 3)
    w4 = cpu_kernel.pack_int4(q4)
    exact = cpu_kernel.int4_linear(x, w4, s, z)
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.delenv("OCTAVO_CPU_INT8_ACT", raising=False)
    assert torch.equal(cpu_kernel.int4_linear(x, w4, s, z, act8=True), cpu_int8act.int4_linear(x, w4, s, z))  # on
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "1")
    assert torch.equal(cpu_kernel.int4_linear(x, w4, s, z, act8=True), cpu_int8act.int4_linear(x, w4, s, z))
    assert not torch.equal(cpu_kernel.int4_linear(x, w4, s, z, act8=True), exact)
    x17 = torch.cat([x] * 9)[:17]  # past the old 16-row limit: the same kernel, the same rows
    assert torch.equal(cpu_kernel.int4_linear(x17, w4, s, z, act8=True)[:2], cpu_int8act.int4_linear(x, w4, s, z))
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "0")
    assert torch.equal(cpu_kernel.int4_linear(x, w4, s, z, act8=True), exact)
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "yes")
    with pytest.raises(ValueError, match="OCTAVO_CPU_INT8_ACT"):
        cpu_int8act_ops.enabled()


def test_isa_setting_is_validated(monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_KERNEL_ISA", "avx9000")
    with pytest.raises(ValueError, match="OCTAVO_CPU_KERNEL_ISA"):
        cpu_int8act.default_isa()


def test_compiled_graph_calls_the_op(monkeypatch):
    """Under torch.compile the act8 linear is one op call inside a single graph (no graph break)."""
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "1")
    x, q4, q8, s, z = case(1, 576, 24, 5)
    w4 = cpu_kernel.pack_int4(q4)

    def f(x):
        return cpu_kernel.int4_linear(x, w4, s, z, act8=True) + cpu_kernel.int8_linear(x, q8, s, act8=True)

    want = f(x)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(x)
    assert torch.equal(got, want)
