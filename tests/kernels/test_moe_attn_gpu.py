"""The batch-1 one-launch attention (plugins/platforms/moe_decode_attention.py) on a CUDA GPU (skips without one):
at the Qwen3-30B-A3B attention shape (32 q / 4 kv heads, head 128, page 16), bf16, against a float64 oracle and
the triton backend's four-launch path, eager and replayed from a CUDA graph with new contexts (the grid does not
depend on the length; the per-kv-head tickets reset themselves), at every split count the benchmark tries."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.moe_attn_oracle import oracle, rope_tables

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HQ, HK, D, PAGE, BLOCKS = 32, 4, 128, 16, 160


def _inputs(gen, dt, dev):
    cache = torch.randn(2, BLOCKS, PAGE, HK, D, generator=gen, device=dev).to(dt)
    qw = (1 + 0.2 * torch.randn(D, generator=gen, device=dev)).to(dt)
    kw = (1 + 0.2 * torch.randn(D, generator=gen, device=dev)).to(dt)
    table = torch.randperm(BLOCKS, generator=gen, device=dev).to(torch.int32)[None]
    return cache, qw, kw, table


@pytest.mark.parametrize("splits,block_n,early,dot16", [(16, 64, True, False), (16, 64, True, True),
                                                        (8, 64, True, True), (16, 64, False, True),
                                                        (16, 32, True, True), (1, 64, True, False)])
def test_one_launch_at_the_qwen3_30b_shape_in_a_graph(splits, block_n, early, dot16):
    from octavo.plugins.platforms.moe_decode_attention import attention_one

    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(splits * 100 + block_n + early + 2 * dot16)
    cache, qw, kw, table = _inputs(gen, dt, dev)
    cos, sin = rope_tables(4096, D)
    cos_d, sin_d = cos.float().to(dev), sin.float().to(dev)
    qkv = torch.empty(1, (HQ + 2 * HK) * D, dtype=dt, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    seq = torch.zeros(1, dtype=torch.int32, device=dev)
    slot = torch.zeros(1, dtype=torch.int64, device=dev)

    def run():
        return attention_one(qkv, pos, cos_d, sin_d, qw, kw, 1e-6, cache, table[0], seq, slot, num_heads=HQ,
                             num_kv_heads=HK, head_size=D, scale=D ** -0.5, neox=True, splits=splits, block_n=block_n,
                             early=early, dot16=dot16)

    def set_len(n):
        qkv.copy_((torch.randn(qkv.shape, generator=gen, device=dev) * 2).to(dt))
        pos.fill_(n - 1)
        seq.fill_(n)
        slot.fill_(int(table[0, (n - 1) // PAGE]) * PAGE + (n - 1) % PAGE)

    set_len(37)
    run()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for n, replay in [(1, False), (300, False), (1, True), (641, True), (2000, True), (17, True)]:
        set_len(n)
        before = cache.clone()
        if replay:
            graph.replay()
            got = out.clone()
        else:
            got = run()
        torch.cuda.synchronize()
        want, k_new, v_new = oracle(qkv, n - 1, cos, sin, qw, kw, 1e-6, before, table, n, D ** -0.5)
        err = float((got.double().cpu() - want).abs().max() / want.abs().max())
        assert err < 3e-2, (n, replay, err)  # bf16 q/k rounding moves the scores (the eager path rounds too)
        s = int(slot)
        assert torch.equal(cache[1, s // PAGE, s % PAGE].cpu(), v_new.to(dt))
        assert (cache[0, s // PAGE, s % PAGE].double().cpu() - k_new).abs().max() <= 2.5e-2 * k_new.abs().max()  # 3 bf16 roundings


def test_one_launch_equals_the_backend_path_to_rounding():
    """The same token through the triton backend (q/k norm + rope, KV write, split-KV attention, merge): outputs
    within bf16 rounding, and identical stored V."""
    from octavo.plugins.attention.triton import TritonAttentionBackend, TritonAttentionMetadata
    from octavo.plugins.platforms.moe_decode_attention import attention_one

    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(5)
    cache, qw, kw, table = _inputs(gen, dt, dev)
    cache2 = cache.clone()
    cos, sin = rope_tables(4096, D)
    n = 640
    qkv = (torch.randn(1, (HQ + 2 * HK) * D, generator=gen, device=dev) * 2).to(dt)
    pos = torch.tensor([n - 1], device=dev)
    slot = (table[0, (n - 1) // PAGE].long() * PAGE + (n - 1) % PAGE).view(1)
    seq = torch.tensor([n], dtype=torch.int32, device=dev)
    got = attention_one(qkv, pos, cos.float().to(dev), sin.float().to(dev), qw, kw, 1e-6, cache2, table[0], seq,
                        slot, num_heads=HQ, num_kv_heads=HK, head_size=D, scale=D ** -0.5, neox=True)
    from octavo.plugins.platforms.cuda_qk_norm_rope import close

    exact = oracle(qkv, n - 1, cos, sin, qw, kw, 1e-6, cache, table, n, D ** -0.5)[0]
    q, k, v = qkv.split([HQ * D, HK * D, HK * D], -1)
    ref_q, ref_k = _norm_rope_ref(q, k, qw, kw, cos, sin, n - 1, dt, dev)
    md = TritonAttentionMetadata(query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=dev), seq_lens=seq,
                                 block_tables=table, slot_mapping=slot, block_size=PAGE, max_query_len=1,
                                 max_seq_len=n, num_reqs=1, num_tokens=1, num_decodes=1)
    impl = TritonAttentionBackend(num_heads=HQ, head_size=D, num_kv_heads=HK, scale=D ** -0.5)
    want = impl.forward(ref_q.view(1, HQ, D), ref_k.view(1, HK, D), v.reshape(1, HK, D), cache, md).reshape(1, -1)
    assert close(got, want)
    assert float((got.double().cpu() - exact).abs().max() / exact.abs().max()) < 1e-2
    assert torch.equal(cache2[1], cache[1]) and close(cache2[0], cache[0])


def _norm_rope_ref(q, k, qw, kw, cos, sin, p, dt, dev):
    """Eager q/k RMSNorm + neox rope rounded like octavo.nn (norm -> dtype, x weight -> dtype, rotate in fp32)."""
    def one(t, w, heads):
        t = t.view(heads, D).float()
        t = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt).float()
        t = (t * w.float()).to(dt).float()
        c, s = cos[p].float().to(dev), sin[p].float().to(dev)
        a, b = t[:, :D // 2], t[:, D // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], -1).to(dt).reshape(1, -1)

    return one(q, qw, HQ), one(k, kw, HK)
