"""The one-launch batch-1 attention (plugins/platforms/moe_decode_attention.py) under Triton's interpreter:
against a float64 oracle (q/k RMSNorm, rope, the new K/V stored at its slot, softmax attention over the paged
context), at several split counts (empty splits, a split owning the new token, the in-kernel merge), and installed
on a real Qwen3 attention module (dispatch by batch size, A/B switch, refusal of a wrong kernel).

Run by tests/kernels/test_moe_triton_cpu.py in a child pytest with TRITON_INTERPRET=1 (float16: the interpreter
rounds float32 -> bfloat16 toward zero)."""

from __future__ import annotations

import os
import types

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (run through test_moe_triton_cpu.py)", allow_module_level=True)

from octavo.plugins.platforms.moe_decode_attention import attention_one  # noqa: E402
from tests.kernels.moe_attn_oracle import oracle, rope_tables  # noqa: E402

HQ, HK, D, PAGE = 8, 2, 32, 4


def _case(dtype, ctx_len, seed):
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-ctx_len // PAGE) + 2
    cache = torch.randn(2, blocks, PAGE, HK, D, generator=gen).to(dtype)
    qkv = (torch.randn(1, (HQ + 2 * HK) * D, generator=gen) * 2).to(dtype)
    qw = (1 + 0.2 * torch.randn(D, generator=gen)).to(dtype)
    kw = (1 + 0.2 * torch.randn(D, generator=gen)).to(dtype)
    table = torch.randperm(blocks, generator=gen).to(torch.int32)[None]
    return cache, qkv, qw, kw, table


@pytest.mark.parametrize("ctx_len,splits,block_n,neox,early,dot16", [
    (1, 4, 16, True, True, True), (5, 8, 16, True, True, False), (23, 4, 16, True, False, True),
    (23, 1, 16, False, True, False), (40, 2, 32, True, True, True), (61, 16, 16, False, False, False),
    (61, 2, 16, True, True, True)])
