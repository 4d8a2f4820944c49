"""The L2 prefetch hints of the batch-1 MoE kernels (plugins/platforms/moe_prefetch.py) and the w13 launch's
loads one K-block ahead (PIPE) on a CUDA GPU (skips without one): neither may change a single bit. At the Qwen3-30B-A3B shapes, bf16: the two-launch expert path
with the w2 prefetch during w13 (evict-first w13 loads) and the next-weight prefetch during w2 (after and before
the PDL wait), and the one-launch attention with the o_proj prefetch (after and before the wait) and its unrolled merge, each against
the same launch without prefetch: outputs (and the KV cache the attention writes) bit-equal, eager and replayed
from a CUDA graph with new inputs."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.moe_attn_oracle import rope_tables

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                 reason="needs a Hopper (sm_90+) GPU: cp.async.bulk.prefetch.L2")]


@pytest.mark.parametrize("w13,w2", [({"PF_W2": True, "EVICT": "evict_first"}, {"PF_NEXT": 1}),
                                    ({"PF_W2": True}, {"PF_NEXT": 2}),
                                    ({"PF_W2": True, "PF_NEXT": True, "EVICT": "evict_first"}, {}),
                                    ({"PIPE": True}, {})],
                         ids=["after_wait", "before_wait", "w13_next", "pipe"])
def test_expert_prefetch_changes_no_bit(w13, w2):
    from octavo.plugins.platforms.moe_decode_kernels import decode_one, default_decode_config

    e, k, h, inter = 128, 8, 2048, 768
    gen = torch.Generator(device="cuda").manual_seed(3)
    w13_w = (torch.randn(e, 2 * inter, h, device="cuda", generator=gen) * h ** -0.5).bfloat16()
    w2_w = (torch.randn(e, h, inter, device="cuda", generator=gen) * inter ** -0.5).bfloat16()
    nxt = torch.randn(5120, h, device="cuda", generator=gen).bfloat16()
    x = torch.randn(1, h, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(1, e, device="cuda", generator=gen)
    base = default_decode_config(k, inter, h)
    pf = {"w13": {**base["w13"], **w13}, "w2": {**base["w2"], **w2}}

    def both():
        return (decode_one(x, logits, w13_w, w2_w, k, True, base, nxt),
                decode_one(x, logits, w13_w, w2_w, k, True, pf, nxt))

    want, got = both()
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap_want, cap_got = both()
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(10 + seed)
        x.copy_(torch.randn(1, h, device="cuda", generator=g).bfloat16())
        logits.copy_(torch.randn(1, e, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(cap_want, cap_got):
            assert torch.equal(a, b), seed
    del graph


@pytest.mark.parametrize("prefetch,merge", [(1, 0), (2, 0), (0, 1), (1, 1)])
def test_attention_prefetch_and_unrolled_merge_change_no_bit(prefetch, merge):
    from octavo.plugins.platforms.moe_decode_attention import attention_one

    hq, hk, d, page, blocks = 32, 4, 128, 16, 64
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(prefetch)
    cache = torch.randn(2, blocks, page, hk, d, generator=gen, device=dev).to(dt)
    cache2 = cache.clone()
    qw = (1 + 0.2 * torch.randn(d, generator=gen, device=dev)).to(dt)
    kw = (1 + 0.2 * torch.randn(d, generator=gen, device=dev)).to(dt)
    table = torch.randperm(blocks, generator=gen, device=dev).to(torch.int32)
    o_w = torch.randn(2048, hq * d, generator=gen, device=dev).to(dt)
    cos, sin = rope_tables(2048, d)
    cos, sin = cos.float().to(dev), sin.float().to(dev)
    qkv = torch.empty(1, (hq + 2 * hk) * d, dtype=dt, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    seq = torch.zeros(1, dtype=torch.int32, device=dev)
    slot = torch.zeros(1, dtype=torch.int64, device=dev)

    def run(c, pf, mg=0):
        return attention_one(qkv, pos, cos, sin, qw, kw, 1e-6, c, table, seq, slot, num_heads=hq, num_kv_heads=hk,
                             head_size=d, scale=d ** -0.5, neox=True, splits=16, block_n=64, num_warps=8,
                             dot16=True, prefetch=pf, prefetch_t=o_w if pf else None, merge=mg)

    def set_len(n):
        qkv.copy_((torch.randn(qkv.shape, generator=gen, device=dev) * 2).to(dt))
        pos.fill_(n - 1)
        seq.fill_(n)
        slot.fill_(int(table[(n - 1) // page]) * page + (n - 1) % page)

    set_len(300)
    assert torch.equal(run(cache, 0), run(cache2, prefetch, merge))
    assert torch.equal(cache, cache2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        want, got = run(cache, 0), run(cache2, prefetch, merge)
    for n in (1, 641, 17, 1000):
        set_len(n)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(want, got), n
        assert torch.equal(cache, cache2), n
    del graph
