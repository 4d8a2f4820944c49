"""Batch invariance of the int8-activation CPU kernels (the GGUF layers' default path).

A serving engine's output for one request must not depend on which other requests share its step. Session 4 ran
int8 activations for steps of <= 16 rows only and fp32 for bigger ones, and the server's concurrency tests caught
greedy tokens that changed with the load. Now every row count takes the same kernel, and a row's output must be
**bit for bit** the same alone and inside a batch of any size: checked here for 1..64 rows (every chunk of 1-4
rows and every position inside a chunk), for prefill-sized steps that cross the kernel's row tile, with 1 and 2
threads, for int4 and int8 weights (output counts that leave 1-3 rows after the groups of 4), fp32 and bf16 input,
and for every build target (native, AVX2, portable C).
"""

from __future__ import annotations

import pytest
import torch

from octavo.plugins.quant import cpu_int8act, cpu_int8act_ops, cpu_kernel
from tests.quant.cpu_int8act_inputs import ISAS, UNAVAILABLE, packed_weights, scaled_rows

pytestmark = pytest.mark.skipif(UNAVAILABLE, reason="no C compiler for the CPU kernels")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", [(576, 70), (96, 33)])
def test_row_alone_equals_row_in_any_batch(isa, dtype, k, n):
    """Every row of batches of 1..64 rows equals that row computed alone, bit for bit."""
    w4, q8, s, z = packed_weights(n, k, k + n)
    x = scaled_rows(64, k, 1, dtype)
    alone4 = torch.cat([cpu_int8act.int4_linear(x[i:i + 1], w4, s, z, isa=isa) for i in range(64)])
    alone8 = torch.cat([cpu_int8act.int8_linear(x[i:i + 1], q8, s, isa=isa) for i in range(64)])
    for m in range(1, 65):
        lo = (7 * m) % (65 - m)  # the batch starts at different rows, so a row sits at every position of a chunk
        assert torch.equal(cpu_int8act.int4_linear(x[lo:lo + m], w4, s, z, isa=isa), alone4[lo:lo + m]), m
        assert torch.equal(cpu_int8act.int8_linear(x[lo:lo + m], q8, s, isa=isa), alone8[lo:lo + m]), m


@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_sized_steps_and_threads(threads):
    """Steps bigger than the kernel's row tile (192 KiB of int8 activations: 128 rows at K = 1536) and either
    thread count give every row its single-row result."""
    k, n = 1536, 36
    w4, q8, s, z = packed_weights(n, k, 5)
    x = scaled_rows(300, k, 2, torch.bfloat16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        big4, big8 = cpu_int8act.int4_linear(x, w4, s, z), cpu_int8act.int8_linear(x, q8, s)
    finally:
        torch.set_num_threads(before)
    for i in (0, 1, 127, 128, 129, 255, 256, 299):
        assert torch.equal(big4[i:i + 1], cpu_int8act.int4_linear(x[i:i + 1], w4, s, z)), i
        assert torch.equal(big8[i:i + 1], cpu_int8act.int8_linear(x[i:i + 1], q8, s)), i


def test_engine_entry_points_route_every_row_count(monkeypatch):
    """The layers' entry point (``cpu_kernel.int4_linear(..., act8=True)``, the GGUF methods) gives a row the same
    bits at 1, 16, 17 and 64 rows: no row count switches to another kernel (session 4's fp32 GEMM past 16 rows)."""
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "1")
    assert cpu_int8act_ops.enabled()
    w4, q8, s, z = packed_weights(40, 576, 9)
    x = scaled_rows(64, 576, 3, torch.bfloat16)
    one4 = cpu_kernel.int4_linear(x[:1], w4, s, z, act8=True)
    one8 = cpu_kernel.int8_linear(x[:1], q8, s, act8=True)
    for m in (1, 16, 17, 64):
        assert torch.equal(cpu_kernel.int4_linear(x[:m], w4, s, z, act8=True)[:1], one4), m
        assert torch.equal(cpu_kernel.int8_linear(x[:m], q8, s, act8=True)[:1], one8), m