def test_one_launch_matches_float64(ctx_len, splits, block_n, neox, early, dot16):
    dtype = torch.float16
    cache, qkv, qw, kw, table = _case(dtype, ctx_len, seed=ctx_len * 7 + splits)
    cos, sin = rope_tables(64, D)
    pos = torch.tensor([ctx_len - 1])
    slot = (table[0, (ctx_len - 1) // PAGE].long() * PAGE + (ctx_len - 1) % PAGE).view(1)
    eps, scale = 1e-6, D ** -0.5
    want, k_new, v_new = oracle(qkv, ctx_len - 1, cos, sin, qw, kw, eps, cache, table, ctx_len, scale, neox)
    before = cache.clone()
    got = attention_one(qkv, pos, cos.float(), sin.float(), qw, kw, eps, cache, table[0],
                        torch.tensor([ctx_len], dtype=torch.int32), slot, num_heads=HQ, num_kv_heads=HK,
                        head_size=D, scale=scale, neox=neox, splits=splits, block_n=block_n, early=early,
                        dot16=dot16)
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err < 2e-3, err
    # the new K/V are stored at the slot (rounded to the dtype), nothing else in the cache changed
    b, o = int(slot) // PAGE, int(slot) % PAGE
    assert (cache[0, b, o].double() - k_new).abs().max() <= 4e-3 * k_new.abs().max()
    assert torch.equal(cache[1, b, o], v_new.to(dtype))
    mask = torch.ones_like(cache, dtype=torch.bool)
    mask[:, b, o] = False
    assert torch.equal(cache[mask], before[mask])
    # the tickets are back at zero: a second launch (graph replay) gives the same output
    again = attention_one(qkv, pos, cos.float(), sin.float(), qw, kw, eps, cache, table[0],
                          torch.tensor([ctx_len], dtype=torch.int32), slot, num_heads=HQ, num_kv_heads=HK,
                          head_size=D, scale=scale, neox=neox, splits=splits, block_n=block_n, early=early,
                        dot16=dot16)
    assert torch.equal(again, got)


def test_slot_minus_one_stores_nothing():
    """A padding slot (< 0) is not written; the new token still takes part in the attention."""
    dtype = torch.float16
    cache, qkv, qw, kw, table = _case(dtype, 9, seed=3)
    cos, sin = rope_tables(64, D)
    before = cache.clone()
    attention_one(qkv, torch.tensor([8]), cos.float(), sin.float(), qw, kw, 1e-6, cache, table[0],
                  torch.tensor([9], dtype=torch.int32), torch.tensor([-1]), num_heads=HQ, num_kv_heads=HK,
                  head_size=D, scale=D ** -0.5, neox=True, splits=4, block_n=16)
    assert torch.equal(cache, before)


def _qwen3_attention(dtype):
    import transformers as T

    from octavo.plugins.models.qwen3 import Qwen3Attention

    cfg = T.Qwen3MoeConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=HQ,
                           num_key_value_heads=HK, head_dim=D, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, intermediate_size=64, max_position_embeddings=128)
    m = Qwen3Attention(cfg, 0, prefix="model.layers.0.self_attn")
    gen = torch.Generator().manual_seed(21)
    for p in m.parameters():
        p.data = (torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5).to(dtype)
    m.q_norm.weight.data = (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype)
    m.k_norm.weight.data = (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype)
    return m


def test_installed_on_a_qwen3_attention(monkeypatch):
    """Install (default on, checked against the triton backend), one token through the one launch with the module's
    own cache and metadata = the previous forward's output and stored K/V; 2 tokens take the previous forward;
    ``on=False`` too; off with ``OCTAVO_MOE_DECODE_ATTN=0``."""
    from octavo.model import ForwardContext
    from octavo.plugins.attention.triton import TritonAttentionBackend, TritonAttentionMetadata
    from octavo.plugins.platforms import moe_attention

    dt = torch.float16
    m = _qwen3_attention(dt)
    monkeypatch.setenv("OCTAVO_MOE_DECODE_ATTN", "0")
    assert moe_attention.install_decode_attention(m, dt, torch.device("cpu")) == 0
    monkeypatch.delenv("OCTAVO_MOE_DECODE_ATTN", raising=False)  # default on
    assert moe_attention.install_decode_attention(m, dt, torch.device("cpu")) == 1 and "forward" in vars(m)
    gen = torch.Generator().manual_seed(22)
    ctx_len, blocks = 30, 10
    cache = torch.randn(2, blocks, PAGE, HK, D, generator=gen).to(dt)
    table = torch.randperm(blocks, generator=gen).to(torch.int32)[None]
    slot = (table[0, (ctx_len - 1) // PAGE].long() * PAGE + (ctx_len - 1) % PAGE).view(1)
    md = TritonAttentionMetadata(query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                                 seq_lens=torch.tensor([ctx_len], dtype=torch.int32), block_tables=table,
                                 slot_mapping=slot, block_size=PAGE, max_query_len=1, max_seq_len=ctx_len,
                                 num_reqs=1, num_tokens=1, num_decodes=1)
    ctx = ForwardContext(attn_metadata=md, query_start_loc=md.query_start_loc)
    m.attn.bind(TritonAttentionBackend(num_heads=HQ, head_size=D, num_kv_heads=HK, scale=m.attn.scale), cache)
    x = torch.randn(1, 64, generator=gen).to(dt)
    pos = torch.tensor([ctx_len - 1])
    calls = []
    prev = m._attn_one_prev
    m._attn_one_prev = lambda *a: calls.append(1) or prev(*a)
    got = m(pos, x, ctx)
    got_cache = cache.clone()
    assert calls == []
    from octavo.plugins.platforms import cuda_moe_oproj  # o_proj loads its weight before the wait (session 9)

    early = []
    real_early = cuda_moe_oproj.gemv_early
    monkeypatch.setattr(cuda_moe_oproj, "gemv_early", lambda *a: early.append(a[2:]) or real_early(*a))
    moe_attention.set_attn_one(m, o_early=2, o_tile=(8, 16, 4))
    got_early = m(pos, x, ctx)  # the same token again: the same K/V rewritten
    moe_attention.set_attn_one(m, o_early=0)
    assert early == [(2, 8, 16, 4)] and torch.equal(cache, got_cache)
    assert (got_early.float() - got.float()).abs().max() <= 5e-3 * got.float().abs().max()
    early.clear()  # the qkv GEMV too (session 10); a BLOCK_K of None (the engine GEMV's) where the layer does not
    # run cuda_fusions' GEMV (this o_proj: F.linear) keeps the layer's own method
    moe_attention.set_attn_one(m, q_early=3, q_tile=(8, 32, 4), o_early=1, o_tile=(4, None, 4))
    got_early = m(pos, x, ctx)
    moe_attention.set_attn_one(m, q_early=0, o_early=0)
    assert early == [(3, 8, 32, 4)] and torch.equal(cache, got_cache)
    assert (got_early.float() - got.float()).abs().max() <= 5e-3 * got.float().abs().max()
    early.clear()  # a layer with a forward hook (LoRA adds its delta in one) is called, not bypassed
    hook = m.o_proj.register_forward_hook(lambda mod, args, out: out + 1)
    moe_attention.set_attn_one(m, o_early=2, o_tile=(8, 16, 4))
    got_hooked = m(pos, x, ctx)
    moe_attention.set_attn_one(m, o_early=0)
    hook.remove()
    assert early == [] and torch.allclose(got_hooked.float(), got.float() + 1, atol=5e-3 * got.float().abs().max())
    moe_attention.set_attn_one(m, on=False)
    want = m(pos, x, ctx)
    assert calls == [1]
    assert (got.float() - want.float()).abs().max() <= 5e-3 * want.float().abs().max()
    assert (got_cache.float() - cache.float()).abs().max() <= 5e-3 * cache.float().abs().max()
    moe_attention.set_attn_one(m, on=True)
    md2 = types.SimpleNamespace(**{**vars(md), "num_tokens": 2, "num_reqs": 2})
    assert not moe_attention.runs_here(m, 2, dt, md2)
    with pytest.raises(ValueError, match="unknown"):
        moe_attention.set_attn_one(m, splitz=4)


def test_a_wrong_kernel_is_refused_at_install(monkeypatch):
    from octavo.plugins.platforms import moe_attention, moe_decode_attention

    dt = torch.float16
    m = _qwen3_attention(dt)
    monkeypatch.setenv("OCTAVO_MOE_DECODE_ATTN", "1")
    real = moe_decode_attention.attention_one
    monkeypatch.setattr(moe_decode_attention, "attention_one", lambda *a, **k: real(*a, **k) * 1.05)
    assert moe_attention.install_decode_attention(m, dt, torch.device("cpu")) == 0 and "forward" not in vars(m)
