"""Decode attention launches at the served shapes on one GPU: which ``triton`` launch reads the KV cache fastest,
to fill ``plugins/attention/_triton_decode_table.py`` (issue 17; docs/performance.md "Decode attention launch
table").

Shapes (one attention layer, block 16, blocks shuffled like a warm cache, contexts uniform in a range):
``nano`` Qwen3-0.6B (16 q / 8 KV heads, 128) at the nano-vllm workload's mean batch 139, contexts 100-1600;
``nano256`` the same at its first steps (256 requests, 100-2000); ``8b`` Llama-3-8B (32 / 8, 128) at the
512 x 1000/1000 run's ~220 running requests, contexts 1000-2000, bf16; ``8b_fp8`` the same with an e4m3 cache
and ~420 requests (the fp8 run's doubled cache). Each variant: median of CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), KV bytes per second, max difference from the shape's first variant
(the launch the backend used before). ``ordered`` variants pass a longest-first order computed once outside the
timed call (the backend computes it once per step, not per layer); ``longest_first_us`` times that kernel.
``chunk`` variants split contexts into chunks (grid sized for a 4,096-token bound, as under CUDA graphs) and
include their merge kernel. ``writekv`` variants also store each request's K/V (as a decode step does; compare
with the ordered launch plus ``kv_write``, the separate write launch they save).
Variants run in priority order across shapes until ``--budget`` seconds are spent (compiles dominate).

    python benchmarks/decode_attn_bench.py --out /tmp/decode_attn.json [--budget 50] [--shapes nano 8b]
    python benchmarks/decode_attn_bench.py --plan tail --out /tmp/tail.json  # split rules at 8 / 24 / 48 requests
    python benchmarks/decode_attn_bench.py --plan waves --out /tmp/waves.json  # the 8B run's 215 / 82-row waves
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAGE = 16
SHAPES = {  # name: (q heads, kv heads, head, batch, ctx lo, ctx hi, fp8 cache)
    "nano": (16, 8, 128, 139, 100, 1600, False),
    "8b": (32, 8, 128, 220, 1000, 2000, False),
    "8b_fp8": (32, 8, 128, 420, 1000, 2000, True),
    "nano256": (16, 8, 128, 256, 100, 2000, False),
    # the nano-vllm run's last few hundred steps: few requests left, long contexts (split-KV territory)
    "tail8": (16, 8, 128, 8, 1400, 2000, False),
    "tail24": (16, 8, 128, 24, 1300, 2000, False),
    "tail48": (16, 8, 128, 48, 1200, 2000, False),
    # the 8B 512 x 1000/1000 run's waves on an H100 (session 9, tput: 26,970 KV blocks): 215 requests that started
    # together (one context length for all: equal programs, so ordering cannot shorten the last round of programs
    # on the SMs: 1,720 programs at 2 per SM = 6.5 rounds), then the 82-request tail wave (656 programs: 2.5 rounds)
    "8b_w215": (32, 8, 128, 215, 1500, 1500, False),
    "8b_w82": (32, 8, 128, 82, 1500, 1500, False),
}
# ``--plan tail``: the backend's own decode step (K/V write + attention, metadata as under CUDA graphs: the context
# bound is max_model_len) under split rules (triton.SPLIT_RULE / OCTAVO_TRITON_SPLIT_KV)
TAIL_PLAN = [(shape, f"backend_split_{b}_{t}" + (" (default)" if (b, t) == (1, 2) else ""), "backend",
              dict(rule=(b, t))) for shape in ("tail8", "tail24", "tail48") for b, t in ((1, 2), (4, 8), (2, 8), (4, 16))]
# ``--plan waves``: the launch table's 8B entry vs other tiles and chunked split-KV at the 8B run's equal-context waves
WAVES_PLAN = [(shape, name, "decode", kw) for name, kw in (
    ("decode_n128_ordered (table)", dict(block_n=128, ordered=True)),
    ("decode_n128_ordered_chunk512", dict(block_n=128, ordered=True, chunk=512)),
    ("decode_n128_ordered_chunk1024", dict(block_n=128, ordered=True, chunk=1024)),
    ("decode_n64_ordered", dict(ordered=True)),
    ("decode_n64_s3_ordered", dict(num_stages=3, ordered=True)),
    ("decode_n128_s3_ordered", dict(block_n=128, num_stages=3, ordered=True)),
    ("decode_n128_w8_ordered", dict(block_n=128, num_warps=8, ordered=True))) for shape in ("8b_w82", "8b_w215")]
# (shape, variant name, kernel, kwargs) in priority order; the first of each shape is its baseline
PLAN = [
    ("nano", "general_n64 (before)", "general", {}),
    ("nano", "decode_n128 (table, session 5)", "decode", dict(block_n=128)),
    ("nano", "decode_n128_ordered", "decode", dict(block_n=128, ordered=True)),
    ("8b", "general_n64 (before)", "general", {}),
    ("8b", "decode_n128", "decode", dict(block_n=128)),
    ("8b", "decode_n128_ordered", "decode", dict(block_n=128, ordered=True)),
    ("nano", "decode_n128_ordered_chunk512", "decode", dict(block_n=128, ordered=True, chunk=512)),
    ("8b", "decode_n128_ordered_chunk512", "decode", dict(block_n=128, ordered=True, chunk=512)),
    ("8b_fp8", "decode_n64 (fp8 default)", "decode", {}),
    ("8b_fp8", "decode_n64_ordered", "decode", dict(ordered=True)),
    ("nano", "kv_write (the separate write launch)", "write", {}),
    ("nano", "decode_n128_ordered_writekv", "decode", dict(block_n=128, ordered=True, write_kv=True)),
    ("8b", "kv_write (the separate write launch)", "write", {}),
    ("8b", "decode_n128_ordered_writekv", "decode", dict(block_n=128, ordered=True, write_kv=True)),
    ("nano", "decode_n64_ordered", "decode", dict(ordered=True)),
    ("8b", "decode_n64", "decode", {}),
    ("nano", "decode_n128_w8_ordered", "decode", dict(block_n=128, num_warps=8, ordered=True)),
    ("8b", "decode_n128_w8_ordered", "decode", dict(block_n=128, num_warps=8, ordered=True)),
    ("nano", "decode_n128_s3_ordered", "decode", dict(block_n=128, num_stages=3, ordered=True)),
    ("8b", "decode_n128_s3_ordered", "decode", dict(block_n=128, num_stages=3, ordered=True)),
    ("nano", "decode_n128_ordered_chunk1024", "decode", dict(block_n=128, ordered=True, chunk=1024)),
    ("8b", "decode_n128_ordered_chunk1024", "decode", dict(block_n=128, ordered=True, chunk=1024)),
    ("8b_fp8", "decode_n128_ordered", "decode", dict(block_n=128, ordered=True)),
    ("8b_fp8", "decode_n64_ordered_chunk512", "decode", dict(ordered=True, chunk=512)),
    ("nano", "decode_n64_ordered_chunk256", "decode", dict(ordered=True, chunk=256)),
    ("nano", "general_n128", "general", dict(block_n=128)),
    ("8b_fp8", "decode_n128_w8_ordered", "decode", dict(block_n=128, num_warps=8, ordered=True)),
    ("nano", "decode_n256_w8_ordered", "decode", dict(block_n=256, num_warps=8, ordered=True)),
    ("8b", "decode_n256_w8_ordered", "decode", dict(block_n=256, num_warps=8, ordered=True)),
    ("nano256", "general_n64 (before)", "general", {}),
    ("nano256", "decode_n128", "decode", dict(block_n=128)),
    ("nano256", "decode_n128_ordered", "decode", dict(block_n=128, ordered=True)),
    ("nano256", "decode_n128_ordered_chunk512", "decode", dict(block_n=128, ordered=True, chunk=512)),
    ("nano", "decode_n128_pack2_ordered", "decode", dict(block_n=128, pack=2, ordered=True)),
    ("8b", "decode_n64_s3_ordered", "decode", dict(num_stages=3, ordered=True)),
]


def build(shape, dev, seed=0):
    import torch

    from benchmarks.qwen3_attn_bench import paged_kv

    heads, kv_heads, head, batch, lo, hi, fp8 = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    ctx, tables, kv = paged_kv(batch, lo, hi, kv_heads, head, dev, gen, seed)
    if fp8:
        kv = kv.to(torch.float8_e4m3fn)
    q = torch.randn(batch, heads, head, generator=gen).to(torch.bfloat16).to(dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    return dict(q=q, kv=kv, tables=tables.to(dev), lens=ctx.to(torch.int32).to(dev), qsl=qsl,
                tokens=int(ctx.sum()), kv_heads=kv_heads, head=head, group=heads // kv_heads, fp8=fp8)


def general(d, out, block_n=64, num_warps=4, num_stages=2):
    """The triton backend's general-kernel decode launch (BLOCK_Q 1, BLOCK_M 16), grid request-fastest."""
    from octavo.plugins.attention._triton_kernels import LOG2E, _paged_attention_kernel

    q, kv, head = d["q"], d["kv"], d["head"]
    scale = head ** -0.5
    _paged_attention_kernel[(q.shape[0], 1, d["kv_heads"])](
        q, kv[0], kv[1], out, out, d["tables"], d["lens"], d["qsl"], scale * LOG2E, scale, 1.0, 0, 1.0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), 0, 0, 0,
        kv.stride(1), kv.stride(2), d["tables"].stride(0),
        GROUP=d["group"], GROUP_P=d["group"], BLOCK_Q=1, BLOCK_M=16, BLOCK_N=block_n, HEAD_D=head, HEAD_DP=head,
        PAGE=PAGE, NUM_SPLITS=1, USE_SOFTCAP=False, USE_WINDOW=False, DOT_PREC="tf32", KV_FP8=d["fp8"],
        num_warps=num_warps, num_stages=num_stages)


