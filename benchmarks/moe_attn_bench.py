"""Batch-1 decode attention of the Qwen3-30B-A3B shape, per layer, graph-replayed: the triton backend's four
launches (q/k norm + rope, KV write, split-KV attention, merge) against the one-launch kernel
(plugins/platforms/moe_decode_attention.py) and its variants, including diagnostic ones (1 split: no merge).

Why: in the whole-model A/B (session 7 batch 1, H100) the one launch took 12.6 us a layer against 12.1 for the four;
this splits where its time goes without a 60 GB engine. 48 layers' caches (63 MB, more than the L2) and qkv rows,
each path captured in one CUDA graph over the 48 layers; microseconds per layer = replay time / 48. Warm-up: every
path runs once eagerly (compiles) before its capture. Usage: ``python benchmarks/moe_attn_bench.py --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import types

import torch

HQ, HK, D, PAGE, LAYERS = 32, 4, 128, 16, 48


def _replay_us(graph, iters: int = 20) -> float:
    graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters / LAYERS * 1e6


def _graph(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=640)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from octavo.plugins.attention.triton import TritonAttentionBackend, TritonAttentionMetadata
    from octavo.plugins.platforms.cuda_qk_norm_rope import qk_norm_rope
    from octavo.plugins.platforms.moe_decode_attention import attention_one

    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    n = args.ctx
    blocks = -(-n // PAGE) + 1
    caches = [torch.randn(2, blocks, PAGE, HK, D, device=dev).to(dt) for _ in range(LAYERS)]
    qkvs = [torch.randn(1, (HQ + 2 * HK) * D, device=dev).to(dt) for _ in range(LAYERS)]
    table = torch.randperm(blocks, device=dev).to(torch.int32)[None]
    pos = torch.tensor([n - 1], device=dev)
    seq = torch.tensor([n], dtype=torch.int32, device=dev)
    slot = (table[0, (n - 1) // PAGE].long() * PAGE + (n - 1) % PAGE).view(1)
    inv = 1.0 / 1e6 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)
    qw, knw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt), (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
    md = TritonAttentionMetadata(query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=dev), seq_lens=seq,
                                 block_tables=table, slot_mapping=slot, block_size=PAGE, max_query_len=1,
                                 max_seq_len=1024, num_reqs=1, num_tokens=1, num_decodes=1)  # as the bs1 engine
    impl = TritonAttentionBackend(num_heads=HQ, head_size=D, num_kv_heads=HK, scale=D ** -0.5)
    attn = types.SimpleNamespace(head_dim=D, q_size=HQ * D, kv_size=HK * D, num_heads=HQ, num_kv_heads=HK,
                                 rotary_emb=types.SimpleNamespace(cos_cache=cos, sin_cache=sin, rotary_dim=D,
                                                                  is_neox_style=True),
                                 q_norm=types.SimpleNamespace(weight=qw, eps=1e-6), k_norm=types.SimpleNamespace(weight=knw))

    def four():
        for qkv, cache in zip(qkvs, caches):
            q, k = qk_norm_rope(attn, pos, qkv)
            v = qkv[:, (HQ + HK) * D:]
            impl.forward(q.view(1, HQ, D), k.view(1, HK, D), v.reshape(1, HK, D), cache, md)

    def one(**opts):
        def run():
            for qkv, cache in zip(qkvs, caches):
                attention_one(qkv, pos, cos, sin, qw, knw, 1e-6, cache, table[0], seq, slot, num_heads=HQ,
                              num_kv_heads=HK, head_size=D, scale=D ** -0.5, neox=True, **opts)
        return run

    res = {"device": torch.cuda.get_device_name(), "ctx": n, "layers": LAYERS,
           "kv_MB_per_layer": 2 * n * HK * D * 2 / 1e6, "warm_up": "each path runs once eagerly before capture"}
    rows = []
    t0 = time.perf_counter()
    g = _graph(four)
    rows.append({"path": "four launches (backend)", "us_per_layer": round(_replay_us(g), 2)})
    print(json.dumps(rows[-1]), flush=True)
    del g
    for v in [{"splits": 16}, {"splits": 16, "dot16": True}, {"splits": 8, "dot16": True}, {"splits": 1},
              {"splits": 1, "dot16": True}, {"splits": 4, "dot16": True}, {"splits": 16, "dot16": True, "early": False},
              {"splits": 16, "dot16": True, "num_warps": 8}, {"splits": 32, "block_n": 32, "dot16": True}]:
        try:
            g = _graph(one(**v))
            rows.append({"path": "one launch", **v, "us_per_layer": round(_replay_us(g), 2)})
            del g
        except Exception as e:  # noqa: BLE001 - recorded, the others run
            rows.append({"path": "one launch", **v, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        print(json.dumps(rows[-1]), flush=True)
    res["rows"], res["bench_s"] = rows, round(time.perf_counter() - t0, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
