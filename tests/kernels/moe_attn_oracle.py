"""float64 oracle of one decode token's Qwen3 attention (q/k RMSNorm, rope, paged context plus the new K/V):
shared by the interpreter cases (moe_attn_interp_cases.py) and the GPU test (test_moe_attn_gpu.py)."""

from __future__ import annotations

import torch


def rope_tables(max_pos: int, d: int, base: float = 10000.0):
    """(cos, sin) float64 ``[max_pos, d/2]``, as ``RotaryEmbedding``'s caches."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def oracle(qkv, pos, cos, sin, qw, kw, eps, cache, table, ctx_len, scale, neox=True):
    """float64: normalise + rotate q and k, the context keys from the cache ``[2, blocks, page, hk, d]`` plus the
    new one, softmax attention -> (out ``[1, hq*d]``, new k ``[hk, d]``, new v ``[hk, d]``)."""
    PAGE, HK, D = cache.shape[2], cache.shape[3], cache.shape[4]
    HQ = qkv.shape[-1] // D - 2 * HK
    qkv, cache, table = qkv.cpu(), cache.cpu(), table.cpu()
    x = qkv.double()[0]
    q = x[:HQ * D].view(HQ, D)
    k = x[HQ * D:(HQ + HK) * D].view(HK, D)
    v = x[(HQ + HK) * D:].view(HK, D)

    def norm_rope(t, w):
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double().cpu()
        c, s = cos[pos].double(), sin[pos].double()
        if neox:
            a, b = t[:, :D // 2], t[:, D // 2:]
            return torch.cat([a * c - b * s, b * c + a * s], -1)
        a, b = t[:, 0::2], t[:, 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

    q, k = norm_rope(q, qw), norm_rope(k, kw)
    idx = torch.arange(ctx_len)
    rows = table[0, idx // PAGE].long() * PAGE + idx % PAGE
    keys = cache[0].reshape(-1, HK, D)[rows].double()
    vals = cache[1].reshape(-1, HK, D)[rows].double()
    keys[-1], vals[-1] = k, v
    g = HQ // HK
    out = torch.empty(HQ, D, dtype=torch.float64)
    for h in range(HQ):
        sc = keys[:, h // g] @ q[h] * scale
        out[h] = torch.softmax(sc, 0) @ vals[:, h // g]
    return out.reshape(1, HQ * D), k, v
