"""Inputs and the float64 reference shared by the decode-attention kernel tests on paged (fp8) caches
(test_fp8_decode_attention.py: ``_triton_decode``; test_fp8_kv_decode.py: ``_fp8_kv_decode``; also
tests/kernels/triton_decode_cases.py, the triton backend's decode launches on 16-bit and e4m3 caches).

Why one module: both kernels read the same cache layout ``[blocks, page, kv_heads, head]`` through shuffled block
tables and are checked the same way, against softmax attention in float64 on the dequantized cache, so the case
builder and the reference are written once. Importable from the tests' interpreter child processes (run with the
repository root as the working directory).
"""

from __future__ import annotations

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def paged_case(gen: torch.Generator, heads: int, kv_heads: int, d: int, ctx: list[int], cache_dtype, q_dtype,
               ks: float = 1.0, vs: float = 1.0, page: int = 16, k_edit=None):
    """``(q, k_cache, v_cache, k_float64, v_float64, block_tables, tables)`` on the CPU: contexts ``ctx`` over
    shuffled blocks (block 0 unused), K ~ 2 N(0, 1), V ~ N(0, 1) (``k_edit(k)`` may change K before it is
    stored), an fp8 cache quantized with scales ``ks`` / ``vs`` (its float64 twin dequantized), q ~ N(0, 1)."""
    from octavo.nn.kv_quant import dequantize, quantize

    nblk = [(c + page - 1) // page for c in ctx]
    perm = (torch.randperm(sum(nblk), generator=gen) + 1).tolist()
    tables, at = [], 0
    for n in nblk:
        tables.append(perm[at: at + n])
        at += n
    k = torch.randn(sum(nblk) + 1, page, kv_heads, d, generator=gen) * 2
    v = torch.randn(sum(nblk) + 1, page, kv_heads, d, generator=gen)
    if k_edit is not None:
        k_edit(k)
    if cache_dtype in FP8:
        kc, vc = quantize(k, ks, cache_dtype), quantize(v, vs, cache_dtype)
        kf, vf = dequantize(kc, ks, torch.float64), dequantize(vc, vs, torch.float64)
    else:
        kc, vc, kf, vf = k.to(cache_dtype), v.to(cache_dtype), k.double(), v.double()
    q = torch.randn(len(ctx), heads, d, generator=gen).to(q_dtype)
    bt = torch.zeros(len(ctx), max(nblk), dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return q, kc, vc, kf, vf, bt, tables


def reference(q, kf, vf, tables, ctx, scale):
    """Softmax attention of one query token per request over its context, float64: ``[reqs, heads, d]``."""
    out = []
    g = q.shape[1] // kf.shape[2]
    for i, n in enumerate(ctx):
        kk = kf[tables[i]].reshape(-1, kf.shape[2], kf.shape[3])[:n].repeat_interleave(g, 1)
        vv = vf[tables[i]].reshape(-1, vf.shape[2], vf.shape[3])[:n].repeat_interleave(g, 1)
        p = (torch.einsum("hd,lhd->hl", q[i].double(), kk) * scale).softmax(-1)
        out.append(torch.einsum("hl,lhd->hd", p, vv))
    return torch.stack(out)
