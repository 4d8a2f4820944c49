"""Decode attention of the nano-vllm workload's shape on one GPU: which ``triton`` kernel launch reads the KV
cache fastest. GPU batch 1 (session 5) put ~72 % of a Qwen3-0.6B decode step at batch 128 in
``_paged_attention_kernel`` at ~0.85 of the copy bandwidth.

One attention layer of Qwen3-0.6B (16 query heads, 8 KV heads, head 128, block 16, bf16 cache) decoding
``--batch`` requests with contexts uniform in [``--ctx-lo``, ``--ctx-hi``] (the workload's mean batch and
context range), blocks shuffled like a warm cache. Each variant: median of CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), KV bytes per second, max difference from the backend's launch.

    python benchmarks/qwen3_attn_bench.py --out /tmp/attn.json [--budget 12]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

HEADS, KV_HEADS, HEAD, PAGE = 16, 8, 128, 16


def paged_kv(batch, lo, hi, kv_heads, head, dev, gen, seed=0):
    """Contexts uniform in [lo, hi] (the first one ``hi``), block tables over shuffled blocks (block 0 unused, like a
    warm cache) and a random bf16 K/V cache of ``kv_heads`` x ``head``: ``(ctx, tables, kv)``."""
    import torch

    ctx = torch.randint(lo, hi + 1, (batch,), generator=gen)
    ctx[0] = hi
    nblk = (ctx + PAGE - 1) // PAGE
    total = int(nblk.sum()) + 1
    perm = torch.randperm(total - 1, generator=gen) + 1
    tables = torch.zeros(batch, int(nblk.max()), dtype=torch.int32)
    at = 0
    for i, n in enumerate(nblk.tolist()):
        tables[i, :n] = perm[at: at + n].to(torch.int32)
        at += n
    kv = torch.empty(2, total, PAGE, kv_heads, head, dtype=torch.bfloat16, device=dev)
    kv.normal_(generator=torch.Generator(device=dev).manual_seed(seed))
    return ctx, tables, kv


def build(batch, lo, hi, dev, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    ctx, tables, kv = paged_kv(batch, lo, hi, KV_HEADS, HEAD, dev, gen, seed)
    q = torch.randn(batch, HEADS, HEAD, generator=gen).to(torch.bfloat16).to(dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    return q, kv, tables.to(dev), ctx.to(torch.int32).to(dev), qsl, int(ctx.sum())


def general(q, kv, tables, seq_lens, qsl, out, block_n=64, warps=4, stages=2):
    """The triton backend's decode launch for GQA 2 (BLOCK_Q 1, BLOCK_M 16), grid request-fastest."""
    from octavo.plugins.attention._triton_kernels import LOG2E, _paged_attention_kernel

    scale = HEAD ** -0.5
    _paged_attention_kernel[(q.shape[0], 1, KV_HEADS)](
        q, kv[0], kv[1], out, out, tables, seq_lens, qsl, scale * LOG2E, scale, 1.0, 0, 1.0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), 0, 0, 0,
        kv.stride(1), kv.stride(2), tables.stride(0),
        GROUP=2, GROUP_P=2, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=block_n, HEAD_D=HEAD, HEAD_DP=HEAD, PAGE=PAGE,
        NUM_SPLITS=1, USE_SOFTCAP=False, USE_WINDOW=False, DOT_PREC="tf32", KV_FP8=False,
        num_warps=warps, num_stages=stages)


def decode(q, kv, tables, seq_lens, qsl, out, **kw):
    from octavo.plugins.attention._triton_decode import paged_decode

    paged_decode(q, kv[0], kv[1], out, tables, seq_lens, qsl, num_reqs=q.shape[0], num_kv_heads=KV_HEADS,
                 scale=HEAD ** -0.5, v_scale=1.0, block_size=PAGE, **kw)


VARIANTS = [
    ("general_n64_w4_s2 (the backend today)", general, {}),
    ("decode_heads_n64_w4_s2 (OCTAVO_TRITON_DECODE_KERNEL=1)", decode, {}),
    ("general_n128_w4_s2", general, dict(block_n=128)),
    ("general_n64_w8_s2", general, dict(warps=8)),
    ("general_n64_w4_s3", general, dict(stages=3)),
    ("decode_heads_n128_w4_s2", decode, dict(block_n=128)),
    ("decode_heads_n64_w8_s2", decode, dict(num_warps=8)),
    ("decode_heads_n32_w4_s3", decode, dict(block_n=32, num_stages=3)),
    ("decode_heads_n64_w2_s2", decode, dict(num_warps=2)),
    ("general_n32_w4_s3", general, dict(block_n=32, stages=3)),
]


def main() -> None:
    import torch
    import triton.testing

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=12.0)
    ap.add_argument("--batch", type=int, default=139)
    ap.add_argument("--ctx-lo", type=int, default=100)
    ap.add_argument("--ctx-hi", type=int, default=1600)
    args = ap.parse_args()
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    q, kv, tables, seq_lens, qsl, tokens = build(args.batch, args.ctx_lo, args.ctx_hi, dev)
    kv_bytes = tokens * KV_HEADS * HEAD * 2 * 2
    res = {"card": torch.cuda.get_device_name(), "command": "python benchmarks/qwen3_attn_bench.py",
           "batch": args.batch, "context_tokens": tokens, "kv_bytes_per_layer": kv_bytes, "variants": {}}
    ref = torch.empty_like(q)
    general(q, kv, tables, seq_lens, qsl, ref)
    for name, fn, kw in VARIANTS:
        if time.perf_counter() - t0 > args.budget:
            res["variants"][name] = "skipped: budget"
            continue
        out = torch.empty_like(q)
        try:
            fn(q, kv, tables, seq_lens, qsl, out, **kw)
            torch.cuda.synchronize()
            call = functools.partial(fn, q, kv, tables, seq_lens, qsl, out, **kw)
            ms = triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")
            r = {"ms": ms, "kv_TBps": kv_bytes / ms / 1e9,
                 "max_abs_diff": (out.float() - ref.float()).abs().max().item()}
        except Exception as e:  # noqa: BLE001 - a launch config that does not compile: record it
            r = {"error": repr(e)[:300]}
        res["variants"][name] = r
        print(name, r, flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
