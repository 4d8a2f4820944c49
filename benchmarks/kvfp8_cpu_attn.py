"""CPU cost of an fp8 KV cache in the reference backend: one decode ``forward`` of ``torch_sdpa`` (SmolLM2's attention
shape: 9 heads, 3 KV heads, head 64; 8 requests x 512 cached tokens, block 16) with an fp32, bf16 and fp8 (e4m3)
cache, side by side in one process; median of 7 x 30 calls, ms per call. On a CPU the fp8 cache is a capacity
feature (4x the tokens of fp32): every read dequantizes the gathered blocks.

    python benchmarks/kvfp8_cpu_attn.py
"""

import time

import torch

from octavo.plugins.attention.torch_sdpa import TorchSDPABackend
from octavo.testing.attention import make_layout

torch.manual_seed(0)
B, ctx, H, KVH, D, bs = 8, 512, 9, 3, 64, 16
nb = B * (ctx // bs + 1) + 1
tables = [list(range(1 + i * (ctx // bs + 1), 1 + (i + 1) * (ctx // bs + 1))) for i in range(B)]
layout = make_layout(tables, [ctx] * B, [1] * B, bs)
md = TorchSDPABackend.build_metadata(layout, torch.device("cpu"))
res = {}
for dt in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
    impl = TorchSDPABackend(num_heads=H, head_size=D, num_kv_heads=KVH, scale=D ** -0.5)
    cache = torch.randn(2, nb, bs, KVH, D).to(dt)
    q, k, v = torch.randn(B, H, D), torch.randn(B, KVH, D), torch.randn(B, KVH, D)
    for _ in range(5):
        impl.forward(q, k, v, cache, md)
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(30):
            impl.forward(q, k, v, cache, md)
        ts.append((time.perf_counter() - t) / 30)
    res[str(dt)] = sorted(ts)[len(ts) // 2] * 1e3
print({k: round(v, 3) for k, v in res.items()}, "fp8/fp32", round(res["torch.float8_e4m3fn"] / res["torch.float32"], 2))
