"""The CPU rotary kernel (plugins/platforms/cpu_rope.py) gives ``RotaryEmbedding``'s bits: bf16 and fp32, strided
q/k rows of a fused QKV output, 1 and 2 threads, tables with scaling; bad positions raise; the switch turns it off;
shapes it does not cover keep the module's forward. (Engine level: tests/unit/test_cpu_packed_linear.py.)"""

from __future__ import annotations

import pytest
import torch

from octavo.nn.rotary import get_rope
from octavo.plugins.platforms import cpu_rope

pytestmark = pytest.mark.skipif(cpu_rope.library() is None, reason="no C compiler for the rotary kernel")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d,scaling", [(64, None), (128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 1024})])
def test_same_bits_as_the_module(threads, dtype, d, scaling):
    m = get_rope(d, 4096, 500000.0, scaling)
    g = torch.Generator().manual_seed(d)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in (1, 7, 300):
            qkv = (torch.randn(n, 14 * d, generator=g) * 4).to(dtype)
            q, k = qkv[:, : 8 * d], qkv[:, 8 * d: 10 * d]
            pos = torch.randint(0, 4096, (n,), generator=g)
            want = m.forward(pos, q, k)
            got = cpu_rope.rope_forward(m, pos, q, k)
            assert all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(got, want)), n
    finally:
        torch.set_num_threads(before)


def test_positions_out_of_range_raise_and_other_shapes_keep_torch(monkeypatch):
    m = get_rope(64, 128, 10000.0, None)
    q, k = torch.randn(3, 128).bfloat16(), torch.randn(3, 64).bfloat16()
    with pytest.raises(IndexError, match="position"):
        cpu_rope.rope_forward(m, torch.tensor([0, 5, 128]), q, k)
    half = torch.randn(3, 128).half()  # fp16: the module's own forward
    assert all(torch.equal(a, b) for a, b in zip(cpu_rope.rope_forward(m, torch.tensor([1, 2, 3]), half, half[:, :64]),
                                                 m.forward(torch.tensor([1, 2, 3]), half, half[:, :64])))
    model = torch.nn.Sequential(m)
    monkeypatch.setenv(cpu_rope.SWITCH, "0")
    assert cpu_rope.install_rope(model, torch.bfloat16) == 0 and "forward" not in vars(m)
    monkeypatch.delenv(cpu_rope.SWITCH)
    assert cpu_rope.install_rope(model, torch.bfloat16) == 1 and vars(m)["forward"].__func__ is cpu_rope.rope_forward
    partial = get_rope(64, 128, 10000.0, None, rotary_dim=32)
    assert cpu_rope.install_rope(torch.nn.Sequential(partial), torch.bfloat16) == 0