MAX_MODEL_LEN = 4096  # the engines' bound under CUDA graphs: it sizes a chunked launch's grid


def last_kv(d):
    """Each request's last-position K/V as in the cache, and their slots: writing them back changes nothing,
    so a K/V-writing launch keeps the baseline's output."""
    if "last_kv" not in d:
        kv, lens, tables = d["kv"], d["lens"].long(), d["tables"].long()
        pos = lens - 1
        slots = tables.gather(1, (pos // PAGE)[:, None])[:, 0] * PAGE + pos % PAGE
        flat = kv.view(2, -1, d["kv_heads"], d["head"])
        d["last_kv"] = (flat[0][slots].clone(), flat[1][slots].clone(), slots)
    return d["last_kv"]


def write(d, out):
    """The backend's separate K/V write launch for one decode token per request (what write_kv saves)."""
    from octavo.plugins.attention.triton import TritonAttentionBackend

    if "impl" not in d:
        d["impl"] = TritonAttentionBackend(num_heads=d["q"].shape[1], head_size=d["head"], num_kv_heads=d["kv_heads"],
                                           scale=d["head"] ** -0.5)
    k, v, slots = last_kv(d)
    d["impl"].write_kv(k, v, d["kv"], slots)


def backend(d, out, rule):
    """The ``triton`` backend's forward for one decode step (its K/V write, split-KV or decode launch, merge) under
    a split rule; metadata as a CUDA graph holds it (context bound ``MAX_MODEL_LEN``). Writes the cache's own
    last K/V back (no change), so every call computes the same output."""
    from octavo.plugins.attention import triton as tb

    tb.SPLIT_RULE = rule
    q = d["q"]
    n = q.shape[0]
    if "impl" not in d:
        d["impl"] = tb.TritonAttentionBackend(num_heads=q.shape[1], head_size=d["head"], num_kv_heads=d["kv_heads"],
                                              scale=d["head"] ** -0.5)
    k, v, slots = last_kv(d)
    md = tb.TritonAttentionMetadata(query_start_loc=d["qsl"], seq_lens=d["lens"], block_tables=d["tables"],
                                    slot_mapping=slots, block_size=PAGE, max_query_len=1, max_seq_len=MAX_MODEL_LEN,
                                    num_reqs=n, num_tokens=n, num_decodes=n)
    md.scratch.update({("order_owner", n): -1, ("order", n): d["order"]})  # the order: once a step, not a layer
    out.copy_(d["impl"].forward(q, k, v, d["kv"], md))


def decode(d, out, ordered=False, chunk=0, write_kv=False, **kw):
    from octavo.plugins.attention._triton_decode import chunk_scratch, chunk_splits, paged_decode

    q, kv = d["q"], d["kv"]
    scratch = None
    if chunk:  # the backend allocates these once per step; keep them out of the timed call
        key = ("scratch", chunk)
        if key not in d:
            d[key] = chunk_scratch(q.shape[0], q.shape[1], chunk_splits(MAX_MODEL_LEN, chunk), d["head"], q.device)
        scratch = d[key]
    paged_decode(q, kv[0], kv[1], out, d["tables"], d["lens"], d["qsl"], num_reqs=q.shape[0],
                 num_kv_heads=d["kv_heads"], scale=d["head"] ** -0.5, v_scale=1.0, block_size=PAGE,
                 order=d["order"] if ordered else None, chunk=chunk, max_seq_len=MAX_MODEL_LEN, scratch=scratch,
                 new_kv=(*last_kv(d), 1.0, 1.0) if write_kv else None, **kw)


def main() -> None:
    import torch
    import triton.testing

    from octavo.plugins.attention._triton_decode import longest_first

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=50.0)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--rep", type=int, default=60, help="ms of replays per variant")
    ap.add_argument("--plan", choices=["table", "tail", "waves"], default="table",
                    help="table: the launch-table variants (session 6); tail: split rules at few requests; "
                         "waves: the 8B run's equal-context waves (session 9)")
    args = ap.parse_args()
    plan = {"tail": TAIL_PLAN, "waves": WAVES_PLAN}.get(args.plan, PLAN)
    if args.plan == "tail" and args.shapes == list(SHAPES):
        args.shapes = ["tail8", "tail24", "tail48"]
    if args.plan == "waves" and args.shapes == list(SHAPES):
        args.shapes = ["8b_w82", "8b_w215"]
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    res = {"card": torch.cuda.get_device_name(), "command": "python benchmarks/decode_attn_bench.py",
           "budget_s": args.budget, "shapes": {}}
    buf = torch.empty(2 ** 29, dtype=torch.bfloat16, device=dev)  # 1 GiB: the card's read and copy rates
    dst = torch.empty_like(buf)
    ms_copy = triton.testing.do_bench_cudagraph(functools.partial(dst.copy_, buf), rep=40, return_mode="median")
    ms_sum = triton.testing.do_bench_cudagraph(functools.partial(torch.sum, buf, dtype=torch.float32), rep=40,
                                                return_mode="median")
    res["copy_TBps"] = 2 * buf.numel() * 2 / ms_copy / 1e9  # bytes read + written
    res["read_TBps"] = buf.numel() * 2 / ms_sum / 1e9  # a reduction: bytes read
    print(f"copy {res['copy_TBps']:.2f} TB/s, read (sum) {res['read_TBps']:.2f} TB/s", flush=True)
    del buf, dst
    data, refs = {}, {}
    for shape, name, kind, kw in plan:
        if shape not in args.shapes:
            continue
        if time.perf_counter() - t0 > args.budget:
            res["shapes"].setdefault(shape, {}).setdefault("variants", {})[name] = "skipped: budget"
            continue
        if shape not in data:
            d = data[shape] = build(shape, dev)
            d["order"] = longest_first(d["lens"], d["q"].shape[0])
            kv_bytes = d["tokens"] * d["kv_heads"] * d["head"] * 2 * d["kv"].element_size()
            ms = triton.testing.do_bench_cudagraph(
                functools.partial(longest_first, d["lens"], d["q"].shape[0], out=d["order"]), rep=20,
                return_mode="median")
            res["shapes"][shape] = {"shape": SHAPES[shape], "context_tokens": d["tokens"], "kv_bytes": kv_bytes,
                                    "longest_first_us": ms * 1e3, "variants": {}}
        d, entry = data[shape], res["shapes"][shape]
        out = torch.empty_like(d["q"])
        try:
            fn = {"general": general, "decode": decode, "write": write, "backend": backend}[kind]
            fn(d, out, **kw)
            torch.cuda.synchronize()
            if shape not in refs:
                refs[shape] = out.clone()
            call = functools.partial(fn, d, out, **kw)
            ms = triton.testing.do_bench_cudagraph(call, rep=args.rep, return_mode="median")
            r = {"ms": ms} if kind == "write" else {
                "ms": ms, "kv_TBps": entry["kv_bytes"] / ms / 1e9,
                "max_abs_diff": (out.float() - refs[shape].float()).abs().max().item()}
            base = next(iter(entry["variants"].values()), None)
            if isinstance(base, dict) and "ms" in base and kind != "write":
                r["speedup_vs_baseline"] = base["ms"] / ms
        except Exception as e:  # noqa: BLE001 - a launch config that does not compile: record it
            r = {"error": repr(e)[:300]}
        entry["variants"][name] = r
        print(f"{time.perf_counter() - t0:5.1f}s {shape:8s} {name:34s} {r}", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
