"""What prefill attention costs with ``cpu_paged``'s one kernel for every row, against the causal SDPA it replaced.

Why: session 6 made every prefill row run the paged C kernel (``paged_rows``) so that a token's attention does
not depend on chunking or prefix caching (docs/quantization.md "Prefix-cache invariance"). Fresh prompts used to
run ``scaled_dot_product_attention(is_causal=True)`` batched by length (oneDNN / flash kernels). This measures one
attention layer's forward, SmolLM2-135M shapes (9 heads, 3 KV heads, d 64, block 16), on an offline-shaped
prefill step (``--prompts`` x ``--len`` fresh tokens), the variants interleaved in one process:

- ``paged_rows``: the backend's forward now (cache write + the kernel);
- ``causal_sdpa``: the session-5 path (cache write + one batched causal SDPA call over this step's K/V);
- ``torch_sdpa``: the reference backend (masked SDPA per prompt over the gathered context).

Prints one JSON line: median ms per layer forward for each, and ``paged_over_causal``. Multiply by the model's
layers (30) for a step's attention time, to set against the step's whole time (benchmarks/throughput.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from octavo.attention import AttentionLayout
from octavo.plugins.attention.cpu_paged import CpuPagedAttentionBackend
from octavo.plugins.attention.torch_sdpa import TorchSDPABackend

HEADS, KVH, D, BS = 9, 3, 64, 16


def _causal_sdpa(backend, q, k, v, cache, md, n, q_len):
    """Session 5's fresh-prompt path: write the cache, then one causal SDPA over this step's K/V."""
    slots = cache.shape[1] * cache.shape[2]
    cache[0].view(slots, KVH, D).index_copy_(0, md.slot_mapping, k)
    cache[1].view(slots, KVH, D).index_copy_(0, md.slot_mapping, v)
    qh = q.view(n, q_len, HEADS, D).transpose(1, 2)
    kh = k.view(n, q_len, KVH, D).transpose(1, 2).repeat_interleave(HEADS // KVH, dim=1)
    vh = v.view(n, q_len, KVH, D).transpose(1, 2).repeat_interleave(HEADS // KVH, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=backend.scale)
    return out.transpose(1, 2).reshape(n * q_len, HEADS, D)


def _measure(dtype, layout, n: int, q_len: int, nb: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * q_len, h, D, generator=g).to(dtype) for h in (HEADS, KVH, KVH))
    cache = torch.zeros(2, n * nb + 1, BS, KVH, D, dtype=dtype)
    paged = CpuPagedAttentionBackend(num_heads=HEADS, head_size=D, num_kv_heads=KVH, scale=D ** -0.5)
    ref = TorchSDPABackend(num_heads=HEADS, head_size=D, num_kv_heads=KVH, scale=D ** -0.5)
    md_paged = CpuPagedAttentionBackend.build_metadata(layout, torch.device("cpu"))
    md_ref = TorchSDPABackend.build_metadata(layout, torch.device("cpu"))
    variants = {
        "paged_rows": lambda: paged.forward(q, k, v, cache, md_paged),
        "causal_sdpa": lambda: _causal_sdpa(paged, q, k, v, cache, md_paged, n, q_len),
        "torch_sdpa": lambda: ref.forward(q, k, v, cache, md_ref),
    }
    outs = {key: f() for key, f in variants.items()}  # warm-up, and a check that they agree
    err = max((outs[key].float() - outs["torch_sdpa"].float()).abs().max().item() for key in outs)
    times: dict[str, list[float]] = {key: [] for key in variants}
    for _ in range(rounds):
        for key, f in variants.items():
            t = time.perf_counter()
            f()
            times[key].append((time.perf_counter() - t) * 1e3)
    med = {key: round(statistics.median(ts), 3) for key, ts in times.items()}
    return med | {"paged_over_causal": round(med["paged_rows"] / med["causal_sdpa"], 3),
                  "max_abs_diff_vs_torch_sdpa": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, q_len = args.prompts, args.len
    nb = -(-q_len // BS)
    layout = AttentionLayout(
        query_start_loc=torch.arange(n + 1, dtype=torch.int32) * q_len,
        seq_lens=torch.full((n,), q_len, dtype=torch.int32), num_computed_tokens=torch.zeros(n, dtype=torch.int32),
        block_tables=(torch.arange(n * nb, dtype=torch.int32).view(n, nb) + 1),
        slot_mapping=torch.cat([(torch.arange(q_len) // BS + 1 + i * nb) * BS + torch.arange(q_len) % BS
                                for i in range(n)]),
        block_size=BS, max_query_len=q_len, max_seq_len=q_len, num_decode_reqs=0)
    result = {"prompts": n, "len": q_len, "threads": args.threads, "shapes": [HEADS, KVH, D, BS], "ms_per_layer": {}}
    for name in args.dtypes:
        result["ms_per_layer"][name] = _measure(getattr(torch, name), layout, n, q_len, nb, args.rounds)
        print(name, result["ms_per_layer"][name], flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
